#include "pipeline/latent_resize.h"

#include <algorithm>
#include <cmath>

namespace kiln::pipeline {
namespace {

// Where output index `i` samples the input along one axis: the two input
// indices and the second one's weight.
struct Tap {
    int64_t i0 = 0, i1 = 0;
    float w1 = 0.0f;
};

std::vector<Tap> taps(int64_t in, int64_t out, LatentResize mode) {
    std::vector<Tap> t(static_cast<size_t>(out));
    const double scale = static_cast<double>(in) / static_cast<double>(out);
    for (int64_t i = 0; i < out; ++i) {
        Tap& tap = t[static_cast<size_t>(i)];
        if (mode != LatentResize::Bilinear) {
            const double offset = mode == LatentResize::NearestExact ? 0.5 : 0.0;
            tap.i0 = tap.i1 =
                std::min(in - 1, static_cast<int64_t>(std::floor((static_cast<double>(i) + offset) * scale)));
            continue;
        }
        // align_corners=False: pixel centres line up; clamped at the low edge.
        const double src = std::max(0.0, (static_cast<double>(i) + 0.5) * scale - 0.5);
        tap.i0 = std::min(in - 1, static_cast<int64_t>(src));
        tap.i1 = std::min(in - 1, tap.i0 + 1);
        tap.w1 = static_cast<float>(src - static_cast<double>(tap.i0));
    }
    return t;
}

}  // namespace

std::vector<float> resize_latent(const std::vector<float>& latent, int64_t channels, int64_t w, int64_t h,
                                 int64_t out_w, int64_t out_h, LatentResize mode) {
    const std::vector<Tap> tx = taps(w, out_w, mode), ty = taps(h, out_h, mode);
    std::vector<float> out(static_cast<size_t>(channels * out_w * out_h));
    for (int64_t c = 0; c < channels; ++c) {
        const float* plane = latent.data() + c * w * h;
        for (int64_t y = 0; y < out_h; ++y) {
            const Tap& b = ty[static_cast<size_t>(y)];
            const float* r0 = plane + b.i0 * w;
            const float* r1 = plane + b.i1 * w;
            float* dst = out.data() + (c * out_h + y) * out_w;
            for (int64_t x = 0; x < out_w; ++x) {
                const Tap& a = tx[static_cast<size_t>(x)];
                const float top = r0[a.i0] + (r0[a.i1] - r0[a.i0]) * a.w1;
                const float bottom = r1[a.i0] + (r1[a.i1] - r1[a.i0]) * a.w1;
                dst[x] = top + (bottom - top) * b.w1;
            }
        }
    }
    return out;
}

}  // namespace kiln::pipeline
