#include "pipeline/vae_tiling.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "pipeline/graphs.h"
#include "runtime/graph_session.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

// In smaller tiles the VAE's convolutions would mostly see the zero padding
// at the tile's edges, and the blend would have next to nothing to work with.
constexpr int kMinTile = 8;
constexpr float kMaxRelativeTile = 1000.0f;  // tiles per side

// Blend weights of each tile along one axis, in output pixels: a linear ramp
// across the overlap with the previous tile, 1 in the middle, a ramp down
// across the overlap with the next tile. Ramps sample pixel centres, so at
// pixel i of an overlap of n pixels the two tiles weigh (n - i - 0.5) / n and
// (i + 0.5) / n: they sum to 1 and no pixel of a tile weighs 0. Where more than
// two tiles meet (overlap > 0.5) a tile takes the lower of its two ramps and
// run_tiled's normalisation keeps the average exact.
struct AxisWeights {
    std::vector<std::vector<float>> per_tile;  // per tile: tile length * scale weights
    std::vector<float> sum;                    // per output pixel: the sum over the tiles covering it
};

AxisWeights axis_weights(const std::vector<int64_t>& starts, int64_t tile, int64_t size, int64_t scale) {
    AxisWeights a;
    a.sum.assign(static_cast<size_t>(size * scale), 0.0f);
    const size_t n = starts.size();
    const int64_t len = tile * scale;
    for (size_t k = 0; k < n; ++k) {
        const int64_t before = k > 0 ? (starts[k - 1] + tile - starts[k]) * scale : 0;
        const int64_t after = k + 1 < n ? (starts[k] + tile - starts[k + 1]) * scale : 0;
        std::vector<float> w(static_cast<size_t>(len), 1.0f);
        for (int64_t i = 0; i < len; ++i) {
            float v = 1.0f;
            if (i < before) v = std::min(v, (static_cast<float>(i) + 0.5f) / static_cast<float>(before));
            const int64_t from_end = len - 1 - i;
            if (from_end < after) v = std::min(v, (static_cast<float>(from_end) + 0.5f) / static_cast<float>(after));
            w[static_cast<size_t>(i)] = v;
            a.sum[static_cast<size_t>(starts[k] * scale + i)] += v;
        }
        a.per_tile.push_back(std::move(w));
    }
    return a;
}

std::string dims(int64_t w, int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

}  // namespace

Status validate_tiling(const VaeTiling& tiling) {
    if (tiling.tile < kMinTile) {
        return Error{"VAE tile size must be at least " + std::to_string(kMinTile) + " latent pixels, got " +
                     std::to_string(tiling.tile)};
    }
    // Written so that NaN fails too.
    if (!(tiling.overlap >= 0.0f && tiling.overlap < 1.0f)) {
        return Error{"VAE tile overlap must be in [0, 1), got " + std::to_string(tiling.overlap)};
    }
    for (const float r : {tiling.relative_w, tiling.relative_h}) {
        if (!(r == 0.0f || (r > 0.0f && r <= kMaxRelativeTile))) {
            return Error{"--vae-relative-tile-size must be 0 or in (0, " + format_number(kMaxRelativeTile) +
                         "], got " + format_number(r)};
        }
    }
    return Status::Ok();
}

int64_t tile_side(const VaeTiling& tiling, float relative, int64_t size) {
    if (relative <= 0.0f) return std::min<int64_t>(tiling.tile, size);
    double share = relative;
    if (relative > 1.0f) {
        const double overlap = std::clamp(static_cast<double>(tiling.overlap), 0.0, 0.5);
        share = 1.0 / (relative - relative * overlap + overlap);
    }
    const auto tile = static_cast<int64_t>(std::llround(static_cast<double>(size) * share));
    return std::clamp<int64_t>(tile, std::min<int64_t>(kMinTile, size), size);
}

std::vector<int64_t> tile_starts(int64_t size, int64_t tile, float overlap) {
    if (tile >= size) return {0};
    // sd.cpp truncates the overlap to whole pixels the same way; overlap < 1 keeps the stride >= 1.
    const auto shared = static_cast<int64_t>(static_cast<double>(tile) * static_cast<double>(overlap));
    const int64_t stride = std::max<int64_t>(1, tile - shared);
    std::vector<int64_t> starts;
    for (int64_t s = 0; s + tile < size; s += stride) starts.push_back(s);
    // The loop stopped at a tile that would reach or cross the far edge: put
    // the last tile flush with it instead (never at an existing start, since
    // every start so far ends before the edge).
    starts.push_back(size - tile);
    return starts;
}

Result<std::vector<float>> run_tiled(const std::vector<float>& input, const TiledMap& map, const VaeTiling& tiling,
                                     const TileFn& fn, TilingStats* stats) {
    KILN_TRY(validate_tiling(tiling));
    if (map.grid_w < 1 || map.grid_h < 1 || map.in_channels < 1 || map.out_channels < 1 || map.in_scale < 1 ||
        map.out_scale < 1) {
        return Error{"tiled VAE: empty or invalid geometry (" + dims(map.grid_w, map.grid_h) + " latent pixels)"};
    }
    const int64_t in_w = map.grid_w * map.in_scale, in_h = map.grid_h * map.in_scale;
    const int64_t out_w = map.grid_w * map.out_scale, out_h = map.grid_h * map.out_scale;
    if (static_cast<int64_t>(input.size()) != map.in_channels * in_w * in_h) {
        return Error{"tiled VAE: the input has " + std::to_string(input.size()) + " values, expected " +
                     std::to_string(map.in_channels) + " x " + dims(in_w, in_h)};
    }

    // A tile never exceeds the image: a strip narrower than one tile is one tile wide.
    const int64_t tile_w = tile_side(tiling, tiling.relative_w, map.grid_w);
    const int64_t tile_h = tile_side(tiling, tiling.relative_h, map.grid_h);
    const std::vector<int64_t> xs = tile_starts(map.grid_w, tile_w, tiling.overlap);
    const std::vector<int64_t> ys = tile_starts(map.grid_h, tile_h, tiling.overlap);
    const AxisWeights wx = axis_weights(xs, tile_w, map.grid_w, map.out_scale);
    const AxisWeights wy = axis_weights(ys, tile_h, map.grid_h, map.out_scale);
    if (stats) {
        stats->tiles_x = static_cast<int>(xs.size());
        stats->tiles_y = static_cast<int>(ys.size());
    }
    KILN_LOG_VERBOSE("VAE tiling: %zux%zu tiles of %s latent pixels over %s", xs.size(), ys.size(),
                     dims(tile_w, tile_h).c_str(), dims(map.grid_w, map.grid_h).c_str());

    const int64_t tin_w = tile_w * map.in_scale, tin_h = tile_h * map.in_scale;
    const int64_t tout_w = tile_w * map.out_scale, tout_h = tile_h * map.out_scale;
    std::vector<float> crop(static_cast<size_t>(map.in_channels * tin_w * tin_h));
    std::vector<float> out(static_cast<size_t>(map.out_channels * out_w * out_h), 0.0f);
    for (size_t ty = 0; ty < ys.size(); ++ty) {
        for (size_t tx = 0; tx < xs.size(); ++tx) {
            const int64_t x0 = xs[tx] * map.in_scale, y0 = ys[ty] * map.in_scale;
            for (int64_t c = 0; c < map.in_channels; ++c) {
                for (int64_t y = 0; y < tin_h; ++y) {
                    const float* src = input.data() + (c * in_h + y0 + y) * in_w + x0;
                    std::copy(src, src + tin_w, crop.begin() + (c * tin_h + y) * tin_w);
                }
            }
            auto tile_out = fn(crop, tile_w, tile_h);
            if (!tile_out.ok()) return tile_out.error();
            const std::vector<float>& t = *tile_out;
            if (static_cast<int64_t>(t.size()) != map.out_channels * tout_w * tout_h) {
                return Error{"tiled VAE: a tile's output has " + std::to_string(t.size()) + " values, expected " +
                             std::to_string(map.out_channels) + " x " + dims(tout_w, tout_h)};
            }
            const std::vector<float>& wxs = wx.per_tile[tx];
            const std::vector<float>& wys = wy.per_tile[ty];
            const int64_t ox = xs[tx] * map.out_scale, oy = ys[ty] * map.out_scale;
            for (int64_t c = 0; c < map.out_channels; ++c) {
                for (int64_t y = 0; y < tout_h; ++y) {
                    const float wrow = wys[static_cast<size_t>(y)];
                    const float* src = t.data() + (c * tout_h + y) * tout_w;
                    float* dst = out.data() + (c * out_h + oy + y) * out_w + ox;
                    for (int64_t x = 0; x < tout_w; ++x) dst[x] += src[x] * (wrow * wxs[static_cast<size_t>(x)]);
                }
            }
        }
    }
    // The grid is regular, so the weight sum at a pixel factors into the two axis sums.
    for (int64_t c = 0; c < map.out_channels; ++c) {
        for (int64_t y = 0; y < out_h; ++y) {
            const float sy = wy.sum[static_cast<size_t>(y)];
            float* row = out.data() + (c * out_h + y) * out_w;
            for (int64_t x = 0; x < out_w; ++x) row[x] /= sy * wx.sum[static_cast<size_t>(x)];
        }
    }
    return out;
}

namespace {

// The out_w x out_h window of planar [channels, h, w] whose corner is at
// (x0, y0), read on the torus: with a negative corner and a larger window,
// the planes extended by what lies beyond their edges; with a positive one
// and a smaller window, their middle.
std::vector<float> torus_window(const std::vector<float>& in, int64_t channels, int64_t w, int64_t h, int64_t x0,
                                int64_t y0, int64_t out_w, int64_t out_h) {
    std::vector<float> out(static_cast<size_t>(channels * out_w * out_h));
    for (int64_t c = 0; c < channels; ++c)
        for (int64_t y = 0; y < out_h; ++y)
            for (int64_t x = 0; x < out_w; ++x) {
                const int64_t sy = ((y + y0) % h + h) % h, sx = ((x + x0) % w + w) % w;
                out[static_cast<size_t>((c * out_h + y) * out_w + x)] = in[static_cast<size_t>((c * h + sy) * w + sx)];
            }
    return out;
}

// The columns and rows the input is extended by across each seam: half a
// tile, at least one, at most the side.
std::pair<int64_t, int64_t> seam_margins(nn::Seams seams, const TiledMap& map, const VaeTiling& tiling) {
    const int64_t w = map.grid_w, h = map.grid_h;
    return {seams.x ? std::min(w, std::max<int64_t>(1, tile_side(tiling, tiling.relative_w, w) / 2)) : 0,
            seams.y ? std::min(h, std::max<int64_t>(1, tile_side(tiling, tiling.relative_h, h) / 2)) : 0};
}

}  // namespace

int64_t tiles_across_seams(const Model& model, const TiledMap& map, const VaeTiling& tiling) {
    const auto [mx, my] = seam_margins(model.seams(), map, tiling);
    const int64_t w = map.grid_w + 2 * mx, h = map.grid_h + 2 * my;
    return static_cast<int64_t>(tile_starts(w, tile_side(tiling, tiling.relative_w, w), tiling.overlap).size() *
                                tile_starts(h, tile_side(tiling, tiling.relative_h, h), tiling.overlap).size());
}

Result<std::vector<float>> run_tiled_across_seams(Model& model, const std::vector<float>& input, const TiledMap& map,
                                                  const VaeTiling& tiling, const TileFn& fn, TilingStats* stats) {
    const nn::Seams seams = model.seams();
    if (!seams.any()) return run_tiled(input, map, tiling, fn, stats);
    const int64_t w = map.grid_w, h = map.grid_h;
    const auto [mx, my] = seam_margins(seams, map, tiling);
    if (input.size() != static_cast<size_t>(map.in_channels * w * h * map.in_scale * map.in_scale)) {
        return Error{"VAE tiling: the input has the wrong size"};
    }
    // A tile's own edges are no seam: the tiles pad with zeros.
    const SeamsScope tiles(model, nn::Seams{});
    TiledMap extended = map;
    extended.grid_w = w + 2 * mx;
    extended.grid_h = h + 2 * my;
    const int64_t in_w = w * map.in_scale, in_h = h * map.in_scale;
    auto out = run_tiled(torus_window(input, map.in_channels, in_w, in_h, -mx * map.in_scale, -my * map.in_scale,
                                      extended.grid_w * map.in_scale, extended.grid_h * map.in_scale),
                         extended, tiling, fn, stats);
    if (!out.ok()) return out.error();
    return torus_window(*out, map.out_channels, extended.grid_w * map.out_scale, extended.grid_h * map.out_scale,
                        mx * map.out_scale, my * map.out_scale, w * map.out_scale, h * map.out_scale);
}

Result<std::vector<float>> decode_tiled(Model& model, const std::vector<float>& latent, int64_t latent_w,
                                        int64_t latent_h, const VaeTiling& tiling, TilingStats* stats) {
    KILN_TRY(validate_tiling(tiling));
    const models::AutoencoderFormat& vc = model.vae().format();
    if (latent_w < 1 || latent_h < 1) {
        return Error{"VAE decode: the latent size " + dims(latent_w, latent_h) + " is empty"};
    }
    TiledMap map;
    map.grid_w = latent_w;
    map.grid_h = latent_h;
    map.in_channels = vc.latent_channels;
    map.out_channels = vc.image_channels;
    map.in_scale = 1;
    map.out_scale = vc.downscale;
    TileFn fn = [&](const std::vector<float>& z, int64_t w, int64_t h) -> Result<std::vector<float>> {
        VaeGraph g = build_vae_decode_graph(model, w, h, z.data());
        KILN_TRY(g.session->run(model.vae_compute(), g.out));
        return runtime::GraphSession::read(g.out);
    };
    return run_tiled_across_seams(model, latent, map, tiling, fn, stats);
}

Result<std::vector<float>> encode_tiled(Model& model, const std::vector<float>& image, int64_t width, int64_t height,
                                        const VaeTiling& tiling, TilingStats* stats, models::LatentEncoding encoding) {
    KILN_TRY(validate_tiling(tiling));
    const models::AutoencoderFormat& vc = model.vae().format();
    if (!vc.has_encoder) return Error{"this model's VAE has no encoder"};
    const int64_t d = vc.downscale;
    // Tiles start on multiples of d image pixels, so every tile's downsampling
    // lines up with the whole image's; that needs whole latent pixels.
    if (width < d || height < d || width % d != 0 || height % d != 0) {
        return Error{"VAE encode: width and height must be positive multiples of " + std::to_string(d) + ", got " +
                     dims(width, height)};
    }
    TiledMap map;
    map.grid_w = width / d;
    map.grid_h = height / d;
    map.in_channels = vc.image_channels;
    map.out_channels = vc.latent_channels * (encoding == models::LatentEncoding::Moments ? 2 : 1);
    map.in_scale = d;
    map.out_scale = 1;
    TileFn fn = [&](const std::vector<float>& pixels, int64_t w, int64_t h) -> Result<std::vector<float>> {
        VaeGraph g = build_vae_encode_graph(model, w * d, h * d, pixels.data(), encoding);
        KILN_TRY(g.session->run(model.vae_compute(), g.out));
        return runtime::GraphSession::read(g.out);
    };
    return run_tiled_across_seams(model, image, map, tiling, fn, stats);
}

}  // namespace kiln::pipeline
