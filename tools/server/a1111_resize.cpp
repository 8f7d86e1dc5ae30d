#include "a1111_resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "request_fields.h"

namespace kiln::server {
namespace {

// `part` copied onto `canvas` with its top-left corner at (x, y); what falls
// outside the canvas is cut off (PIL's paste).
void paste(kiln_image& canvas, const kiln_image& part, int x, int y) {
    const int c = int(canvas.channels);
    const int x0 = std::max(x, 0), x1 = std::min(x + int(part.width), int(canvas.width));
    if (x1 <= x0) return;
    for (int row = std::max(y, 0); row < std::min(y + int(part.height), int(canvas.height)); ++row) {
        std::memcpy(canvas.data + (size_t(row) * canvas.width + x0) * c,
                    part.data + (size_t(row - y) * part.width + (x0 - x)) * c, size_t(x1 - x0) * c);
    }
}

// PIL's bicubic filter (a = -0.5, support 2).
double bicubic(double x) {
    constexpr double a = -0.5;
    x = std::fabs(x);
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

// A1111 fills a band by resizing a zero-height (or zero-width) box at the
// image's edge to the band's size, with PIL's default filter (bicubic). PIL
// samples such a box at the edge line itself: every filled line is the same
// bicubic blend of the two image lines nearest the edge, in PIL's 8-bit
// fixed point. `edge` is 0 for the first line, `lines` for the last;
// returns {first line, weights}.
std::pair<int, std::vector<int>> edge_blend(int edge, int lines) {
    constexpr int kPrecisionBits = 32 - 8 - 2;  // PIL's resample for 8-bit images
    const double center = edge, support = 2.0;
    const int first = std::max(int(center - support + 0.5), 0);
    const int last = std::min(int(center + support + 0.5), lines);
    std::vector<double> weights;
    double sum = 0.0;
    for (int i = first; i < last; ++i) {
        weights.push_back(bicubic(i - center + 0.5));
        sum += weights.back();
    }
    std::vector<int> fixed;
    for (double w : weights) {
        const double k = (sum != 0.0 ? w / sum : w) * (1 << kPrecisionBits);
        fixed.push_back(int(k < 0 ? k - 0.5 : k + 0.5));
    }
    return {first, fixed};
}

uint8_t blend(const std::vector<int>& weights, const uint8_t* first, size_t stride) {
    constexpr int kPrecisionBits = 32 - 8 - 2;
    int sum = 1 << (kPrecisionBits - 1);
    for (size_t i = 0; i < weights.size(); ++i) sum += weights[i] * first[i * stride];
    return uint8_t(std::clamp(sum >> kPrecisionBits, 0, 255));
}

// Rows [y, y + rows) of `canvas` set to the blend of `part`'s edge rows at
// `edge` (0: top, part.height: bottom); `part` spans the canvas's width.
void fill_rows(kiln_image& canvas, const kiln_image& part, int edge, int y, int rows) {
    const auto [first, weights] = edge_blend(edge, int(part.height));
    const size_t c = canvas.channels, row_bytes = size_t(part.width) * c;
    std::vector<uint8_t> line(row_bytes);
    for (size_t i = 0; i < row_bytes; ++i)
        line[i] = blend(weights, part.data + size_t(first) * row_bytes + i, row_bytes);
    for (int row = std::max(y, 0); row < std::min(y + rows, int(canvas.height)); ++row) {
        std::memcpy(canvas.data + size_t(row) * canvas.width * c, line.data(),
                    std::min<size_t>(row_bytes, canvas.width * c));
    }
}

// Columns [x, x + columns) set from `part`'s edge columns (0: left, part.width: right).
void fill_columns(kiln_image& canvas, const kiln_image& part, int edge, int x, int columns) {
    const auto [first, weights] = edge_blend(edge, int(part.width));
    const size_t c = canvas.channels;
    for (uint32_t row = 0; row < std::min(part.height, canvas.height); ++row) {
        for (size_t ch = 0; ch < c; ++ch) {
            const uint8_t v = blend(weights, part.data + (size_t(row) * part.width + first) * c + ch, c);
            for (int col = std::max(x, 0); col < std::min(x + columns, int(canvas.width)); ++col) {
                canvas.data[(size_t(row) * canvas.width + col) * c + ch] = v;
            }
        }
    }
}

}  // namespace

SharedImage a1111_resize(const SharedImage& image, int mode, int width, int height, const std::string& field) {
    if (!image || mode == 0) return resized(image, width, height, field);
    // A1111's integer arithmetic: the scaled side is floor(side * other / other).
    const double ratio = double(width) / height, source_ratio = double(image->width) / image->height;
    const bool cover = mode == 1;
    const bool wider = cover ? ratio > source_ratio : ratio < source_ratio;
    const bool taller = cover ? ratio <= source_ratio : ratio >= source_ratio;
    const int scaled_width = wider ? width : int(int64_t(image->width) * height / image->height);
    const int scaled_height = taller ? height : int(int64_t(image->height) * width / image->width);
    if (scaled_width < 1 || scaled_height < 1) {
        throw RequestError{400, field,
                           field + ": a " + std::to_string(image->width) + "x" + std::to_string(image->height) +
                               " image cannot be fitted to " + std::to_string(width) + "x" + std::to_string(height)};
    }
    const SharedImage scaled = resized(image, scaled_width, scaled_height, field);
    SharedImage canvas = blank_image(uint32_t(width), uint32_t(height), image->channels);
    const int x = width / 2 - scaled_width / 2, y = height / 2 - scaled_height / 2;
    paste(*canvas, *scaled, x, y);
    if (cover) return canvas;
    if (ratio < source_ratio && y > 0) {  // bands above and below
        fill_rows(*canvas, *scaled, 0, 0, y);
        fill_rows(*canvas, *scaled, scaled_height, y + scaled_height, y);
    } else if (ratio > source_ratio && x > 0) {  // bands left and right
        fill_columns(*canvas, *scaled, 0, 0, x);
        fill_columns(*canvas, *scaled, scaled_width, x + scaled_width, x);
    }
    return canvas;
}

SharedImage cut_to_multiples_of_8(const SharedImage& image, const std::string& field) {
    if (image->width < 8 || image->height < 8) {
        throw RequestError{400, field,
                           field + ": a " + std::to_string(image->width) + "x" + std::to_string(image->height) +
                               " image is too small to encode (8x8 at least)"};
    }
    if (image->width % 8 == 0 && image->height % 8 == 0) return image;
    SharedImage cut = blank_image(image->width / 8 * 8, image->height / 8 * 8, image->channels);
    paste(*cut, *image, 0, 0);
    return cut;
}

}  // namespace kiln::server
