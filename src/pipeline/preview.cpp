#include "pipeline/preview.h"

#include <algorithm>
#include <cctype>

namespace kiln::pipeline {
namespace {

constexpr std::pair<PreviewMode, std::string_view> kModes[] = {
    {PreviewMode::None, "none"},
    {PreviewMode::Proj, "proj"},
    {PreviewMode::Tae, "tae"},
    {PreviewMode::Vae, "vae"},
};

}  // namespace

std::string_view preview_mode_name(PreviewMode mode) {
    for (const auto& [m, name] : kModes) {
        if (m == mode) return name;
    }
    return "none";
}

Result<PreviewMode> parse_preview_mode(std::string_view name) {
    for (const auto& [m, known] : kModes) {
        if (name == known) return m;
    }
    return Error::invalid_request("unknown preview mode '" + std::string(name) + "' (valid: none, proj, tae, vae)");
}

Result<image::Image> project_latent_to_rgb(const std::vector<float>& latent, int64_t w, int64_t h,
                                           const models::LatentFormat& format) {
    const size_t channels = format.rgb_factors.size();
    if (channels == 0) return Error::invalid_request("this latent format has no latent-to-RGB projection");
    const size_t plane = static_cast<size_t>(w) * static_cast<size_t>(h);
    if (w <= 0 || h <= 0 || latent.size() != plane * channels) {
        return Error{"latent of " + std::to_string(latent.size()) + " values is not " + std::to_string(channels) +
                     " channels of " + std::to_string(w) + "x" + std::to_string(h)};
    }
    image::Image img = image::make_image(static_cast<int>(w), static_cast<int>(h), 3);
    for (size_t i = 0; i < plane; ++i) {
        for (size_t rgb = 0; rgb < 3; ++rgb) {
            float v = format.rgb_bias[rgb];
            for (size_t c = 0; c < channels; ++c) v += latent[c * plane + i] * format.rgb_factors[c][rgb];
            const float unit = std::clamp(v * 0.5f + 0.5f, 0.0f, 1.0f);
            img.pixels[i * 3 + rgb] = static_cast<uint8_t>(unit * 255.0f);
        }
    }
    return img;
}

}  // namespace kiln::pipeline
