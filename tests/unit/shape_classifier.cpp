#include "shape_classifier.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace kiln::test {
namespace {

struct Named {
    const char* name;
    std::array<double, 3> rgb;
};
// The training set's palette (training/shapes_dataset.py).
constexpr Named kColours[] = {{"red", {220, 30, 30}},     {"green", {30, 170, 50}},   {"blue", {30, 70, 225}},
                              {"yellow", {245, 220, 30}}, {"purple", {140, 45, 185}}, {"orange", {250, 135, 20}}};
constexpr Named kBackgrounds[] = {{"white", {255, 255, 255}}, {"black", {0, 0, 0}}, {"gray", {128, 128, 128}}};

double distance(const std::array<double, 3>& a, const std::array<double, 3>& b) {
    return std::sqrt((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]) + (a[2] - b[2]) * (a[2] - b[2]));
}

template <size_t N>
const char* nearest(const Named (&table)[N], const std::array<double, 3>& rgb) {
    const Named* best = &table[0];
    for (const Named& n : table) {
        if (distance(n.rgb, rgb) < distance(best->rgb, rgb)) best = &n;
    }
    return best->name;
}

double cross(const std::array<double, 2>& o, const std::array<double, 2>& a, const std::array<double, 2>& b) {
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]);
}

// Area of the convex hull (Andrew's monotone chain) of the given points.
double hull_area(std::vector<std::array<double, 2>> pts) {
    std::sort(pts.begin(), pts.end());
    pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
    if (pts.size() < 3) return 0;
    std::vector<std::array<double, 2>> hull(2 * pts.size());
    size_t k = 0;
    for (const auto& p : pts) {
        while (k >= 2 && cross(hull[k - 2], hull[k - 1], p) <= 0) --k;
        hull[k++] = p;
    }
    for (size_t i = pts.size() - 1, lower = k + 1; i-- > 0;) {
        while (k >= lower && cross(hull[k - 2], hull[k - 1], pts[i]) <= 0) --k;
        hull[k++] = pts[i];
    }
    hull.resize(k - 1);
    double area = 0;
    for (size_t i = 0; i < hull.size(); ++i) {
        const auto& a = hull[i];
        const auto& b = hull[(i + 1) % hull.size()];
        area += a[0] * b[1] - b[0] * a[1];
    }
    return std::fabs(area) / 2;
}

}  // namespace

ShapeGuess classify_shape_image(const image::Image& img) {
    ShapeGuess g;
    const int w = img.width, h = img.height;
    auto rgb_at = [&](int x, int y) {
        const uint8_t* p = img.pixel(x, y);
        return std::array<double, 3>{double(p[0]), double(p[1]), double(p[2])};
    };
    // Background: the per-channel median of the border ring.
    std::array<std::vector<double>, 3> border;
    for (int x = 0; x < w; ++x) {
        for (int y : {0, h - 1}) {
            for (int c = 0; c < 3; ++c) border[c].push_back(rgb_at(x, y)[c]);
        }
    }
    for (int y = 0; y < h; ++y) {
        for (int x : {0, w - 1}) {
            for (int c = 0; c < 3; ++c) border[c].push_back(rgb_at(x, y)[c]);
        }
    }
    std::array<double, 3> bg{};
    for (int c = 0; c < 3; ++c) {
        std::nth_element(border[c].begin(), border[c].begin() + border[c].size() / 2, border[c].end());
        bg[c] = border[c][border[c].size() / 2];
    }
    g.background = nearest(kBackgrounds, bg);

    // Foreground: pixels clearly unlike the background, kept to the largest
    // 4-connected blob so that a stray speck or an edge line of the decoder
    // does not stretch the bounding box.
    std::vector<uint8_t> mask(static_cast<size_t>(w) * h, 0);
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) mask[static_cast<size_t>(y) * w + x] = distance(rgb_at(x, y), bg) >= 60;
    }
    std::vector<int> label(mask.size(), -1);
    int best_label = -1;
    size_t best_size = 0;
    for (size_t start = 0; start < mask.size(); ++start) {
        if (!mask[start] || label[start] >= 0) continue;
        const int id = static_cast<int>(start);
        std::vector<size_t> stack{start};
        label[start] = id;
        size_t size = 0;
        while (!stack.empty()) {
            const size_t i = stack.back();
            stack.pop_back();
            ++size;
            const int x = static_cast<int>(i % w), y = static_cast<int>(i / w);
            const int nx[4] = {x - 1, x + 1, x, x}, ny[4] = {y, y, y - 1, y + 1};
            for (int k = 0; k < 4; ++k) {
                if (nx[k] < 0 || ny[k] < 0 || nx[k] >= w || ny[k] >= h) continue;
                const size_t j = static_cast<size_t>(ny[k]) * w + nx[k];
                if (mask[j] && label[j] < 0) {
                    label[j] = id;
                    stack.push_back(j);
                }
            }
        }
        if (size > best_size) {
            best_size = size;
            best_label = id;
        }
    }
    if (best_size < 16) return g;

    // Colour from the blob's pixels most unlike the background (the shape's
    // inside, not its anti-aliased edge).
    std::array<double, 3> sum{};
    size_t core = 0;
    int x0 = w, y0 = h, x1 = -1, y1 = -1;
    std::vector<std::array<double, 2>> corners;
    for (int y = 0; y < h; ++y) {
        for (int x = 0; x < w; ++x) {
            if (label[static_cast<size_t>(y) * w + x] != best_label) continue;
            ++g.foreground_pixels;
            x0 = std::min(x0, x);
            y0 = std::min(y0, y);
            x1 = std::max(x1, x);
            y1 = std::max(y1, y);
            for (double dx : {0.0, 1.0}) {
                for (double dy : {0.0, 1.0}) corners.push_back({x + dx, y + dy});
            }
            const auto p = rgb_at(x, y);
            if (distance(p, bg) > 100) {
                for (int c = 0; c < 3; ++c) sum[c] += p[c];
                ++core;
            }
        }
    }
    if (core == 0) return g;
    g.colour = nearest(kColours, {sum[0] / core, sum[1] / core, sum[2] / core});
    const double area = static_cast<double>(g.foreground_pixels);
    g.fill = area / (static_cast<double>(x1 - x0 + 1) * (y1 - y0 + 1));
    g.solidity = area / std::max(1.0, hull_area(corners));
    // Corners: how much of the four corner patches (a fifth of each side) of
    // the bounding box the blob fills: a square fills them, a circle leaves
    // them empty, a triangle fills only the bottom two.
    const int cw = std::max(1, (x1 - x0 + 1) / 5), ch = std::max(1, (y1 - y0 + 1) / 5);
    auto patch = [&](int px, int py) {
        int on = 0;
        for (int y = py; y < py + ch; ++y) {
            for (int x = px; x < px + cw; ++x) on += label[static_cast<size_t>(y) * w + x] == best_label;
        }
        return static_cast<double>(on) / (cw * ch);
    };
    const double top = (patch(x0, y0) + patch(x1 - cw + 1, y0)) / 2;
    const double bottom = (patch(x0, y1 - ch + 1) + patch(x1 - cw + 1, y1 - ch + 1)) / 2;
    g.corners = (top + bottom) / 2;
    // A star is the only concave shape; of the convex ones a square fills its
    // box and its corners, a circle pi/4 of the box and no corner, a
    // triangle half the box.
    if (g.solidity < 0.8) {
        g.shape = "star";
    } else if (g.corners > 0.5 && top > 0.3) {
        g.shape = "square";
    } else if (g.fill > 0.64) {
        g.shape = "circle";
    } else {
        g.shape = "triangle";
    }
    return g;
}

}  // namespace kiln::test
