// The in-memory image kiln reads, writes and hands to the pipeline: 8-bit
// samples, row-major, channels interleaved (grey, RGB or RGBA), no padding
// between rows. Plus the two pixel operations every front-end needs before a
// file becomes a model input: channel conversion and resizing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::image {

// Largest width or height kiln accepts, read or written: an RGBA image at the
// limit is 1 GiB, and a corrupt header must not make a decoder allocate more.
constexpr int kMaxDimension = 16384;

// channels: 1 = grey, 3 = RGB, 4 = RGBA (straight, not premultiplied, alpha).
// pixels holds width * height * channels bytes, row after row from the top.
struct Image {
    int width = 0;
    int height = 0;
    int channels = 0;
    std::vector<uint8_t> pixels;

    size_t row_bytes() const { return static_cast<size_t>(width) * static_cast<size_t>(channels); }
    uint8_t* pixel(int x, int y) {
        return pixels.data() + static_cast<size_t>(y) * row_bytes() + static_cast<size_t>(x) * channels;
    }
    const uint8_t* pixel(int x, int y) const {
        return pixels.data() + static_cast<size_t>(y) * row_bytes() + static_cast<size_t>(x) * channels;
    }
};

// An image of the given shape with every sample set to `fill`. The shape is
// the caller's to get right (validate_image checks one from outside).
Image make_image(int width, int height, int channels, uint8_t fill = 0);

// Ok when channels is 1, 3 or 4, both sides are in [1, kMaxDimension] and
// pixels holds exactly width * height * channels bytes; otherwise an error
// starting with `label` that says which of these fails.
Status validate_image(const Image& image, const std::string& label = "image");

// The image with `channels` channels (1, 3 or 4). Grey comes from RGB with
// the ITU-R 601 luma weights (0.299, 0.587, 0.114), as PIL's "L" mode does;
// grey to RGB repeats the sample; added alpha is opaque; dropped alpha is
// discarded, not composited, as PIL's convert("RGB") does.
Result<Image> convert_channels(const Image& image, int channels);

enum class ResizeFilter {
    // Triangle (linear) filter. For masks: no overshoot, so a binary mask
    // only gains intermediate values at its edges.
    Bilinear,
    // Pillow's bicubic (a = -0.5), the Qwen2-VL image processor's filter.
    Bicubic,
    // Lanczos with a = 3, the filter A1111 uses for init images: sharpest
    // result, slight ringing at hard edges (clamped to [0, 255]).
    Lanczos3,
};

// Resamples to width x height exactly as Pillow's Image.resize does (the
// image A1111 makes from an init image, a mask or a hires input): a
// separable convolution in 22-bit fixed point, the horizontal pass first
// into 8-bit rows. When shrinking, the filter is stretched by the scale
// factor so that every source pixel contributes (area-aware), so large
// reductions do not alias the way point-sampled bilinear does. RGBA is
// filtered premultiplied (Pillow's RGBa) so fully transparent pixels lend no
// colour to their neighbours. Same size in and out returns an exact copy.
// Errors: an invalid input image or a target size outside [1, kMaxDimension].
Result<Image> resize_image(const Image& image, int width, int height, ResizeFilter filter = ResizeFilter::Lanczos3);

}  // namespace kiln::image
