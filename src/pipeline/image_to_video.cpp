#include "pipeline/image_to_video.h"

#include <algorithm>
#include <array>

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
    const int64_t channels = model.latent_channels(), frames = p.latent_frames;
    const int64_t masks = model.vae().format().temporal_downscale;
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    // The clip [image, zeros (mid grey in [-1, 1]), ...] as Wan pads it, a
    // chunk at a time (the image, then `masks` frames of zeros each), each
    // with the history the one before left: the encode's memory is one
    // chunk's whatever the clip's length. `latent` is ne [w, h, C] per frame.
    std::vector<float> latent;
    std::vector<std::vector<float>> history;
    std::vector<std::array<int64_t, 4>> history_shapes;
    const std::vector<float> zeros(first->size() * static_cast<size_t>(masks), 0.0f);
    for (int64_t t = 0; t < frames; ++t) {
        if (model.cancel_requested()) return Error::cancelled("cancelled");
        auto g = build_clip_encode_chunk_graph(model, p.width, p.height, t == 0 ? 1 : masks, history_shapes);
        if (!g.ok()) return g.error();
        g->session->set_input(g->input, t == 0 ? first->data() : zeros.data());
        for (size_t i = 0; i < history.size(); ++i) {
            g->session->set_input(g->history[i], history[i].data());
            std::vector<float>().swap(history[i]);
        }
        KILN_TRY(g->session->run(model.vae_compute(), g->out));
        const std::vector<float> values = runtime::GraphSession::read(g->out);
        if (values.size() != plane * static_cast<size_t>(channels)) {
            return Error{"the VAE's encode of the first frame's clip has the wrong size"};
        }
        latent.insert(latent.end(), values.begin(), values.end());
        history.clear();
        history_shapes.clear();
        for (const ggml_tensor* h : g->chunk.history) {
            history.push_back(runtime::GraphSession::read(h));
            history_shapes.push_back({h->ne[0], h->ne[1], h->ne[2], h->ne[3]});
        }
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
