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

namespace {

// For one axis: which source samples each output sample reads, and with what
// weights (normalised to sum 1).
struct Contributions {
    int taps = 0;                // weights per output sample (the widest window)
    std::vector<int> first;      // first source index per output sample
    std::vector<int> count;      // used taps per output sample
    std::vector<float> weights;  // taps per output sample, row-major
};

double sinc(double x) {
    if (x == 0.0) return 1.0;
    x *= M_PI;
    return std::sin(x) / x;
}

double filter_value(ResizeFilter filter, double x) {
    x = std::fabs(x);
    if (filter == ResizeFilter::Bilinear) return x < 1.0 ? 1.0 - x : 0.0;
    return x < 3.0 ? sinc(x) * sinc(x / 3.0) : 0.0;
}

double filter_support(ResizeFilter filter) { return filter == ResizeFilter::Bilinear ? 1.0 : 3.0; }

// Pixel centres sit at i + 0.5 in both grids, so the image edges line up
// exactly (the convention of PIL, OpenCV's INTER_AREA and A1111).
Contributions contributions(int in_size, int out_size, ResizeFilter filter) {
    const double scale = static_cast<double>(in_size) / out_size;
    const double stretch = std::max(scale, 1.0);
    const double support = filter_support(filter) * stretch;
    Contributions c;
    c.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
    c.first.resize(out_size);
    c.count.resize(out_size);
    c.weights.assign(static_cast<size_t>(out_size) * c.taps, 0.0f);
    std::vector<double> w(c.taps);
    for (int o = 0; o < out_size; ++o) {
        const double center = (o + 0.5) * scale;
        const int lo = std::max(0, static_cast<int>(std::floor(center - support + 0.5)));
        const int hi = std::min(in_size, static_cast<int>(std::floor(center + support + 0.5)));
        const int n = std::min(hi - lo, c.taps);
        double sum = 0.0;
        for (int k = 0; k < n; ++k) {
            w[k] = filter_value(filter, (lo + k + 0.5 - center) / stretch);
            sum += w[k];
        }
        c.first[o] = lo;
        c.count[o] = n;
        float* dst = c.weights.data() + static_cast<size_t>(o) * c.taps;
        // sum is positive: the window always holds the sample nearest the centre.
        for (int k = 0; k < n; ++k) dst[k] = static_cast<float>(sum != 0.0 ? w[k] / sum : 0.0);
    }
    return c;
}

// One source row as floats, colour premultiplied by alpha for RGBA.
void load_row(const Image& image, int y, float* out) {
    const uint8_t* src = image.pixel(0, y);
    const size_t n = image.row_bytes();
    if (image.channels != 4) {
        for (size_t i = 0; i < n; ++i) out[i] = src[i];
        return;
    }
    for (size_t i = 0; i < n; i += 4) {
        const float a = src[i + 3] * (1.0f / 255.0f);
        out[i] = src[i] * a;
        out[i + 1] = src[i + 1] * a;
        out[i + 2] = src[i + 2] * a;
        out[i + 3] = src[i + 3];
    }
}

uint8_t to_u8(float v) { return static_cast<uint8_t>(std::lround(std::clamp(v, 0.0f, 255.0f))); }

// Inverse of load_row.
void store_row(const float* in, int width, int channels, uint8_t* dst) {
    const size_t n = static_cast<size_t>(width) * channels;
    if (channels != 4) {
        for (size_t i = 0; i < n; ++i) dst[i] = to_u8(in[i]);
        return;
    }
    for (size_t i = 0; i < n; i += 4) {
        const uint8_t a = to_u8(in[i + 3]);
        dst[i + 3] = a;
        const float alpha = std::clamp(in[i + 3], 0.0f, 255.0f) * (1.0f / 255.0f);
        for (int c = 0; c < 3; ++c) dst[i + c] = alpha > 0.0f ? to_u8(in[i + c] / alpha) : 0;
    }
}

void resample_row(const float* in, float* out, int out_width, int channels, const Contributions& cx) {
    for (int o = 0; o < out_width; ++o) {
        const float* w = cx.weights.data() + static_cast<size_t>(o) * cx.taps;
        const float* src = in + static_cast<size_t>(cx.first[o]) * channels;
        float acc[4] = {0, 0, 0, 0};
        for (int k = 0; k < cx.count[o]; ++k, src += channels) {
            for (int c = 0; c < channels; ++c) acc[c] += w[k] * src[c];
        }
        for (int c = 0; c < channels; ++c) out[static_cast<size_t>(o) * channels + c] = acc[c];
    }
}

// Accumulates sum_k w_k * row(first + k) into `out` (row_len floats).
template <class RowAt>
void resample_column(int o, const Contributions& cy, size_t row_len, RowAt row_at, float* out) {
    std::fill(out, out + row_len, 0.0f);
    const float* w = cy.weights.data() + static_cast<size_t>(o) * cy.taps;
    for (int k = 0; k < cy.count[o]; ++k) {
        const float* row = row_at(cy.first[o] + k);
        const float wk = w[k];
        for (size_t i = 0; i < row_len; ++i) out[i] += wk * row[i];
    }
}

}  // namespace

Result<Image> resize_image(const Image& image, int width, int height, ResizeFilter filter) {
    KILN_TRY(validate_image(image));
    if (width < 1 || height < 1 || width > kMaxDimension || height > kMaxDimension) {
        return Error{"resize_image: target size " + std::to_string(width) + "x" + std::to_string(height) +
                     " is outside 1x1 .. " + std::to_string(kMaxDimension) + "x" + std::to_string(kMaxDimension)};
    }
    if (width == image.width && height == image.height) return image;

    const int ch = image.channels;
    const Contributions cx = contributions(image.width, width, filter);
    const Contributions cy = contributions(image.height, height, filter);
    try {
        Image out = make_image(width, height, ch);
        // Two passes through a float buffer; the pass that shrinks more goes
        // first so the intermediate buffer is the smaller of the two options.
        const bool horizontal_first =
            static_cast<size_t>(width) * image.height <= static_cast<size_t>(image.width) * height;
        if (horizontal_first) {
            const size_t mid_row = static_cast<size_t>(width) * ch;
            std::vector<float> mid(mid_row * image.height);
            std::vector<float> row(image.row_bytes());
            for (int y = 0; y < image.height; ++y) {
                load_row(image, y, row.data());
                resample_row(row.data(), mid.data() + y * mid_row, width, ch, cx);
            }
            std::vector<float> acc(mid_row);
            for (int y = 0; y < height; ++y) {
                resample_column(
                    y, cy, mid_row, [&](int sy) { return mid.data() + sy * mid_row; }, acc.data());
                store_row(acc.data(), width, ch, out.pixel(0, y));
            }
        } else {
            const size_t in_row = image.row_bytes();
            // Source rows are converted as they are read (each a few times)
            // rather than all at once, which would cost 4 bytes per sample.
            std::vector<float> scratch(in_row), acc(in_row), row(static_cast<size_t>(width) * ch);
            auto row_at = [&](int sy) {
                load_row(image, sy, scratch.data());
                return static_cast<const float*>(scratch.data());
            };
            for (int y = 0; y < height; ++y) {
                resample_column(y, cy, in_row, row_at, acc.data());
                resample_row(acc.data(), row.data(), width, ch, cx);
                store_row(row.data(), width, ch, out.pixel(0, y));
            }
        }
        return out;
    } catch (const std::bad_alloc&) {
        return Error{"resize_image: out of memory resizing " + std::to_string(image.width) + "x" +
                     std::to_string(image.height) + " to " + std::to_string(width) + "x" + std::to_string(height)};
    }
}

}  // namespace kiln::image
