// VAE tiling (--vae-tiling): decode and encode a large image as a grid of
// overlapping tiles, each run through the ordinary VAE graph, so the compute
// buffer is bounded by the tile size instead of the image size. Seams are
// hidden by blending: every output pixel is a weighted average of the tiles
// that cover it, with weights that ramp linearly across each overlap.
//
// The tiled result is close to, not equal to, the untiled one: the VAE's group
// norms and mid-block attention see only their own tile. A grid of one tile is
// the untiled run, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "pipeline/graphs.h"
#include "pipeline/model.h"
#include "util/result.h"

namespace kiln::pipeline {

struct VaeTiling {
    int tile = 32;         // latent pixels per tile side (sd.cpp's default); clamped to the latent's size
    float overlap = 0.5f;  // fraction of a tile shared with its neighbour (sd.cpp's default), in [0, 1)
    // --vae-relative-tile-size, per axis (0: `tile`; see tile_side).
    float relative_w = 0.0f, relative_h = 0.0f;
};

// The tile side along an axis of `size` latent pixels, as sd-cli's
// get_tile_sizes makes it: `relative` in (0, 1] is a share of the side,
// above 1 a number of tiles per side (the share 1 / (r - (r - 1) * overlap),
// overlap capped at 0.5 there); the result is rounded and kept in
// [min(8, size), size]. relative 0: `tile`, kept at most `size`.
int64_t tile_side(const VaeTiling& tiling, float relative, int64_t size);

// What a tiled run did, for logs and tests.
struct TilingStats {
    int tiles_x = 0;
    int tiles_y = 0;
    int tiles() const { return tiles_x * tiles_y; }
};

// tile >= 8 latent pixels, 0 <= overlap < 1, relative sides 0 or in (0,
// 1000]; errors name the parameter and the valid range.
Status validate_tiling(const VaeTiling& tiling);

// Start offsets of the tiles along one axis of `size` latent pixels: a regular
// grid with stride tile - floor(tile * overlap), the last tile moved back so it
// ends at the far edge (it then overlaps its neighbour by more than the rest).
// A tile longer than the axis becomes one tile at 0 covering all of it.
// Requires size >= 1, tile >= 1 and 0 <= overlap < 1.
std::vector<int64_t> tile_starts(int64_t size, int64_t tile, float overlap);

// One tile's computation: planar [in_channels, h * in_scale, w * in_scale]
// in, planar [out_channels, h * out_scale, w * out_scale] out, where w and h
// are the tile's size in grid (latent) pixels.
using TileFn = std::function<Result<std::vector<float>>(const std::vector<float>& input, int64_t w, int64_t h)>;

// The geometry of a tiled map: the grid is in latent pixels; the input and
// output have in_scale and out_scale of their pixels per latent pixel.
struct TiledMap {
    int64_t grid_w = 0, grid_h = 0;
    int64_t in_channels = 0, out_channels = 0;
    int64_t in_scale = 1, out_scale = 1;
};

// Runs `fn` on every tile of `input` (planar [in_channels, grid_h * in_scale,
// grid_w * in_scale]) and blends the outputs into planar [out_channels,
// grid_h * out_scale, grid_w * out_scale]. The blend weight of a tile at an
// output pixel is wx * wy; along each axis it ramps linearly from ~0 at the
// tile's edge to 1 across the overlap with the neighbour on that side, and is 1
// at the image's own borders. The weights are normalised per pixel, so any
// overlap (even more than half a tile, where three tiles meet) averages
// correctly. Errors: a wrongly sized input or tile output, or fn's error.
Result<std::vector<float>> run_tiled(const std::vector<float>& input, const TiledMap& map, const VaeTiling& tiling,
                                     const TileFn& fn, TilingStats* stats = nullptr);

// run_tiled across the job's seams (Model::seams): a tile's own edges are no
// seam, so the tiles pad with zeros; instead the input is extended across
// each seam by half a tile of what lies beyond it on the torus, tiled, and
// the extension cut from the output, so the image's edges are made with
// the other side beside them and meet (sd-cli tiles circularly likewise).
// Without seams, run_tiled. decode_tiled and encode_tiled below tile so.
Result<std::vector<float>> run_tiled_across_seams(Model& model, const std::vector<float>& input, const TiledMap& map,
                                                  const VaeTiling& tiling, const TileFn& fn,
                                                  TilingStats* stats = nullptr);
// The tiles run_tiled_across_seams runs for `map` (progress reports).
int64_t tiles_across_seams(const Model& model, const TiledMap& map, const VaeTiling& tiling);

// latent: planar [latent_channels, latent_h, latent_w], unscaled (already
// divided by the latent scale) -> image planar [3, H, W] in about [-1, 1]
// (not clamped), H and W being latent_h and latent_w times the VAE's
// downscale. Errors: invalid tiling, a latent of the wrong size, a failed graph.
Result<std::vector<float>> decode_tiled(Model& model, const std::vector<float>& latent, int64_t latent_w,
                                        int64_t latent_h, const VaeTiling& tiling, TilingStats* stats = nullptr);

// image: planar [3, height, width] in [-1, 1] -> the latent distribution's
// mean (or with models::LatentEncoding::Moments its mean then log variance), planar
// [latent_channels (x2), height / d, width / d] (unscaled), d being
// the VAE's downscale. Errors: invalid tiling, a VAE without an encoder, width
// or height not a positive multiple of d, an image of the wrong size, a failed graph.
Result<std::vector<float>> encode_tiled(Model& model, const std::vector<float>& image, int64_t width, int64_t height,
                                        const VaeTiling& tiling, TilingStats* stats = nullptr,
                                        models::LatentEncoding encoding = models::LatentEncoding::Mean);

}  // namespace kiln::pipeline
