// ESRGAN's RRDBNet, the network of ESRGAN and Real-ESRGAN upscalers
// (x1, x2, x4, x8), configured from its weights:
//
//     feat = conv_first(pixel_unshuffle(image, r))      (r = 1: no unshuffle)
//     feat = feat + conv_body(RRDB_1(...RRDB_blocks(feat)))
//     per upsampler: feat = lrelu(conv_up(nearest_2x(feat)))
//     out  = conv_last(lrelu(conv_hr(feat)))
//
// An RRDB is three residual dense blocks (five 3x3 convolutions over the
// concatenation of the block's input and every earlier output, leaky ReLU
// 0.2, residual scale 0.2), scaled by 0.2 around its own residual. The
// scale is 2^upsamplers / r: Real-ESRGAN's x2 and x1 networks keep BasicSR's
// two upsamplers and pixel-unshuffle the input by 2 or 4 (conv_first then
// takes 12 or 48 channels).
//
// Two namings are read, found from the tensors:
// - ESRGAN's original checkpoints: model.0 (conv_first), model.1.sub.N.RDBk.convj.0,
//   model.1.sub.<blocks> (conv_body), model.3, model.6, ... (one per upsampler),
//   model.<3u+2> (conv_hr), model.<3u+4> (conv_last);
// - BasicSR's (Real-ESRGAN): conv_first, body.N.rdbk.convj, conv_body,
//   conv_up1, conv_up2, conv_hr, conv_last, at the top level or under
//   "params_ema." / "params." (how Real-ESRGAN's .pth files nest them).
// Width, growth channels, block count and upsamplers come from the shapes
// and names; a file that fits neither naming, or whose tensors disagree, is
// a BadFile error naming the missing or malformed tensor.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

enum class RrdbNaming { Esrgan, BasicSr };

struct RrdbNetConfig {
    RrdbNaming naming = RrdbNaming::BasicSr;
    std::string prefix;          // "", "params_ema." or "params."
    int64_t image_channels = 3;  // conv_last's outputs; the input has as many
    int64_t features = 64;       // nf: conv_first's outputs
    int64_t growth = 32;         // gc: each dense convolution's outputs
    int blocks = 23;             // RRDBs
    int upsamplers = 2;          // nearest 2x + conv each
    int unshuffle = 1;           // r: pixel unshuffle of the input (1, 2 or 4)
    // Output pixels per input pixel along each side.
    int scale() const { return (1 << upsamplers) / unshuffle; }
};

class RrdbNet {
  public:
    // Reads the configuration from `file` and declares the weights (loaded
    // by weights().load()). Errors are BadFile and name the tensor.
    static Result<std::unique_ptr<RrdbNet>> create(io::WeightDeclarer& weights);
    ~RrdbNet();
    const RrdbNetConfig& config() const { return config_; }

    // image: ne [W, H, image_channels, 1], values in [0, 1] (ESRGAN's
    // range), W and H multiples of config().unshuffle -> ne [W * scale,
    // H * scale, image_channels, 1], unclamped. Cut markers after each RRDB.
    ggml_tensor* build(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target = nn::ComputeTarget::Cpu) const;

  private:
    struct Layers;
    RrdbNet();

    RrdbNetConfig config_;
    std::unique_ptr<Layers> layers_;
};

}  // namespace kiln::models
