#include "pipeline/vace_context.h"

#include <algorithm>

#include "pipeline/image_to_video.h"
#include "pipeline/model.h"
#include "pipeline/pixel_planes.h"
#include "pipeline/request.h"

namespace kiln::pipeline {

namespace {

// Sizes whose grey clip the model keeps (a few MB each at 832x480x81).
constexpr size_t kKeptEncodedConstants = 4;

}  // namespace

bool takes_vace_context(const Model& model) { return model.diffusion().capabilities().vace_channels > 0; }

Result<std::vector<float>> vace_context(Model& model, const std::vector<image::Image>& control_frames,
                                        const image::Image* reference, const ValidatedRequest& p) {
    const int64_t channels = model.latent_channels(), planes = model.diffusion().capabilities().vace_channels;
    const int64_t mask_planes = planes - 2 * channels;
    if (mask_planes <= 0) {
        return Error::bad_file("the DiT's VACE context has " + std::to_string(planes) + " planes per frame, but the " +
                               std::to_string(channels) + "-channel VAE's two latents leave no room for the mask");
    }
    const int64_t refs = reference ? kVaceReferenceFrames : 0;
    const int64_t clip_latent_frames = p.latent_frames - refs, step = model.vae().format().temporal_downscale;
    const size_t frame_values = static_cast<size_t>(p.width) * p.height * 3;

    // The control clip's frames in [-1, 1], those given (at the job's size).
    std::vector<std::vector<float>> control;
    for (size_t i = 0; i < control_frames.size() && static_cast<int>(i) < p.frames; ++i) {
        auto frame = rgb_planes(control_frames[i], p.width, p.height, PixelRange::Signed);
        if (!frame.ok()) return frame.error().in_context("--control-video frame " + std::to_string(i + 1) + ": ");
        control.push_back(std::move(frame).value());
    }
    // Latent frame t's pixel frames: the first alone, then `step` each; grey past the given ones.
    std::vector<float> chunk;
    auto control_chunk = [&](int64_t t) -> const float* {
        const int64_t first = t == 0 ? 0 : 1 + (t - 1) * step, count = t == 0 ? 1 : step;
        chunk.assign(frame_values * static_cast<size_t>(count), 0.0f);
        for (int64_t f = first; f < first + count && f < static_cast<int64_t>(control.size()); ++f) {
            std::copy(control[static_cast<size_t>(f)].begin(), control[static_cast<size_t>(f)].end(),
                      chunk.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(f - first) * frame_values));
        }
        return chunk.data();
    };
    // The inactive clip is grey whatever the job gives, so its latent is the
    // same for every job of this size and seams (the encoder pads across
    // them): encoded once, kept by the model.
    const std::string grey_key = "VACE grey clip " + std::to_string(p.width) + "x" + std::to_string(p.height) + "x" +
                                 std::to_string(clip_latent_frames) + (model.seams().x ? " wrapped x" : "") +
                                 (model.seams().y ? " wrapped y" : "");
    auto& constants = model.encoded_constants();
    auto kept = constants.find(grey_key);
    if (kept == constants.end()) {
        const std::vector<float> grey(frame_values * static_cast<size_t>(step), 0.0f);
        auto encoded = encode_clip(model, p, clip_latent_frames, [&](int64_t) { return grey.data(); });
        if (!encoded.ok()) return encoded.error();
        if (constants.size() >= kKeptEncodedConstants) constants.clear();
        kept = constants.emplace(grey_key, std::move(encoded).value()).first;
    }
    const std::vector<float>* inactive = &kept->second;
    auto reactive = encode_clip(model, p, clip_latent_frames, control_chunk);
    if (!reactive.ok()) return reactive.error();
    std::vector<float> reference_latent;
    if (reference) {
        auto pixels = rgb_planes(*reference, p.width, p.height, PixelRange::Signed);
        if (!pixels.ok()) return pixels.error().in_context("-i (VACE's reference image): ");
        auto encoded = encode_clip(model, p, 1, [&](int64_t) { return pixels->data(); });
        if (!encoded.ok()) return encoded.error();
        reference_latent = std::move(encoded).value();
    }

    // [inactive, reactive, mask] along the channels, the reference frame first.
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h);
    const int64_t frames = p.latent_frames;
    std::vector<float> context(plane * static_cast<size_t>(planes * frames), 0.0f);
    auto at = [&](int64_t c, int64_t t) {
        return context.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(c * frames + t) * plane);
    };
    for (int64_t c = 0; c < channels; ++c) {
        for (int64_t t = 0; t < clip_latent_frames; ++t) {
            const auto from = static_cast<std::ptrdiff_t>(static_cast<size_t>(c * clip_latent_frames + t) * plane);
            std::copy_n(inactive->begin() + from, plane, at(c, refs + t));
            std::copy_n(reactive->begin() + from, plane, at(channels + c, refs + t));
        }
        if (reference) std::copy_n(reference_latent.begin() + static_cast<std::ptrdiff_t>(c * plane), plane, at(c, 0));
    }
    for (int64_t m = 0; m < mask_planes; ++m) {
        std::fill_n(at(2 * channels + m, refs), plane * static_cast<size_t>(clip_latent_frames), 1.0f);
    }
    return context;
}

std::vector<float> without_reference_frames(const std::vector<float>& latent, const ValidatedRequest& p) {
    if (!p.vace_reference) return latent;
    const size_t plane = static_cast<size_t>(p.latent_w * p.latent_h), frames = static_cast<size_t>(p.latent_frames);
    const size_t kept = frames - static_cast<size_t>(kVaceReferenceFrames), channels = latent.size() / (plane * frames);
    std::vector<float> clip(plane * kept * channels);
    for (size_t c = 0; c < channels; ++c) {
        std::copy_n(latent.begin() + static_cast<std::ptrdiff_t>((c * frames + (frames - kept)) * plane), plane * kept,
                    clip.begin() + static_cast<std::ptrdiff_t>(c * kept * plane));
    }
    return clip;
}

}  // namespace kiln::pipeline
