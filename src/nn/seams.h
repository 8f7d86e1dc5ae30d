// Which edges of an image meet, for seamless (tiling) images: sd-cli's
// --circular, --circularx and --circulary, A1111's "Tiling".
#pragma once

namespace kiln::nn {

// A padded convolution reads the opposite edge where it would read zeros
// (PyTorch's padding_mode="circular"), and a DiT's positions repeat with the
// image's period (nn/rope.h), so the image's edges continue each other.
struct Seams {
    bool x = false;  // the left and right edges meet
    bool y = false;  // the top and bottom edges meet
    bool any() const { return x || y; }
    bool operator==(const Seams& o) const { return x == o.x && y == o.y; }
    bool operator!=(const Seams& o) const { return !(*this == o); }
};

}  // namespace kiln::nn
