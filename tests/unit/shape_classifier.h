// A pixel-statistics classifier for the default model's drawings (the tests'
// judge of meaning): background from the border, foreground colour from the
// pixels far from it, shape from how the foreground fills its bounding box,
// its corners and its convex hull.
#pragma once

#include <string>

#include "image/image.h"

namespace kiln::test {

struct ShapeGuess {
    std::string shape;       // circle, square, triangle, star ("" if no foreground)
    std::string colour;      // red, green, blue, yellow, purple, orange
    std::string background;  // white, black, gray
    double fill = 0;         // foreground area / bounding-box area
    double solidity = 0;     // foreground area / convex-hull area
    double corners = 0;      // share of the bounding box's corner patches the shape fills
    size_t foreground_pixels = 0;
};

ShapeGuess classify_shape_image(const image::Image& rgb);

}  // namespace kiln::test
