#include "sd_cli_flags.h"

namespace kiln::cli {
namespace {

struct Missing {
    const char* flag;
    const char* why;
};

constexpr const char* kVideo = "is for sd-cli's video families (Wan, SVD); kiln makes images only";
constexpr const char* kPhotoMaker = "is for sd-cli's PhotoMaker; kiln has no PhotoMaker";
constexpr const char* kQwenImage = "is for sd-cli's Qwen-Image family, which kiln does not have yet";
constexpr const char* kCachePreset =
    "is a preset of sd-cli's step caches; kiln takes --cache-mode and --cache-option (docs/caching.md)";

const Missing kMissing[] = {
    {"--clip_vision", kVideo},
    {"--high-noise-diffusion-model", kVideo},
    {"--end-img", kVideo},
    {"--control-video", kVideo},
    {"--video-frames", kVideo},
    {"--fps", kVideo},
    {"--high-noise-steps", kVideo},
    {"--high-noise-cfg-scale", kVideo},
    {"--high-noise-img-cfg-scale", kVideo},
    {"--high-noise-guidance", kVideo},
    {"--high-noise-slg-scale", kVideo},
    {"--high-noise-skip-layer-start", kVideo},
    {"--high-noise-skip-layer-end", kVideo},
    {"--high-noise-eta", kVideo},
    {"--high-noise-sampling-method", kVideo},
    {"--high-noise-skip-layers", kVideo},
    {"--moe-boundary", kVideo},
    {"--vace-strength", kVideo},
    {"--photo-maker", kPhotoMaker},
    {"--pm-id-images-dir", kPhotoMaker},
    {"--pm-id-embed-path", kPhotoMaker},
    {"--pm-style-strength", kPhotoMaker},
    {"--llm_vision", kQwenImage},
    {"--qwen2vl_vision", kQwenImage},
    {"--qwen-image-zero-cond-t", kQwenImage},
    {"--cache-preset", kCachePreset},
    {"--img-cfg-scale",
     "is sd-cli's image guidance of instruct-pix2pix models, which kiln does not load (inpainting models "
     "take --cfg-scale alone, sd-cli's default)"},
    {"--tensor-type-rules",
     "is sd-cli's weight types per tensor pattern; kiln's --type sets one type for every matrix"},
    {"--circular", "is sd-cli's circular (seamless) padding, which kiln does not have"},
    {"--circularx", "is sd-cli's circular (seamless) padding, which kiln does not have"},
    {"--circulary", "is sd-cli's circular (seamless) padding, which kiln does not have"},
};

}  // namespace

std::optional<std::string> sd_cli_feature_missing(const std::string& flag) {
    for (const Missing& m : kMissing) {
        if (flag == m.flag) return std::string(m.flag) + " " + m.why;
    }
    return std::nullopt;
}

}  // namespace kiln::cli
