// A1111's img2img `resize_mode`: how the init image and the mask are made
// width x height before the job, as modules/images.py resize_image does it.
//   0 "Just resize": stretched (Lanczos).
//   1 "Crop and resize": scaled to cover the size, keeping the aspect, and
//     cropped to it about the centre.
//   2 "Resize and fill": scaled to fit inside, keeping the aspect, centred,
//     and the two empty bands filled with the image's edge rows or columns
//     stretched across them.
//   3 "Just resize (latent upscale)" encodes the image at its own size and
//     resizes the latent; kiln's jobs take an init image of the output's
//     size, so it is refused (400 naming resize_mode).
#pragma once

#include <string>

#include "job_request.h"

namespace kiln::server {

// `image` made width x height by `mode` (0, 1 or 2); 400 naming `field` when
// it cannot be. A null image stays null.
SharedImage a1111_resize(const SharedImage& image, int mode, int width, int height, const std::string& field);

}  // namespace kiln::server
