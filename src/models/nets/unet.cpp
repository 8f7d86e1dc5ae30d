#include "models/nets/unet.h"

#include "models/nets/controlnet.h"
#include "models/nets/unet_encoder.h"
#include "nn/layers.h"

namespace kiln::models {

struct Unet::Blocks {
    UnetEncoder encoder;            // time embedding, input_blocks, middle_block
    std::vector<UnetBlock> output;  // output_blocks.0..
    nn::Norm out_norm;
    nn::Conv2d conv_out;
};

Unet::Unet() = default;
Unet::~Unet() = default;

Result<std::unique_ptr<Unet>> Unet::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<Unet> unet(new Unet());
    UnetConfig& c = unet->config_;
    const io::TensorInfo* conv_out = file.find(prefix + "out.2.weight");
    if (!conv_out || conv_out->shape.size() != 4 || !file.find(prefix + "input_blocks.0.0.weight") ||
        !file.find(prefix + "time_embed.0.weight")) {
        return Error{"no SD UNet under '" + prefix +
                     "' (input_blocks.0.0, out.2 or time_embed.0 missing or malformed)"};
    }
    KILN_TRY(read_unet_encoder_config(file, prefix, "UNet", c));
    c.out_channels = conv_out->shape[0];
    if (c.out_channels <= 0) return Error{"UNet under '" + prefix + "': out.2.weight has zero output channels"};
    const size_t outputs = c.level_channels.size() * static_cast<size_t>(c.res_blocks + 1);
    for (size_t k = 0; k < outputs; ++k) {
        auto depth = read_unet_transformer_depth(file, prefix, "output_blocks." + std::to_string(k) + ".1.", "UNet", c);
        if (!depth.ok()) return depth.error();
        c.output_depth.push_back(*depth);
    }

    const bool inpainting = c.in_channels == 2 * c.out_channels + 1;
    if (c.in_channels != c.out_channels && !inpainting) {
        // instruct-pix2pix's 8 (latent and the image's latent) among them.
        return Error::bad_file("UNet under '" + prefix + "': it takes " + std::to_string(c.in_channels) +
                               " input channels for " + std::to_string(c.out_channels) +
                               " latent channels; kiln runs plain UNets and inpainting ones (" +
                               std::to_string(2 * c.out_channels + 1) + "), not instruct-pix2pix (" +
                               std::to_string(2 * c.out_channels) + ")");
    }
    KILN_TRY(unet->declare(weights));
    DiffusionCapabilities& can = unet->capabilities_;
    can.label = "UNet";
    can.in_channels = c.in_channels;
    can.out_channels = c.out_channels;
    if (inpainting) can.concat = LatentConcat::MaskThenMaskedImage;
    can.context_width = c.context_dim;
    can.vector_width = c.adm_in_channels;
    can.size_stride = 1 << (c.level_channels.size() - 1);
    can.control_residuals = true;
    can.seams = true;
    return unet;
}

Status Unet::declare(io::WeightDeclarer& w) {
    const UnetConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    b.encoder = declare_unet_encoder(w, c, "UNet");

    const int levels = static_cast<int>(c.level_channels.size());
    std::vector<int64_t> skip_channels = b.encoder.block_channels;
    int64_t ch = c.level_channels.back();
    int k = 0;
    for (int level = levels - 1; level >= 0; --level) {
        for (int r = 0; r <= c.res_blocks; ++r, ++k) {
            const std::string p = "output_blocks." + std::to_string(k) + ".";
            UnetBlock block;
            const int64_t skip = skip_channels.back();
            skip_channels.pop_back();
            block.res = declare_unet_res(w, p + "0.", ch + skip, c.level_channels[level], c.time_embed_dim);
            ch = c.level_channels[level];
            int index = 1;
            if (const int depth = c.output_depth[k])
                block.attn = declare_unet_transformer(w, p + std::to_string(index++) + ".", ch, c, depth);
            if (level > 0 && r == c.res_blocks) {
                block.up = nn::declare_conv2d(w, p + std::to_string(index) + ".conv", ch, ch, 3, 1, 1);
            }
            b.output.push_back(std::move(block));
        }
    }
    b.out_norm = nn::declare_norm(w, "out.0", ch);
    b.conv_out = nn::declare_conv2d(w, "out.2", ch, c.out_channels, 3, 1, 1);
    return Status::Ok();
}

ggml_tensor* Unet::build(ggml_context* ctx, ggml_tensor* x, ggml_tensor* timesteps, ggml_tensor* context,
                         bool flash_attention) const {
    UnetBuildOptions options;
    options.flash_attention = flash_attention;
    UnetInputs inputs;
    inputs.x = x;
    inputs.timesteps = timesteps;
    inputs.context = context;
    auto out = build(ctx, inputs, options);
    return out.ok() ? *out : nullptr;
}

Result<ggml_tensor*> Unet::build(ggml_context* ctx, const UnetInputs& inputs, const UnetBuildOptions& options) const {
    const UnetConfig& c = config_;
    const Blocks& b = *blocks_;
    auto encoded = build_unet_encoder(ctx, b.encoder, c, inputs, options, nullptr);
    if (!encoded.ok()) return encoded.error();
    std::vector<ggml_tensor*>& skips = encoded->blocks;
    const std::vector<ggml_tensor*>& control = inputs.control;
    if (!control.empty()) {
        if (control.size() != skips.size() + 1) {
            return Error{"UNet: " + std::to_string(control.size()) + " control residuals, the network takes " +
                         std::to_string(skips.size() + 1)};
        }
        for (size_t i = 0; i < control.size(); ++i) {
            const ggml_tensor* like = i < skips.size() ? skips[i] : encoded->middle;
            if (!control[i] || !ggml_are_same_shape(control[i], like)) {
                return Error{"UNet: control residual " + std::to_string(i) + " does not have the shape of " +
                             (i < skips.size() ? "input_blocks." + std::to_string(i) : std::string("middle_block")) +
                             "'s output"};
            }
        }
    }
    // ldm's ControlledUnetModel: h += control.pop() after the middle block,
    // then every skip the decoder reads is hs.pop() + control.pop().
    auto controlled = [&](ggml_tensor* h, size_t i) {
        return control.empty() ? h : ggml_add(ctx, h, ggml_scale(ctx, control[i], inputs.control_strength));
    };
    const nn::ComputeTarget target = options.target;
    ggml_tensor* emb = encoded->emb;
    ggml_tensor* h = controlled(encoded->middle, skips.size());
    for (size_t i = 0; i < b.output.size(); ++i) {
        const UnetBlock& block = b.output[i];
        h = ggml_concat(ctx, h, controlled(skips.back(), skips.size() - 1), 2);
        skips.pop_back();
        h = apply_unet_res(ctx, target, *block.res, h, emb);
        if (block.attn) h = apply_unet_transformer(ctx, *block.attn, h, inputs.context, c, encoded->attn);
        if (block.up) h = nn::conv2d(ctx, target, *block.up, nn::upsample_nearest_2x(ctx, h));
        h = nn::mark_cut(h, "output_blocks." + std::to_string(i));
    }
    h = ggml_silu(ctx, nn::group_norm(ctx, b.out_norm, h));
    return nn::conv2d(ctx, target, b.conv_out, h);
}

// The UNet's inputs must be what the family's text encoders and VAE make.
Status Unet::check_conditioning(const ConditioningShape& shape) const {
    const UnetConfig& uc = config_;
    int64_t context = 0;
    for (const EncoderOutput& e : shape.encoders) context += e.width;
    if (context != uc.context_dim) {
        return Error::bad_file("the text encoders' width " + std::to_string(context) +
                               " does not match the UNet's context width " + std::to_string(uc.context_dim));
    }
    // The UNet's vector input must be what the family's conditioning makes.
    const int64_t adm = uc.adm_in_channels;
    if (shape.size_embedding) {
        int64_t pooled = 0;
        for (const EncoderOutput& e : shape.encoders) {
            if (e.pooled) pooled = e.pooled_width;
        }
        if (adm <= pooled || (adm - pooled) % 6 != 0) {
            return Error::bad_file("the UNet's label_emb takes " + std::to_string(adm) +
                                   " values, not the pooled width " + std::to_string(pooled) +
                                   " plus six size embeddings of equal width");
        }
    } else if (adm > 0) {
        return Error::bad_file("the UNet takes a " + std::to_string(adm) + "-wide label_emb vector, which " +
                               shape.family + " does not make");
    }
    if (shape.latent_channels != uc.out_channels) {
        return Error::bad_file("the VAE's latent channels (" + std::to_string(shape.latent_channels) +
                               ") do not match the UNet's output channels (" + std::to_string(uc.out_channels) + ")");
    }
    return Status::Ok();
}

Status Unet::check_control_net(const ControlNet& net, const std::string& family_label) const {
    const UnetConfig& cc = net.config().unet;
    const UnetConfig& uc = config_;
    auto family_of = [](int64_t context) -> std::string {
        if (context == 768) return "SD1.x";
        if (context == 1024) return "SD2.x";
        if (context == 2048) return "SDXL";
        return "context width " + std::to_string(context);
    };
    if (cc.context_dim != uc.context_dim) {
        return Error::bad_file("a ControlNet for " + family_of(cc.context_dim) + " (context width " +
                               std::to_string(cc.context_dim) + "), the model is " + family_label +
                               " (its UNet's context width is " + std::to_string(uc.context_dim) + ")");
    }
    if (cc.model_channels != uc.model_channels || cc.level_channels != uc.level_channels ||
        cc.res_blocks != uc.res_blocks || cc.adm_in_channels != uc.adm_in_channels) {
        return Error::bad_file("its blocks do not match the " + family_label +
                               " UNet's (channels per level, resnets per level or label_emb width differ)");
    }
    if (cc.in_channels != uc.out_channels) {
        return Error::bad_file("it takes " + std::to_string(cc.in_channels) + " latent channels, the UNet makes " +
                               std::to_string(uc.out_channels));
    }
    return Status::Ok();
}

Result<DiffusionTensors> Unet::build(nn::GraphInputs& s, const DiffusionShape& shape) const {
    const UnetConfig& uc = config_;
    DiffusionTensors g;
    const int64_t b = shape.batch;
    UnetInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, uc.in_channels, b}, nullptr, "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, nullptr, "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {uc.context_dim, shape.tokens, b}, nullptr, "context");
    if (uc.adm_in_channels > 0) in.y = g.y = s.input(GGML_TYPE_F32, {uc.adm_in_channels, b}, nullptr, "y");
    for (const auto& [w, h, c] : shape.control) {
        g.control.push_back(
            s.input(GGML_TYPE_F32, {w, h, c, b}, nullptr, ("control" + std::to_string(g.control.size())).c_str()));
    }
    in.control = g.control;
    in.control_strength = shape.control_strength;
    UnetBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = shape.target;
    // The request was validated and the inputs are shaped from the UNet's
    // own config, so the contract holds; a failure here is a bug.
    auto out = build(s.ctx(), in, options);
    if (!out.ok()) return Error{"UNet graph: " + out.error().message};
    g.out = *out;
    return g;
}

std::optional<io::UnetLayout> Unet::unet_layout() const {
    const UnetConfig& c = config_;
    io::UnetLayout layout;
    layout.levels = static_cast<int>(c.level_channels.size());
    layout.layers_per_block = c.res_blocks;
    layout.attention_levels = 0;
    for (int level = 0; level < layout.levels; ++level) {
        const size_t first = static_cast<size_t>(level * (c.res_blocks + 1));
        if (first < c.input_depth.size() && c.input_depth[first] > 0) layout.attention_levels |= 1u << level;
    }
    return layout;
}

}  // namespace kiln::models
