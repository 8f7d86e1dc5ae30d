#include "pipeline/image_to_video.h"

#include <algorithm>
#include <array>
#include <functional>

#include "image/plane_resize.h"
#include "pipeline/generate.h"
#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "pipeline/pixel_planes.h"
#include "pipeline/request.h"
#include "runtime/graph_session.h"

namespace kiln::pipeline {

bool takes_first_frame(const Model& model) {
    return model.diffusion().capabilities().concat == models::LatentConcat::FirstFrameCondition;
}

Result<std::vector<float>> encode_clip(Model& model, const ValidatedRequest& p, int64_t latent_frames,
                                       const std::function<const float*(int64_t)>& chunk_pixels) {
    const int64_t channels = model.latent_channels(), step = model.vae().format().temporal_downscale;
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    // Each chunk with the history the one before left: the encode's memory
    // is one chunk's whatever the clip's length. Each frame's latent is ne
    // [w, h, C] as the VAE gives it.
    std::vector<float> frames;
    std::vector<std::vector<float>> history;
    std::vector<std::array<int64_t, 4>> history_shapes;
    for (int64_t t = 0; t < latent_frames; ++t) {
        if (model.cancel_requested()) return Error::cancelled("cancelled");
        auto g = build_clip_encode_chunk_graph(model, p.width, p.height, t == 0 ? 1 : step, history_shapes);
        if (!g.ok()) return g.error();
        g->session->set_input(g->input, chunk_pixels(t));
        for (size_t i = 0; i < history.size(); ++i) {
            g->session->set_input(g->history[i], history[i].data());
            std::vector<float>().swap(history[i]);
        }
        KILN_TRY(g->session->run(model.vae_compute(), g->out));
        const std::vector<float> values = runtime::GraphSession::read(g->out);
        if (values.size() != plane * static_cast<size_t>(channels)) {
            return Error{"the VAE's encode of a clip has the wrong size"};
        }
        frames.insert(frames.end(), values.begin(), values.end());
        history.clear();
        history_shapes.clear();
        for (const ggml_tensor* h : g->chunk.history) {
            history.push_back(runtime::GraphSession::read(h));
            history_shapes.push_back({h->ne[0], h->ne[1], h->ne[2], h->ne[3]});
        }
    }
    // Frame after frame -> channel after channel, scaled as the sampler's latent.
    std::vector<float> latent(frames.size());
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t t = 0; t < latent_frames; ++t) {
            const auto from = frames.begin() + static_cast<std::ptrdiff_t>((t * channels + c) * plane);
            auto to = latent.begin() + static_cast<std::ptrdiff_t>((c * latent_frames + t) * plane);
            std::transform(from, from + static_cast<std::ptrdiff_t>(plane), to,
                           [&](float v) { return (v - model.latent_shift()) * model.latent_scale(); });
        }
    }
    return latent;
}

Result<std::vector<float>> first_frame_condition(Model& model, const image::Image& image, const image::Image* last,
                                                 const ValidatedRequest& p) {
    auto first = rgb_planes(image, p.width, p.height, PixelRange::Signed);
    if (!first.ok()) return first.error().in_context("-i (the first frame): ");
    std::vector<float> last_planes;
    if (last) {
        auto planes = rgb_planes(*last, p.width, p.height, PixelRange::Signed);
        if (!planes.ok()) return planes.error().in_context("--end-img (the last frame): ");
        last_planes = std::move(planes).value();
    }
    const int64_t frames = p.latent_frames, masks = model.vae().format().temporal_downscale;
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    // The clip [image, zeros (mid grey in [-1, 1]), ..., last image when
    // given] as Wan pads it.
    const std::vector<float> zeros(first->size() * static_cast<size_t>(masks), 0.0f);
    std::vector<float> last_chunk;
    if (last) {  // the last chunk's frames: zeros, then the last image
        last_chunk = zeros;
        std::copy(last_planes.begin(), last_planes.end(),
                  last_chunk.end() - static_cast<std::ptrdiff_t>(first->size()));
    }
    auto latent = encode_clip(model, p, frames, [&](int64_t t) {
        const bool last_frames = last && t > 0 && t + 1 == frames;
        return t == 0 ? first->data() : last_frames ? last_chunk.data() : zeros.data();
    });
    if (!latent.ok()) return latent.error();
    std::vector<float> condition(plane * static_cast<size_t>(masks * frames), 0.0f);
    for (int64_t m = 0; m < masks; ++m) {
        std::fill_n(condition.begin() + static_cast<std::ptrdiff_t>(m * frames * plane), plane, 1.0f);
    }
    if (last) {  // the last latent frame's last pixel frame is the given one
        std::fill_n(condition.begin() + static_cast<std::ptrdiff_t>(((masks - 1) * frames + frames - 1) * plane), plane,
                    1.0f);
    }
    condition.insert(condition.end(), latent->begin(), latent->end());
    return condition;
}

bool takes_first_latent(const Model& model) {
    const models::DiffusionCapabilities& can = model.diffusion().capabilities();
    const models::AutoencoderFormat& vae = model.vae().format();
    // Wan 2.2's latent: TI2V-5B is the one DiT on it, and the one whose
    // pipeline gives its image this way.
    constexpr int64_t kWan22LatentChannels = 48;
    return can.video && can.clean_first_frame && vae.temporal_downscale > 0 && can.in_channels == can.out_channels &&
           vae.latent_channels == kWan22LatentChannels;
}

Result<std::vector<float>> first_frame_latent(Model& model, const image::Image& image, const ValidatedRequest& p) {
    auto planes = rgb_planes(image, p.width, p.height, PixelRange::Signed);
    if (!planes.ok()) return planes.error().in_context("-i (the first frame): ");
    auto g = build_clip_encode_chunk_graph(model, p.width, p.height, 1, {});
    if (!g.ok()) return g.error();
    g->session->set_input(g->input, planes->data());
    KILN_TRY(g->session->run(model.vae_compute(), g->out));
    std::vector<float> latent = runtime::GraphSession::read(g->out);
    if (latent.size() != static_cast<size_t>(p.latent_w * p.latent_h * model.latent_channels()))
        return Error{"the VAE's encode of the first frame has the wrong size"};
    for (float& v : latent) v = (v - model.latent_shift()) * model.latent_scale();
    return latent;
}

Status keep_first_latent(Model& model, const image::Image& image, const ValidatedRequest& p, SamplingRun& run) {
    auto encoded = first_frame_latent(model, image, p);
    if (!encoded.ok()) return encoded.error();
    // Wan's masks_like(zero=True): the first latent frame is the image's, at
    // the start and after every step (each channel's planes are frame after
    // frame, the first frame's first).
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h), frames = static_cast<size_t>(p.latent_frames);
    const size_t channels = static_cast<size_t>(model.latent_channels());
    run.keep_weight.assign(plane * frames * channels, 0.0f);
    run.keep_latent.assign(plane * frames * channels, 0.0f);
    for (size_t c = 0; c < channels; ++c) {
        const auto at = static_cast<std::ptrdiff_t>(c * frames * plane);
        std::fill_n(run.keep_weight.begin() + at, plane, 1.0f);
        std::copy_n(encoded->begin() + static_cast<std::ptrdiff_t>(c * plane), plane, run.keep_latent.begin() + at);
    }
    run.clean_first_frame = true;
    return Status::Ok();
}

bool takes_image_context(const Model& model) { return model.diffusion().capabilities().image_context_width > 0; }

int64_t image_context_rows(const Model& model) {
    if (!takes_image_context(model)) return 0;
    // Without the tower (a plan of the DiT alone), CLIP-vision-H's: the class
    // token and 16 x 16 patches of 14 pixels.
    constexpr int64_t kClipVisionHRows = 257;
    int64_t rows = kClipVisionHRows;
    if (model.has_vision()) {
        const int64_t side = model.vision().input_side();
        rows = model.vision().tokens(side, side);
    }
    return model.diffusion().capabilities().image_context_images * rows;
}

Result<std::vector<float>> image_context(Model& model, const image::Image& first, const image::Image* last) {
    const models::VisionEncoderNetwork& tower = model.vision();
    const int64_t side = tower.input_side();
    if (side <= 0) return Error{"the vision tower takes no fixed square: it cannot read an image-to-video frame"};
    std::vector<const image::Image*> images = {&first};
    if (model.diffusion().capabilities().image_context_images == 2) {
        if (!last) return Error::invalid_request("this DiT reads the first and the last frame: pass --end-img");
        images.push_back(last);
    }
    std::vector<float> rows;
    for (const image::Image* image : images) {
        const char* what = image == &first ? "-i (the first frame): " : "--end-img (the last frame): ";
        auto planes = rgb_planes(*image, image->width, image->height, PixelRange::Unit);
        if (!planes.ok()) return planes.error().in_context(what);
        // Bicubic is linear with weights that sum to 1, so resizing [0, 1]
        // values is Wan's resize of [-1, 1] ones followed by its mul(0.5).add(0.5).
        const std::vector<float> pixels = image::resize_planes_bicubic(*planes, 3, image->width, image->height,
                                                                       static_cast<int>(side), static_cast<int>(side));
        auto g = build_vision_graph(model, pixels.data(), side, side);
        if (!g.ok()) return g.error();
        KILN_TRY(g->session->run(model.vision_compute(), g->out));
        const std::vector<float> values = runtime::GraphSession::read(g->out);
        rows.insert(rows.end(), values.begin(), values.end());
    }
    return rows;
}

}  // namespace kiln::pipeline
