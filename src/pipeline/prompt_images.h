// Reference images in an edit model's prompt (Qwen-Image-Edit, as diffusers'
// QwenImageEditPlusPipeline makes it): each -r image is resized for the
// LLM's vision tower, encoded by it, and its rows stand in the prompt for
// the image's pad tokens ("Picture 1: <|vision_start|><|image_pad|>...
// <|vision_end|>"), turned by multimodal RoPE over the image's grid.
#pragma once

#include <string>
#include <vector>

#include "image/image.h"
#include "models/family.h"
#include "models/network.h"
#include "pipeline/model.h"
#include "util/result.h"

namespace kiln::pipeline {

// HF's Qwen2-VL smart_resize: the sides rounded to multiples of `factor`
// (ties to even, as Python's round), then scaled down or up, aspect kept,
// when their product is above max_pixels or below min_pixels. {height,
// width}. Error: sides more than 200 times apart (HF refuses them too).
struct PixelSize {
    int width = 0;
    int height = 0;
};
Result<PixelSize> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// The two sizes an image of width x height passes through on its way to the
// vision tower: diffusers' calculate_dimensions(area, width / height)
// (multiples of 32; the pipeline resizes to it with Lanczos), then the
// Qwen2.5-VL processor's smart_resize of that to multiples of `unit` within
// [56 x 56, 12845056] pixels (a bicubic resize).
struct VisionSizes {
    PixelSize area;
    PixelSize tower;
};
Result<VisionSizes> vision_sizes(int width, int height, int area, int unit);

// One image's rows for the prompt: ne [width, rows x cols] as floats, the
// merged grid row-major.
struct PromptImage {
    std::vector<float> rows;
    int64_t grid_rows = 0;
    int64_t grid_cols = 0;
};

// Resizes `image` as above (RGB; other channel counts converted) and runs
// the model's vision tower on it. Errors name the image's size.
Result<PromptImage> encode_prompt_image(Model& model, const image::Image& image, int area);

// The LLM's input with images: use.images_prefix, each image's
// use.image_prompt ("{}" its number from 1) with its pad token repeated once
// per row, then the prompt's weighted fragments and use.chat_suffix; the
// images' token grids, and the images' rows in order. `dropped`: the
// images_prefix's tokens.
struct LlmImagePrompt {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    int64_t dropped = 0;
    std::vector<models::TokenGrid> grids;
    std::vector<float> rows;
};
LlmImagePrompt llm_image_prompt(const text::LlmTokenizer& tokenizer, const models::TextEncoderUse& use,
                                const std::string& prompt, const std::vector<PromptImage>& images);

}  // namespace kiln::pipeline
