#include "models/nets/controlnet.h"

#include "models/nets/unet_encoder.h"
#include "nn/layers.h"

namespace kiln::models {
namespace {

// input_hint_block is an nn.Sequential of eight convolutions with a SiLU
// after each but the last: the convolutions sit at indices 0, 2, ..., 14,
// and the third, fifth and seventh downsample by 2 (ldm's fixed layout; the
// weights cannot tell a stride).
constexpr int kHintConvs = 8;
bool hint_conv_downsamples(int conv) { return conv == 2 || conv == 4 || conv == 6; }
std::string hint_conv_name(int conv) { return "input_hint_block." + std::to_string(2 * conv); }

}  // namespace

struct ControlNet::Blocks {
    UnetEncoder encoder;
    std::vector<nn::Conv2d> hint;        // input_hint_block
    std::vector<nn::Conv2d> zero_convs;  // zero_convs.K.0, one per input block
    nn::Conv2d middle_out;               // middle_block_out.0
};

ControlNet::ControlNet() = default;
ControlNet::~ControlNet() = default;

std::optional<std::string> ControlNet::find_prefix(const io::ModelFile& file) {
    for (const char* prefix : {"control_model.", ""}) {
        if (file.find(std::string(prefix) + "input_hint_block.0.weight")) return std::string(prefix);
    }
    return std::nullopt;
}

Result<std::unique_ptr<ControlNet>> ControlNet::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<ControlNet> net(new ControlNet());
    ControlNetConfig& c = net->config_;
    const std::string where = "ControlNet under '" + prefix + "'";
    for (int k = 0; k < kHintConvs; ++k) {
        const io::TensorInfo* conv = file.find(prefix + hint_conv_name(k) + ".weight");
        if (!conv || conv->shape.size() != 4 || conv->shape[2] != 3 || conv->shape[3] != 3) {
            return Error{"no " + where + ": " + hint_conv_name(k) +
                         ".weight is missing or not a 3x3 convolution (input_hint_block has 8)"};
        }
        if (k == 0) c.hint_channels = conv->shape[1];
        if (k > 0 && conv->shape[1] != c.hint_widths.back()) {
            return Error{where + ": " + hint_conv_name(k) + " takes " + std::to_string(conv->shape[1]) +
                         " channels, the convolution before it gives " + std::to_string(c.hint_widths.back())};
        }
        c.hint_widths.push_back(conv->shape[0]);
    }
    if (!file.find(prefix + "zero_convs.0.0.weight") || !file.find(prefix + "middle_block_out.0.weight"))
        return Error{"no " + where + ": zero_convs.0.0 or middle_block_out.0 missing"};
    KILN_TRY(read_unet_encoder_config(file, prefix, "ControlNet", c.unet));
    if (c.hint_widths.back() != c.unet.model_channels) {
        return Error{where + ": input_hint_block gives " + std::to_string(c.hint_widths.back()) +
                     " channels, input_blocks.0 " + std::to_string(c.unet.model_channels)};
    }
    io::WeightDeclarer& w = weights;
    net->blocks_ = std::make_unique<Blocks>();
    Blocks& b = *net->blocks_;
    b.encoder = declare_unet_encoder(w, c.unet, "ControlNet");
    int64_t in = c.hint_channels;
    for (int k = 0; k < kHintConvs; ++k) {
        b.hint.push_back(
            nn::declare_conv2d(w, hint_conv_name(k), in, c.hint_widths[k], 3, hint_conv_downsamples(k) ? 2 : 1, 1));
        in = c.hint_widths[k];
    }
    for (size_t k = 0; k < b.encoder.block_channels.size(); ++k) {
        const int64_t ch = b.encoder.block_channels[k];
        b.zero_convs.push_back(nn::declare_conv2d(w, "zero_convs." + std::to_string(k) + ".0", ch, ch, 1));
    }
    const int64_t middle = c.unet.level_channels.back();
    b.middle_out = nn::declare_conv2d(w, "middle_block_out.0", middle, middle, 1);
    return net;
}

std::vector<ControlResidualShape> ControlNet::residual_shapes(int64_t latent_w, int64_t latent_h) const {
    const UnetEncoder& e = blocks_->encoder;
    std::vector<ControlResidualShape> shapes{{latent_w, latent_h, e.block_channels.front()}};
    for (size_t k = 0; k < e.input.size(); ++k) {
        ControlResidualShape s = shapes.back();
        if (e.input[k].down) {  // stride 2, padding 1, 3x3: ceil(n / 2)
            s.w = (s.w + 1) / 2;
            s.h = (s.h + 1) / 2;
        }
        s.c = e.block_channels[k + 1];
        shapes.push_back(s);
    }
    shapes.push_back({shapes.back().w, shapes.back().h, config_.unet.level_channels.back()});
    return shapes;
}

Result<ggml_tensor*> ControlNet::build(ggml_context* ctx, const UnetInputs& inputs, ggml_tensor* hint,
                                       const UnetBuildOptions& options) const {
    const ControlNetConfig& c = config_;
    const Blocks& b = *blocks_;
    if (!inputs.x || !hint) return Error{"ControlNet: x and the control image are required"};
    const int64_t B = inputs.x->ne[3];
    const int64_t f = ControlNetConfig::kHintDownscale;
    if (hint->ne[0] != inputs.x->ne[0] * f || hint->ne[1] != inputs.x->ne[1] * f || hint->ne[2] != c.hint_channels ||
        (hint->ne[3] != B && hint->ne[3] != 1)) {
        return Error{"ControlNet: the control image must be ne [" + std::to_string(inputs.x->ne[0] * f) + ", " +
                     std::to_string(inputs.x->ne[1] * f) + ", " + std::to_string(c.hint_channels) +
                     ", batch] (8x the latent)"};
    }
    const nn::ComputeTarget target = options.target;
    ggml_tensor* g = hint;
    for (size_t k = 0; k < b.hint.size(); ++k) {
        g = nn::conv2d(ctx, target, b.hint[k], g);
        if (k + 1 < b.hint.size()) g = ggml_silu(ctx, g);
    }
    // A hint of batch 1 is broadcast over the batch by the add.
    g = nn::mark_cut(g, "input_hint_block");
    auto encoded = build_unet_encoder(ctx, b.encoder, c.unet, inputs, options, g);
    if (!encoded.ok()) return encoded.error();
    // A graph has one output: the residuals flattened and concatenated.
    auto flat = [&](ggml_tensor* t) {
        if (!ggml_is_contiguous(t)) t = ggml_cont(ctx, t);
        return ggml_reshape_1d(ctx, t, ggml_nelements(t));
    };
    ggml_tensor* out = nullptr;
    auto append = [&](ggml_tensor* residual) { out = out ? ggml_concat(ctx, out, flat(residual), 0) : flat(residual); };
    for (size_t k = 0; k < b.zero_convs.size(); ++k)
        append(nn::conv2d(ctx, target, b.zero_convs[k], encoded->blocks[k]));
    append(nn::conv2d(ctx, target, b.middle_out, encoded->middle));
    return out;
}

}  // namespace kiln::models
