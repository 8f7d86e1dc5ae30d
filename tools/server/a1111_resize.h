// A1111's img2img `resize_mode`: how the init image and the mask are made
// width x height before the job, as modules/images.py resize_image does it.
//   0 "Just resize": stretched (Lanczos).
//   1 "Crop and resize": scaled to cover the size, keeping the aspect, and
//     cropped to it about the centre.
//   2 "Resize and fill": scaled to fit inside, keeping the aspect, centred,
//     and the two empty bands filled with the image's edge rows or columns
//     stretched across them.
//   3 "Just resize (latent upscale)" encodes the image at its own size and
//     resizes the latent (bilinear) to width x height: the job's
//     init_latent_resize. A1111's encoder reads an image of any size and
//     its latent is floor(side / 8); kiln's takes multiples of 8, so the
//     image's last (side % 8) columns and rows are cut first
//     (cut_to_multiples_of_8), which changes only the last latent row and
//     column a little. With a mask it is refused (A1111 fails on it too:
//     the mask is made width x height, the image is not).
#pragma once

#include <string>

#include "job_request.h"

namespace kiln::server {

// `image` made width x height by `mode` (0, 1 or 2); 400 naming `field` when
// it cannot be. A null image stays null.
SharedImage a1111_resize(const SharedImage& image, int mode, int width, int height, const std::string& field);

// `image` without its last (width % 8) columns and (height % 8) rows; 400
// naming `field` when a side is under 8.
SharedImage cut_to_multiples_of_8(const SharedImage& image, const std::string& field);

}  // namespace kiln::server
