#include "image/image.h"

#include <algorithm>
#include <cmath>
#include <new>

namespace kiln::image {

Image make_image(int width, int height, int channels, uint8_t fill) {
    Image image;
    image.width = width;
    image.height = height;
    image.channels = channels;
    image.pixels.assign(static_cast<size_t>(width) * static_cast<size_t>(height) * static_cast<size_t>(channels), fill);
    return image;
}

Status validate_image(const Image& image, const std::string& label) {
    if (image.channels != 1 && image.channels != 3 && image.channels != 4) {
        return Error{label + ": " + std::to_string(image.channels) + " channels (expected 1, 3 or 4)"};
    }
    if (image.width < 1 || image.height < 1 || image.width > kMaxDimension || image.height > kMaxDimension) {
        return Error{label + ": size " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                     " is outside 1x1 .. " + std::to_string(kMaxDimension) + "x" + std::to_string(kMaxDimension)};
    }
    const size_t expected = static_cast<size_t>(image.height) * image.row_bytes();
    if (image.pixels.size() != expected) {
        return Error{label + ": holds " + std::to_string(image.pixels.size()) + " bytes, expected " +
                     std::to_string(expected) + " for " + std::to_string(image.width) + "x" +
                     std::to_string(image.height) + "x" + std::to_string(image.channels)};
    }
    return Status::Ok();
}

namespace {

uint8_t luma(const uint8_t* rgb) {
    // PIL's integer form of the 601 weights, rounded.
    return static_cast<uint8_t>((rgb[0] * 299u + rgb[1] * 587u + rgb[2] * 114u + 500u) / 1000u);
}

}  // namespace

Result<Image> convert_channels(const Image& image, int channels) {
    KILN_TRY(validate_image(image));
    if (channels != 1 && channels != 3 && channels != 4) {
        return Error{"convert_channels: " + std::to_string(channels) + " channels requested (expected 1, 3 or 4)"};
    }
    if (channels == image.channels) return image;
    Image out;
    try {
        out = make_image(image.width, image.height, channels);
    } catch (const std::bad_alloc&) {
        return Error{"convert_channels: out of memory"};
    }
    const size_t count = static_cast<size_t>(image.width) * static_cast<size_t>(image.height);
    const int in_c = image.channels;
    const uint8_t* src = image.pixels.data();
    uint8_t* dst = out.pixels.data();
    for (size_t i = 0; i < count; ++i, src += in_c, dst += channels) {
        const uint8_t grey = in_c == 1 ? src[0] : luma(src);
        if (channels == 1) {
            dst[0] = grey;
            continue;
        }
        for (int c = 0; c < 3; ++c) dst[c] = in_c == 1 ? grey : src[c];
        if (channels == 4) dst[3] = in_c == 4 ? src[3] : 255;
    }
    return out;
}

// ---- resizing -------------------------------------------------------------
//
// Pillow's resampling (libImaging/Resample.c, as of Pillow 9), so that an
// image kiln resizes is, byte for byte, the image PIL.Image.resize makes:
// A1111 prepares init images, masks and hires inputs with it, and users
// compare with A1111. Weights in 22-bit fixed point, the horizontal pass
// first into 8-bit rows, then the vertical pass; RGBA through premultiplied
// 8-bit colour (PIL's RGBa).

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// For one axis: which source samples each output sample reads, and with what
// fixed-point weights.
struct Coefficients {
    int taps = 0;                  // weights per output sample (the widest window)
    std::vector<int> first;        // first source index per output sample
    std::vector<int> count;        // used taps per output sample
    std::vector<int32_t> weights;  // taps per output sample, row-major
};

double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return std::sin(x) / x;
}

double filter_value(ResizeFilter filter, double x) {
    if (filter == ResizeFilter::Bilinear) {
        x = std::fabs(x);
        return x < 1.0 ? 1.0 - x : 0.0;
    }
    if (filter == ResizeFilter::Bicubic) {  // Pillow's bicubic_filter, a = -0.5
        constexpr double a = -0.5;
        x = std::fabs(x);
        if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
        if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
        return 0.0;
    }
    return -3.0 <= x && x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0;
}

double filter_support(ResizeFilter filter) {
    switch (filter) {
        case ResizeFilter::Bilinear: return 1.0;
        case ResizeFilter::Bicubic: return 2.0;
        case ResizeFilter::Lanczos3: return 3.0;
    }
    return 3.0;
}

// Pixel centres sit at i + 0.5 in both grids, so the image edges line up.
// When shrinking, the filter is stretched by the scale (area-aware).
Coefficients coefficients(int in_size, int out_size, ResizeFilter filter) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double stretch = std::max(scale, 1.0);
    const double support = filter_support(filter) * stretch;
    Coefficients c;
    c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
    c.first.resize(out_size);
    c.count.resize(out_size);
    c.weights.assign(static_cast<size_t>(out_size) * c.taps, 0);
    std::vector<double> w(c.taps);
    for (int o = 0; o < out_size; ++o) {
        const double center = (o + 0.5) * scale;
        // PIL's rounding: truncation of x + 0.5.
        const int lo = std::max(0, static_cast<int>(center - support + 0.5));
        const int hi = std::min(in_size, static_cast<int>(center + support + 0.5));
        const int n = std::min(hi - lo, c.taps);
        double sum = 0.0;
        for (int k = 0; k < n; ++k) {
            w[k] = filter_value(filter, (k + lo - center + 0.5) / stretch);
            sum += w[k];
        }
        c.first[o] = lo;
        c.count[o] = n;
        int32_t* dst = c.weights.data() + static_cast<size_t>(o) * c.taps;
        for (int k = 0; k < n; ++k) {
            const double v = (sum != 0.0 ? w[k] / sum : w[k]) * (1 << kPrecisionBits);
            dst[k] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
        }
    }
    return c;
}

uint8_t clip8(int32_t sum) { return static_cast<uint8_t>(std::clamp(sum >> kPrecisionBits, 0, 255)); }

// PIL's RGBA -> RGBa and back (Convert.c).
void premultiply(Image& image) {
    for (size_t i = 0; i < image.pixels.size(); i += 4) {
        const unsigned alpha = image.pixels[i + 3];
        for (int c = 0; c < 3; ++c) {
            const unsigned t = image.pixels[i + c] * alpha + 128;
            image.pixels[i + c] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
        }
    }
}

void unpremultiply(Image& image) {
    for (size_t i = 0; i < image.pixels.size(); i += 4) {
        const unsigned alpha = image.pixels[i + 3];
        if (alpha == 0 || alpha == 255) continue;
        for (int c = 0; c < 3; ++c) {
            image.pixels[i + c] = static_cast<uint8_t>(std::min(255u, 255u * image.pixels[i + c] / alpha));
        }
    }
}

// Rows [first_row, first_row + rows) of `in`, each resampled to cx's width.
Image resample_horizontal(const Image& in, const Coefficients& cx, int out_width, int first_row, int rows) {
    const int ch = in.channels;
    Image out = make_image(out_width, rows, ch);
    for (int y = 0; y < rows; ++y) {
        const uint8_t* src = in.pixel(0, first_row + y);
        uint8_t* dst = out.pixel(0, y);
        for (int o = 0; o < out_width; ++o) {
            const int32_t* w = cx.weights.data() + static_cast<size_t>(o) * cx.taps;
            const uint8_t* px = src + static_cast<size_t>(cx.first[o]) * ch;
            for (int c = 0; c < ch; ++c) {
                int32_t sum = 1 << (kPrecisionBits - 1);
                for (int k = 0; k < cx.count[o]; ++k) sum += px[static_cast<size_t>(k) * ch + c] * w[k];
                dst[static_cast<size_t>(o) * ch + c] = clip8(sum);
            }
        }
    }
    return out;
}

// `in` resampled to cy's height; cy's source indices are offset by `first_row`.
Image resample_vertical(const Image& in, const Coefficients& cy, int out_height, int first_row) {
    Image out = make_image(in.width, out_height, in.channels);
    const size_t row = in.row_bytes();
    for (int o = 0; o < out_height; ++o) {
        const int32_t* w = cy.weights.data() + static_cast<size_t>(o) * cy.taps;
        const uint8_t* src = in.pixel(0, cy.first[o] - first_row);
        uint8_t* dst = out.pixel(0, o);
        for (size_t i = 0; i < row; ++i) {
            int32_t sum = 1 << (kPrecisionBits - 1);
            for (int k = 0; k < cy.count[o]; ++k) sum += src[static_cast<size_t>(k) * row + i] * w[k];
            dst[i] = clip8(sum);
        }
    }
    return out;
}

}  // namespace

Result<Image> resize_image(const Image& image, int width, int height, ResizeFilter filter) {
    KILN_TRY(validate_image(image));
    if (width < 1 || height < 1 || width > kMaxDimension || height > kMaxDimension) {
        return Error{"resize_image: target size " + std::to_string(width) + "x" + std::to_string(height) +
                     " is outside 1x1 .. " + std::to_string(kMaxDimension) + "x" + std::to_string(kMaxDimension)};
    }
    if (width == image.width && height == image.height) return image;
    try {
        const Coefficients cx = coefficients(image.width, width, filter);
        const Coefficients cy = coefficients(image.height, height, filter);
        Image in = image;
        if (in.channels == 4) premultiply(in);
        int offset = 0;
        if (width != image.width) {
            // Only the source rows the vertical pass reads go through the horizontal one.
            offset = cy.first.front();
            in = resample_horizontal(in, cx, width, offset, cy.first.back() + cy.count.back() - offset);
        }
        Image out = height != image.height ? resample_vertical(in, cy, height, offset) : std::move(in);
        if (out.channels == 4) unpremultiply(out);
        return out;
    } catch (const std::bad_alloc&) {
        return Error{"resize_image: out of memory resizing " + std::to_string(image.width) + "x" +
                     std::to_string(image.height) + " to " + std::to_string(width) + "x" + std::to_string(height)};
    }
}

}  // namespace kiln::image
