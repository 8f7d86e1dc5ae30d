#include "pipeline/prompt_images.h"

#include <algorithm>
#include <cmath>

#include "pipeline/conditioner.h"
#include "pipeline/graphs.h"

namespace kiln::pipeline {
namespace {

// Qwen2.5-VL's preprocessor_config.json.
constexpr int64_t kMinPixels = 56 * 56;
constexpr int64_t kMaxPixels = 12845056;
// diffusers' calculate_dimensions rounds to multiples of 32.
constexpr int kAreaMultiple = 32;

// Python's round(): to nearest, ties to even (the default rounding mode).
double round_even(double x) { return std::nearbyint(x); }

}  // namespace

Result<PixelSize> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
    if (height <= 0 || width <= 0 || std::max(height, width) > 200 * std::min(height, width)) {
        return Error::invalid_request("an image of " + std::to_string(width) + "x" + std::to_string(height) +
                                      " has sides more than 200 times apart; the vision tower takes none such");
    }
    const double h = height, w = width, f = factor;
    double h_bar = round_even(h / f) * f, w_bar = round_even(w / f) * f;
    if (h_bar * w_bar > static_cast<double>(max_pixels)) {
        const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
        h_bar = std::max(f, std::floor(h / beta / f) * f);
        w_bar = std::max(f, std::floor(w / beta / f) * f);
    } else if (h_bar * w_bar < static_cast<double>(min_pixels)) {
        const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
        h_bar = std::ceil(h * beta / f) * f;
        w_bar = std::ceil(w * beta / f) * f;
    }
    return PixelSize{static_cast<int>(w_bar), static_cast<int>(h_bar)};
}

Result<VisionSizes> vision_sizes(int width, int height, int area, int unit) {
    const double ratio = static_cast<double>(width) / height;
    const double w = std::sqrt(static_cast<double>(area) * ratio), h = w / ratio;
    VisionSizes s;
    s.area.width = static_cast<int>(round_even(w / kAreaMultiple)) * kAreaMultiple;
    s.area.height = static_cast<int>(round_even(h / kAreaMultiple)) * kAreaMultiple;
    if (s.area.width <= 0 || s.area.height <= 0) {
        return Error::invalid_request("an image of " + std::to_string(width) + "x" + std::to_string(height) +
                                      " is too narrow for the vision tower");
    }
    auto tower = smart_resize(s.area.height, s.area.width, unit, kMinPixels, kMaxPixels);
    if (!tower.ok()) return tower.error();
    s.tower = *tower;
    return s;
}

Result<PromptImage> encode_prompt_image(Model& model, const image::Image& image, int area) {
    const models::VisionEncoderNetwork& tower = model.vision();
    auto sizes = vision_sizes(image.width, image.height, area, static_cast<int>(tower.size_unit()));
    if (!sizes.ok()) return sizes.error();
    auto rgb = image::convert_channels(image, 3);
    if (rgb.ok()) rgb = image::resize_image(*rgb, sizes->area.width, sizes->area.height, image::ResizeFilter::Lanczos3);
    if (rgb.ok())
        rgb = image::resize_image(*rgb, sizes->tower.width, sizes->tower.height, image::ResizeFilter::Bicubic);
    if (!rgb.ok()) return rgb.error();
    const int64_t w = rgb->width, h = rgb->height, plane = w * h;
    std::vector<float> pixels(static_cast<size_t>(3 * plane));
    for (int64_t i = 0; i < plane; ++i) {
        for (int64_t c = 0; c < 3; ++c) {
            pixels[static_cast<size_t>(c * plane + i)] = rgb->pixels[static_cast<size_t>(i * 3 + c)] / 255.0f;
        }
    }
    auto g = build_vision_graph(model, pixels.data(), w, h);
    if (!g.ok()) return g.error();
    KILN_TRY(g->session->run(model.vision_compute(), g->out));
    PromptImage out;
    out.rows = runtime::GraphSession::read(g->out);
    out.grid_rows = h / tower.size_unit();
    out.grid_cols = w / tower.size_unit();
    return out;
}

LlmImagePrompt llm_image_prompt(const text::LlmTokenizer& tokenizer, const models::TextEncoderUse& use,
                                const std::string& prompt, const std::vector<PromptImage>& images) {
    // The images' text joins the template's prefix: llm_prompt tokenizes it
    // at weight 1, the prompt's fragments with their weights.
    models::TextEncoderUse with_images = use;
    with_images.chat_prefix = use.images_prefix;
    const size_t pad = use.image_prompt.find(use.image_pad);
    for (size_t i = 0; i < images.size(); ++i) {
        std::string before = use.image_prompt.substr(0, pad);
        if (const size_t number = before.find("{}"); number != std::string::npos)
            before.replace(number, 2, std::to_string(i + 1));
        with_images.chat_prefix += before;
        for (int64_t t = 0; t < images[i].grid_rows * images[i].grid_cols; ++t)
            with_images.chat_prefix += use.image_pad;
        with_images.chat_prefix += use.image_prompt.substr(pad + use.image_pad.size());
    }
    const LlmPrompt p = llm_prompt(tokenizer, with_images, prompt);
    LlmImagePrompt out;
    out.ids = p.ids;
    out.weights = p.weights;
    out.dropped = static_cast<int64_t>(tokenizer.encode(use.images_prefix).size());
    // Each image is the next run of pad tokens in the prefix (not in the
    // prompt, where a user's "<|image_pad|>" is only text).
    const int32_t pad_id = tokenizer.token_id(use.image_pad);  // checked by request validation
    int64_t at = out.dropped;
    for (const PromptImage& image : images) {
        while (out.ids[static_cast<size_t>(at)] != pad_id) ++at;
        out.grids.push_back({at, image.grid_rows, image.grid_cols});
        at += image.grid_rows * image.grid_cols;
        out.rows.insert(out.rows.end(), image.rows.begin(), image.rows.end());
    }
    return out;
}

}  // namespace kiln::pipeline
