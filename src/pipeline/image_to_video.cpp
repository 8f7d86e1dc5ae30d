#include "pipeline/image_to_video.h"

#include <algorithm>

#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "pipeline/pixel_planes.h"
#include "pipeline/request.h"
#include "runtime/graph_session.h"

namespace kiln::pipeline {

bool takes_first_frame(const Model& model) {
    const models::DiffusionCapabilities& can = model.diffusion().capabilities();
    const models::AutoencoderFormat& vae = model.vae().format();
    return can.video && vae.temporal_downscale > 0 &&
           can.in_channels == can.out_channels + vae.temporal_downscale + vae.latent_channels;
}

Result<std::vector<float>> first_frame_condition(Model& model, const image::Image& image, const ValidatedRequest& p) {
    auto first = rgb_planes(image, p.width, p.height, PixelRange::Signed);
    if (!first.ok()) return first.error().in_context("-i (the first frame): ");
    // ne [W, H, 3, frames]: the image, then zeros (mid grey in [-1, 1]), as Wan pads the clip.
    std::vector<float> clip(first->size() * static_cast<size_t>(p.frames), 0.0f);
    std::copy(first->begin(), first->end(), clip.begin());
    auto g = build_clip_encode_graph(model, p.width, p.height, p.frames, clip.data());
    if (!g.ok()) return g.error();
    KILN_TRY(g->session->run(model.vae_compute(), g->out));
    const std::vector<float> latent = runtime::GraphSession::read(g->out);  // ne [w, h, C, T]
    const int64_t channels = model.latent_channels(), frames = p.latent_frames;
    const int64_t masks = model.vae().format().temporal_downscale;
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    if (latent.size() != plane * static_cast<size_t>(channels * frames)) {
        return Error{"the VAE's encode of the first frame's clip has the wrong size"};
    }
    std::vector<float> condition(plane * static_cast<size_t>((masks + channels) * frames), 0.0f);
    for (int64_t m = 0; m < masks; ++m) {
        std::fill_n(condition.begin() + static_cast<std::ptrdiff_t>(m * frames * plane), plane, 1.0f);
    }
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t t = 0; t < frames; ++t) {
            const auto from = latent.begin() + static_cast<std::ptrdiff_t>((t * channels + c) * plane);
            auto to = condition.begin() + static_cast<std::ptrdiff_t>(((masks + c) * frames + t) * plane);
            std::transform(from, from + static_cast<std::ptrdiff_t>(plane), to,
                           [&](float v) { return (v - model.latent_shift()) * model.latent_scale(); });
        }
    }
    return condition;
}

}  // namespace kiln::pipeline
