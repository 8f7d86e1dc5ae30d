// A video's latent decoded as the original decodes it: a latent frame at a
// time, each chunk taking the causal history the one before left, so the
// VAE's memory is one chunk's whatever the clip's length. Where one chunk of
// the whole frame is too much (--vae-tiling, or a decode that runs out of
// memory), the clip is decoded in overlapping spatial tiles, each tile its
// own chunk loop with its own history, and the tiles' frames are blended as
// pipeline/vae_tiling blends an image's: close to the whole decode, not
// equal to it (each tile's convolutions and attention see only the tile).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "pipeline/vae_tiling.h"
#include "util/result.h"

namespace kiln::pipeline {

class Model;

// latent: planar [C, T, h, w], the VAE's own (unscaled) -> planar [F * 3, H,
// W], frame after frame (F = 1 + temporal_downscale (T - 1)). `tiling`:
// decode in tiles; otherwise whole, and in default tiles when the whole
// decode runs out of memory. `decoded` hears the frames done (of the last
// tile, counted over all the tiles' work) after each chunk.
Result<std::vector<float>> decode_clip_planes(Model& model, const std::vector<float>& latent, int64_t w, int64_t h,
                                              int64_t frames, const std::optional<VaeTiling>& tiling,
                                              const std::function<void(int)>& decoded, TilingStats* stats = nullptr);

}  // namespace kiln::pipeline
