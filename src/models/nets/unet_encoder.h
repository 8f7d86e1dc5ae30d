// The encoder half of ldm's UNetModel: the time (and label) embedding,
// input_blocks and middle_block, and the blocks they are made of (resnets,
// spatial transformers). The UNet (models/nets/unet) adds its decoder half to it;
// the ControlNet (models/nets/controlnet) is this half plus its hint block and
// zero convolutions, so both read, declare and build it from here.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/model_file.h"
#include "io/weight_declarer.h"
#include "models/nets/unet.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

struct UnetResBlock {
    nn::Norm in_norm, out_norm;
    nn::Conv2d in_conv, out_conv;
    nn::Linear emb;
    std::optional<nn::Conv2d> skip;
};

struct UnetTransformerBlock {
    nn::Norm norm1, norm2, norm3;
    nn::Linear q1, k1, v1, out1;  // self-attention
    nn::Linear q2, k2, v2, out2;  // cross-attention over the context
    nn::Linear ff_in, ff_out;     // GEGLU feed-forward
};

struct UnetSpatialTransformer {
    nn::Norm norm;
    nn::Conv2d proj_in_conv, proj_out_conv;      // SD1
    nn::Linear proj_in_linear, proj_out_linear;  // SD2, SDXL
    std::vector<UnetTransformerBlock> blocks;
    int heads = 1;
};

// One entry of input_blocks / output_blocks: a resnet, optionally a
// transformer, optionally a down- or upsampling convolution.
struct UnetBlock {
    std::optional<UnetResBlock> res;
    std::optional<UnetSpatialTransformer> attn;
    std::optional<nn::Conv2d> down;
    std::optional<nn::Conv2d> up;
};

UnetResBlock declare_unet_res(io::WeightDeclarer& w, const std::string& p, int64_t in, int64_t out, int64_t emb_dim);
UnetSpatialTransformer declare_unet_transformer(io::WeightDeclarer& w, const std::string& p, int64_t ch,
                                                const UnetConfig& c, int depth);
ggml_tensor* apply_unet_res(ggml_context* ctx, nn::ComputeTarget target, const UnetResBlock& r, ggml_tensor* x,
                            ggml_tensor* emb);
ggml_tensor* apply_unet_transformer(ggml_context* ctx, const UnetSpatialTransformer& t, ggml_tensor* x,
                                    ggml_tensor* context, const UnetConfig& c, nn::AttentionOptions attn);

// Reads the encoder half's shape from the tensors under `prefix` into `c`:
// model and input channels, time embedding width, channels and resnets per
// level, transformer depths of input_blocks and the middle block, context
// width, projections, label_emb's width and the heads (with the metadata
// overrides of models/nets/unet.h). `what` ("UNet", "ControlNet") names the
// network in errors.
Status read_unet_encoder_config(const io::ModelFile& file, const std::string& prefix, const std::string& what,
                                UnetConfig& c);
// Transformer depth under `p` ("input_blocks.4.1."), 0 when there is none;
// sets c.linear_projection and c.context_dim from what it finds.
Result<int> read_unet_transformer_depth(const io::ModelFile& file, const std::string& prefix, const std::string& p,
                                        const std::string& what, UnetConfig& c);

// The encoder half's weights.
struct UnetEncoder {
    std::string what;  // "UNet", "ControlNet": errors
    nn::Linear time1, time2;
    nn::Linear label1, label2;  // label_emb.0.0 / .0.2, when the network takes y
    nn::Conv2d conv_in;
    std::vector<UnetBlock> input;  // input_blocks.1..
    UnetBlock mid_res1, mid_res2;
    std::optional<UnetSpatialTransformer> mid_attn;
    // Channels of input_blocks.0.. outputs (the decoder's skips, the
    // ControlNet's zero convolutions).
    std::vector<int64_t> block_channels;
};
UnetEncoder declare_unet_encoder(io::WeightDeclarer& w, const UnetConfig& c, const std::string& what);

struct UnetEncoderOutputs {
    ggml_tensor* emb = nullptr;        // ne [time_embed_dim, B or 1]
    std::vector<ggml_tensor*> blocks;  // outputs of input_blocks.0.., ne [W, H, C, B] each
    ggml_tensor* middle = nullptr;     // middle_block's output
    nn::AttentionOptions attn;         // the attention options the blocks used
};
// Builds the encoder half with cut markers "input_blocks.K" and
// "middle_block". `hint` (ne of input_blocks.0's output; null: none) is added
// to input_blocks.0's output before the next block reads it (ControlNet's
// guided hint). An error (nothing built) when the inputs do not fit the
// network (see Unet::build).
Result<UnetEncoderOutputs> build_unet_encoder(ggml_context* ctx, const UnetEncoder& e, const UnetConfig& c,
                                              const UnetInputs& inputs, const UnetBuildOptions& options,
                                              ggml_tensor* hint);

}  // namespace kiln::models
