#include "sd_cli_options.h"

namespace kiln::cli {
namespace {

constexpr SdCliStance kIgnored = SdCliStance::Ignored;
constexpr SdCliStance kRefused = SdCliStance::Refused;

constexpr const char* kConvPath = "kiln picks each convolution's path itself";
constexpr const char* kVideo =
    "is for sd-cli's video features kiln does not have yet (other video families); kiln's Wan makes "
    "text-, image- and first-last-frame-to-video and VACE, Wan 2.2 A14B's experts and TI2V-5B included";
constexpr const char* kNoExpertGuidance =
    "is image or distilled guidance, which Wan 2.2's experts do not take (sd-cli's does nothing with it either); "
    "--high-noise-cfg-scale is their guidance";
constexpr const char* kNoExpertSlg =
    "is skip-layer guidance, which kiln's Wan DiT does not take (it refuses --slg-scale too)";
constexpr const char* kPhotoMaker = "is for sd-cli's PhotoMaker; kiln has no PhotoMaker";
constexpr const char* kQwenImage =
    "is for sd-cli's Qwen-Image-Layered models, which kiln does not run yet; Qwen-Image and its Edit models run "
    "without it";
constexpr const char* kDetailer =
    "is for sd-cli's detailer pass (detect, then inpaint each detection), which kiln does not have";
constexpr const char* kIpAdapter = "is for sd-cli's IP-Adapter image prompts, which kiln does not have";
constexpr const char* kPulid = "is for sd-cli's PuLID identity embeddings, which kiln does not have";
constexpr const char* kImatrix =
    "is sd-cli's importance matrix for quantizing; kiln's -M convert --type quantizes without one";

}  // namespace

const std::vector<SdCliOption>& sd_cli_options_without_kiln_flag() {
    static const std::vector<SdCliOption> table = {
        // Choices kiln makes itself: accepted, so that an sd-cli command line
        // runs unchanged, and nothing more.
        {"--mmap", false, kIgnored, "kiln always maps model files"},
        {"--vae-conv-direct", false, kIgnored, kConvPath},
        {"--diffusion-conv-direct", false, kIgnored, kConvPath},
        {"--force-sdxl-vae-conv-scale", false, kIgnored,
         "kiln does not rescale the VAE's convolutions; on the CPU it computes the VAE in F32 (docs/sdxl.md)"},
        {"--stream-layers", false, kIgnored,
         "kiln always streams a cut module's next segment while the current one computes (--disable-prefetch "
         "turns it off)"},
        {"--convert-name", false, kIgnored,
         "-M convert keeps the release's tensor names, which kiln and sd-cli both read"},

        {"--high-noise-img-cfg-scale", true, kIgnored, kNoExpertGuidance},
        {"--high-noise-guidance", true, kIgnored, kNoExpertGuidance},
        {"--high-noise-slg-scale", true, kRefused, kNoExpertSlg},
        {"--high-noise-skip-layer-start", true, kRefused, kNoExpertSlg},
        {"--high-noise-skip-layer-end", true, kRefused, kNoExpertSlg},
        {"--high-noise-skip-layers", true, kRefused, kNoExpertSlg},
        {"--motion-module", true, kRefused, kVideo},
        {"--audio-vae", true, kRefused, kVideo},
        {"--embeddings-connectors", true, kRefused, kVideo},
        {"--ref-audio", true, kRefused, kVideo},
        {"--ref-video", true, kRefused, kVideo},
        {"--ref-video-audio", true, kRefused, kVideo},
        {"--temporal-tiling", false, kRefused, kVideo},
        {"--extra-tiling-args", true, kRefused, kVideo},
        {"--photo-maker", true, kRefused, kPhotoMaker},
        {"--pm-id-images-dir", true, kRefused, kPhotoMaker},
        {"--pm-id-embed-path", true, kRefused, kPhotoMaker},
        {"--pm-style-strength", true, kRefused, kPhotoMaker},
        {"--qwen-image-layers", true, kRefused, kQwenImage},
        {"--ad-model", true, kRefused, kDetailer},
        {"--ad-prompt", true, kRefused, kDetailer},
        {"--ad-negative-prompt", true, kRefused, kDetailer},
        {"--extra-ad-args", true, kRefused, kDetailer},
        {"--ip-adapter", true, kRefused, kIpAdapter},
        {"--ip-adapter-image", true, kRefused, kIpAdapter},
        {"--ip-adapter-strength", true, kRefused, kIpAdapter},
        {"--pulid-weights", true, kRefused, kPulid},
        {"--pulid-id-embedding", true, kRefused, kPulid},
        {"--pulid-id-weight", true, kRefused, kPulid},
        {"--imat-in", true, kRefused, kImatrix},
        {"--imat-out", true, kRefused, kImatrix},
        {"--cache-preset", true, kRefused,
         "is a preset of sd-cli's step caches; kiln takes --cache-mode and --cache-option (docs/caching.md)"},
        {"--img-cfg-scale", true, kRefused,
         "is sd-cli's image guidance of instruct-pix2pix models, which kiln does not load (inpainting models "
         "take --cfg-scale alone, sd-cli's default)"},
        {"--uncond-diffusion-model", true, kRefused,
         "is for sd-cli's Ideogram 4, whose unconditional pass has a model of its own; kiln does not have that "
         "family"},
        {"--extra-sample-args", true, kRefused,
         "is for sd-cli's sampler extras (APG, SLG's uncond, LCM noise, euler_ge's gamma), which kiln does not "
         "have"},
        {"--ref-image-args", true, kRefused,
         "is sd-cli's per-reference settings; kiln's references take --increase-ref-index and "
         "--disable-auto-resize-ref-image"},
    };
    return table;
}

const SdCliOption* find_sd_cli_option(const std::string& name) {
    for (const SdCliOption& o : sd_cli_options_without_kiln_flag()) {
        if (name == o.name) return &o;
    }
    return nullptr;
}

}  // namespace kiln::cli
