#include "image/canny.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace kiln::image {
namespace {

constexpr float kPi = 3.14159265358979323846f;
// sd-cli's arguments to preprocess_canny.
constexpr float kHighThreshold = 0.08f, kLowThreshold = 0.08f, kWeak = 0.8f, kStrong = 1.0f;

struct Plane {
    int width = 0, height = 0;
    std::vector<float> v;
    Plane(int w, int h) : width(w), height(h), v(static_cast<size_t>(w) * h, 0.0f) {}
    float& at(int x, int y) { return v[static_cast<size_t>(y) * width + x]; }
    float at(int x, int y) const { return v[static_cast<size_t>(y) * width + x]; }
};

// Cross-correlation with zero padding, summed as sd-cli sums it (kernel
// rows outer, columns inner). kernel[ky * size + kx].
Plane convolve(const Plane& in, const float* kernel, int size, int padding) {
    Plane out(in.width, in.height);
    for (int y = 0; y < in.height; ++y) {
        for (int x = 0; x < in.width; ++x) {
            float sum = 0.0f;
            for (int ky = 0; ky < size; ++ky) {
                const int iy = y + ky - padding;
                if (iy < 0 || iy >= in.height) continue;
                for (int kx = 0; kx < size; ++kx) {
                    const int ix = x + kx - padding;
                    if (ix < 0 || ix >= in.width) continue;
                    sum += in.at(ix, iy) * kernel[ky * size + kx];
                }
            }
            out.at(x, y) = sum;
        }
    }
    return out;
}

std::vector<float> gaussian_kernel_5x5() {
    constexpr int kSize = 5, kMid = kSize / 2;
    const float sigma = 1.4f;
    const float normal = 1.0f / (2.0f * kPi * std::pow(sigma, 2.0f));
    std::vector<float> k(kSize * kSize);
    for (int y = 0; y < kSize; ++y) {
        const float gx = static_cast<float>(-kMid + y);
        for (int x = 0; x < kSize; ++x) {
            const float gy = static_cast<float>(-kMid + x);
            k[y * kSize + x] = std::exp(-((gx * gx + gy * gy) / (2.0f * std::pow(sigma, 2.0f)))) * normal;
        }
    }
    return k;
}

float largest(const Plane& p) {
    float m = -std::numeric_limits<float>::infinity();
    for (float v : p.v) m = std::max(m, v);
    return m;
}

Plane non_max_suppression(const Plane& magnitude, const Plane& direction) {
    Plane out(magnitude.width, magnitude.height);
    for (int y = 1; y < magnitude.height - 1; ++y) {
        for (int x = 1; x < magnitude.width - 1; ++x) {
            float angle = direction.at(x, y) * 180.0f / kPi;
            if (angle < 0.0f) angle += 180.0f;
            // sd-cli's conditions as written: the first holds for every angle
            // up to 157.5, and nothing holds above it (q = r = 1 then).
            float q = 1.0f, r = 1.0f;
            if ((0 >= angle && angle < 22.5f) || (157.5f >= angle && angle <= 180.0f)) {
                q = magnitude.at(x, y + 1);
                r = magnitude.at(x, y - 1);
            } else if (22.5f >= angle && angle < 67.5f) {
                q = magnitude.at(x + 1, y - 1);
                r = magnitude.at(x - 1, y + 1);
            } else if (67.5f >= angle && angle < 112.5f) {
                q = magnitude.at(x + 1, y);
                r = magnitude.at(x - 1, y);
            } else if (112.5f >= angle && angle < 157.5f) {
                q = magnitude.at(x - 1, y - 1);
                r = magnitude.at(x + 1, y + 1);
            }
            const float here = magnitude.at(x, y);
            out.at(x, y) = here >= q && here >= r ? here : 0.0f;
        }
    }
    return out;
}

void threshold_and_hysteresis(Plane& p) {
    const float high = largest(p) * kHighThreshold;
    const float low = high * kLowThreshold;
    for (float& v : p.v) {
        if (v >= high) {
            v = kStrong;
        } else if (v <= high && v >= low) {
            v = kWeak;
        }
    }
    for (int y = 0; y < p.height; ++y) {
        for (int x = 0; x < p.width; ++x) {
            if (!(x >= 3 && x <= p.width - 3 && y >= 3 && y <= p.height - 3)) p.at(x, y) = 0.0f;
        }
    }
    for (int y = 1; y < p.height - 1; ++y) {
        for (int x = 1; x < p.width - 1; ++x) {
            if (p.at(x, y) != kWeak) continue;
            const bool strong_neighbour = p.at(x + 1, y - 1) == kStrong || p.at(x + 1, y) == kStrong ||
                                          p.at(x, y - 1) == kStrong || p.at(x, y + 1) == kStrong ||
                                          p.at(x - 1, y - 1) == kStrong || p.at(x - 1, y) == kStrong;
            p.at(x, y) = strong_neighbour ? kStrong : 0.0f;
        }
    }
}

uint8_t to_u8(float v) {
    if (v <= 0.0f) return 0;
    if (v >= 1.0f) return 255;
    return static_cast<uint8_t>(v * 255.0f + 0.5f);
}

}  // namespace

Image canny_edges(const Image& image) {
    const int w = image.width, h = image.height;
    Plane grey(w, h);
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            const uint8_t* px = image.pixel(x, y);
            const auto sample = [&](int c) { return px[image.channels >= 3 ? c : 0] / 255.0f; };
            grey.at(x, y) = 0.2989f * sample(0) + 0.5870f * sample(1) + 0.1140f * sample(2);
        }
    }
    const std::vector<float> gaussian = gaussian_kernel_5x5();
    const float sobel_x[9] = {-1, 0, 1, -2, 0, 2, -1, 0, 1};
    const float sobel_y[9] = {1, 2, 1, 0, 0, 0, -1, -2, -1};
    const Plane blurred = convolve(grey, gaussian.data(), 5, 2);
    const Plane gx = convolve(blurred, sobel_x, 3, 1);
    const Plane gy = convolve(blurred, sobel_y, 3, 1);
    Plane magnitude(w, h), direction(w, h);
    for (size_t i = 0; i < magnitude.v.size(); ++i) {
        magnitude.v[i] = std::sqrt(gx.v[i] * gx.v[i] + gy.v[i] * gy.v[i]);
        direction.v[i] = std::atan2(gy.v[i], gx.v[i]);
    }
    const float peak = largest(magnitude);
    if (peak != 0.0f && std::isfinite(peak)) {
        const float scale = 1.0f / peak;
        for (float& v : magnitude.v) v *= scale;
    }
    Plane edges = non_max_suppression(magnitude, direction);
    threshold_and_hysteresis(edges);
    Image out = make_image(w, h, 3);
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            const uint8_t v = to_u8(edges.at(x, y));
            uint8_t* px = out.pixel(x, y);
            px[0] = px[1] = px[2] = v;
        }
    }
    return out;
}

}  // namespace kiln::image
