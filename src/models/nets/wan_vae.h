// Wan 2.1's VAE (Alibaba's Wan team, wan/modules/vae.py): a causal 3D
// autoencoder that Wan 2.1 video models use on clips and Qwen-Image on one
// frame. 8x smaller along each side, 4x along time, 16 latent channels.
// Wan 2.2's (wan/modules/vae2_2.py, TI2V-5B's) is the same machinery 16x
// smaller along each side with 48 channels (WanVaeConfig::wan22). Wan 2.1's:
//
//   encoder:  CausalConv3d(3, dim) - levels of residual blocks, each level
//             but the last ending in a Resample (a stride-2 2-D convolution;
//             with a `time_conv`, a stride-2 temporal one too) - middle
//             (residual, single-head attention over each frame's pixels,
//             residual) - head (RMS norm, SiLU, CausalConv3d to 2 * 16)
//             -> conv1 (1x1x1): mean | log variance
//   decoder:  conv2 (1x1x1) - CausalConv3d(16, top) - middle - levels of
//             residual blocks, each level but the last ending in a Resample
//             (nearest 2x, a 3x3 convolution to half the channels; with a
//             `time_conv`, each frame becomes two first) - head to 3 channels
//
// Residual blocks are RMS norm (F.normalize over channels times sqrt(C) and
// gamma), SiLU, CausalConv3d(3x3x3), twice, plus a 1x1x1 shortcut where
// the widths differ.
//
// Tensor names are the original module tree's, as Wan2.1_VAE.pth and its
// safetensors copies (ComfyUI's wan_2.1_vae.safetensors,
// qwen_image_vae.safetensors) have them, with no prefix: encoder.conv1,
// encoder.downsamples.N.{residual.{0,3}.gamma, residual.{2,6}, shortcut,
// resample.1, time_conv}, encoder.middle.{0,2} (residual) and .1 (norm.gamma,
// to_qkv, proj), encoder.head.{0.gamma, 2}, conv1, conv2, and decoder.* the
// same with upsamples.N. CausalConv3d weights are 5-D, [out, in, kt, kh,
// kw], and are declared with that shape; ggml has four dimensions, so the
// declarer holds them as ne [kw, kh, kt, in * out] (the outer two folded, as
// ggml_conv_3d takes its kernel). Everything is read from the
// weights: the base width `dim` (96) and dim_mult (1, 2, 4, 4) from the
// levels' widths, the residual blocks per level (2; the decoder's levels
// have one more), and which resamples are temporal (the time_conv tensors:
// temperal_downsample (false, true, true)).
//
// Time. A CausalConv3d with a temporal kernel of 3 sees its frame and the
// two before it, zeros before the clip. The original runs a clip in chunks
// through a cache of the last two input frames of each such convolution:
// the decoder one latent frame at a time, the encoder 1, 4, 4, ... frames.
// On a clip's first chunk every temporal Resample skips its time_conv (the
// decoder's marks its cache "Rep", which later reads as zeros), so the first
// latent frame is the first image frame alone and each later latent frame is
// 4 frames: T latent frames are 1 + 4 (T - 1) frames. Here:
//  - decode() and encode() (the AutoencoderNetwork interface) take each
//    batch item as a clip of one frame: every CausalConv3d is then a 2-D
//    convolution with its last temporal kernel slice, and no time_conv runs.
//  - decode_chunk() decodes latent frames continuing a clip, given the
//    causal history the previous chunk left (none at the clip's start), and
//    gives the history this chunk leaves; chunks of any length give the
//    numbers of the whole clip. decode_clip() is one chunk, the whole clip.
//  - encode_clip() encodes a whole clip in one graph; encode_chunk() its
//    first frame, then four frames at a time with the history the chunk
//    before left, as the original's encode loops: the same latent, with
//    memory that stays flat as the clip grows.
// In these graphs the time axis is ne[3] (a clip's batch is 1).
//
// The latent the pipeline sees is normalised per channel, inside encode and
// decode (as models/nets/flux2_vae does with its batch-norm statistics):
// z = (mu - mean) / std, and decode takes z * std + mean, with the published
// statistics (WanVAE's `mean` and `std` in wan/modules/vae.py, 16 values
// each, Qwen-Image's VAE using the same; Wan2_2_VAE's 48 in vae2_2.py; not in
// the weights files). No other scale or shift.
#pragma once

#include <memory>
#include <vector>

#include "io/weight_declarer.h"
#include "models/network.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct WanVaeConfig {
    int64_t dim = 96;                       // encoder.conv1's output channels
    std::vector<int64_t> dim_mult;          // level widths / dim, full resolution first: (1, 2, 4, 4)
    int res_blocks = 2;                     // residual blocks per encoder level (decoder levels: one more)
    std::vector<bool> temporal_downsample;  // per encoder resample: (false, true, true)
    int64_t z_dim = 16;                     // latent channels
    bool has_encoder = true;
    // Wan 2.2's layout (wan/modules/vae2_2.py, the TI2V-5B's VAE): the image
    // patchified 2x2 into 12 channels before the encoder and after the
    // decoder, each level with a parameter-free shortcut from its input
    // (AvgDown3D, DupUp3D), a decoder of its own base width, resamples that
    // keep the width, 48 latent channels.
    bool wan22 = false;
    int patch = 1;
    int64_t dec_dim = 96;  // the decoder's base width (Wan 2.1: dim)
    // Image pixels per latent pixel along each side: patch 2^(levels - 1).
    int downscale() const { return patch << (dim_mult.size() - 1); }
    // Frames per latent frame after the first: 2^(temporal resamples).
    int64_t temporal_downscale() const;
};

class WanVae final : public AutoencoderNetwork {
  public:
    // Error (BadFile) naming what is missing or inconsistent among the
    // tensors the configuration is read from; the other tensors' problems
    // are the declarer's, each naming its tensor.
    static Result<std::unique_ptr<WanVae>> create(io::WeightDeclarer& weights);
    ~WanVae() override;
    const WanVaeConfig& config() const { return config_; }

    // AutoencoderNetwork, each batch item a one-frame clip: the normalised
    // latent ne [w, h, 16, B] <-> image ne [W, H, 3, B] in [-1, 1].
    const AutoencoderFormat& format() const override { return format_; }
    ggml_tensor* decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const override;

    // On the CPU, the F32 patches a convolution unfolds at once (as
    // nn::conv2d's), and the input size past which a residual block's or
    // the head's "RMS norm, SiLU, convolution" goes a band of rows at a
    // time, the normalised input never made whole, and an upsampler's
    // nearest 2x is folded into its convolution's unfold. The graph's
    // compute memory at 1024x1024 is then under 1.5 GiB (8 MiB blocks of
    // attention scores too): what is held is a level's activations and one
    // band's work.
    static constexpr int64_t kMaxPatchBytes = 64ll << 20;
    // decode() with another band size: the same numbers for any (tests make
    // it small so that a tiny image goes through the bands).
    ggml_tensor* decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target,
                        int64_t max_patch_bytes) const;
    // Moments: the normalised mean, then the log variance less log std^2
    // (the same Gaussian seen through the normalisation).
    ggml_tensor* encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                        LatentEncoding encoding) const override;

    // Clips, time along ne[3]. latent: ne [w, h, 16, T], T consecutive
    // normalised latent frames of one clip; `history`: the previous chunk's
    // ClipChunk::history (as inputs of those shapes), or empty when this
    // chunk starts the clip. Its frames: 1 + 4 (T - 1) at the clip's start,
    // else 4 T (temporal_downscale() for 4). All null when `history` is not
    // a chunk's history for latents of this size.
    // On the CPU its convolutions over a large chunk's frames go a band of
    // rows at a time, as decode()'s do (kMaxPatchBytes; the overload takes
    // another band size: the same numbers for any).
    ClipChunk decode_chunk(ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history,
                           nn::ComputeTarget target) const override;
    ClipChunk decode_chunk(ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history,
                           nn::ComputeTarget target, int64_t max_patch_bytes) const;
    ggml_tensor* decode_clip(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const {
        return decode_chunk(ctx, latent, {}, target).frames;
    }
    // video: ne [W, H, 3, 1 + 4 k] -> ne [w, h, 16 (x2 for Moments), 1 + k];
    // later frames that do not fill a group of 4 are left out, as the
    // original's chunking leaves them.
    ggml_tensor* encode_clip(ggml_context* ctx, ggml_tensor* video, nn::ComputeTarget target,
                             LatentEncoding encoding) const override;
    ClipChunk encode_chunk(ggml_context* ctx, ggml_tensor* video, const std::vector<ggml_tensor*>& history,
                           nn::ComputeTarget target, LatentEncoding encoding) const override;

  private:
    struct Blocks;
    WanVae();
    Status read_config(const io::WeightDeclarer& weights);
    Status read_wan22_config(const io::WeightDeclarer& weights);
    void declare(io::WeightDeclarer& w);
    void declare_wan22(io::WeightDeclarer& w);
    // `clip` false: each batch item a one-frame clip. The decoder's history
    // as decode_chunk's; null when `history_in` does not fit.
    ggml_tensor* build_decoder(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target, bool clip,
                               const std::vector<ggml_tensor*>& history_in, std::vector<ggml_tensor*>* history_out,
                               int64_t max_patch_bytes = kMaxPatchBytes) const;
    // A clip's chunk continues from `history_in` (empty: the clip's start)
    // and leaves its history in `history_out`; null when the history does not fit.
    ggml_tensor* build_encoder(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target, bool clip,
                               LatentEncoding encoding, const std::vector<ggml_tensor*>& history_in,
                               std::vector<ggml_tensor*>* history_out) const;

    WanVaeConfig config_;
    AutoencoderFormat format_;
    std::unique_ptr<Blocks> blocks_;
};

}  // namespace kiln::models
