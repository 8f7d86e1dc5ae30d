#include "models/nets/vae.h"

#include <cmath>

#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/upsampled_block_cpu.h"

namespace kiln::models {
namespace {

constexpr float kEps = 1e-6f;
// The patches a banded convolution unfolds at once (nn::conv2d's limit).
constexpr int64_t kMaxPatchBytes = 64ll << 20;

struct ResnetBlock {
    nn::Norm norm1, norm2;
    nn::Conv2d conv1, conv2;
    std::optional<nn::Conv2d> shortcut;
};

struct AttnBlock {
    nn::Norm norm;
    nn::Conv2d q, k, v, proj;
};

struct Mid {
    ResnetBlock block1, block2;
    std::optional<AttnBlock> attn;
};

ResnetBlock declare_resnet(io::WeightDeclarer& w, const std::string& p, int64_t in, int64_t out) {
    ResnetBlock r;
    r.norm1 = nn::declare_norm(w, p + "norm1", in);
    r.conv1 = nn::declare_conv2d(w, p + "conv1", in, out, 3, 1, 1);
    r.norm2 = nn::declare_norm(w, p + "norm2", out);
    r.conv2 = nn::declare_conv2d(w, p + "conv2", out, out, 3, 1, 1);
    if (in != out) r.shortcut = nn::declare_conv2d(w, p + "nin_shortcut", in, out, 1);
    return r;
}

Mid declare_mid(io::WeightDeclarer& w, const std::string& p, int64_t ch, bool attention) {
    Mid m;
    m.block1 = declare_resnet(w, p + "mid.block_1.", ch, ch);
    if (attention) {
        AttnBlock a;
        a.norm = nn::declare_norm(w, p + "mid.attn_1.norm", ch);
        a.q = nn::declare_conv2d(w, p + "mid.attn_1.q", ch, ch, 1);
        a.k = nn::declare_conv2d(w, p + "mid.attn_1.k", ch, ch, 1);
        a.v = nn::declare_conv2d(w, p + "mid.attn_1.v", ch, ch, 1);
        a.proj = nn::declare_conv2d(w, p + "mid.attn_1.proj_out", ch, ch, 1);
        m.attn = a;
    }
    m.block2 = declare_resnet(w, p + "mid.block_2.", ch, ch);
    return m;
}

ggml_tensor* apply_resnet(ggml_context* ctx, nn::ComputeTarget target, const ResnetBlock& r, ggml_tensor* x) {
    ggml_tensor* h = nn::conv2d_of_group_norm_silu(ctx, target, r.conv1, r.norm1, x, 32, kEps);
    ggml_tensor* residual = r.shortcut ? nn::conv2d(ctx, target, *r.shortcut, x) : x;
    return nn::conv2d_of_group_norm_silu(ctx, target, r.conv2, r.norm2, h, 32, kEps, kMaxPatchBytes, residual);
}

ggml_tensor* apply_attn(ggml_context* ctx, nn::ComputeTarget target, const AttnBlock& a, ggml_tensor* x) {
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], B = x->ne[3];
    ggml_tensor* h = nn::group_norm(ctx, a.norm, x, 32, kEps);
    auto tokens = [&](ggml_tensor* img) {  // [W, H, C, B] -> [C, W*H, B]
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, img, W * H, C, B), 1, 0, 2, 3));
    };
    ggml_tensor* out =
        nn::attention(ctx, tokens(nn::conv2d(ctx, target, a.q, h)), tokens(nn::conv2d(ctx, target, a.k, h)),
                      tokens(nn::conv2d(ctx, target, a.v, h)), nn::AttentionOptions{1, false, false});
    out = ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_permute(ctx, out, 1, 0, 2, 3)), W, H, C, B);
    return ggml_add(ctx, x, nn::conv2d(ctx, target, a.proj, out));
}

ggml_tensor* apply_mid(ggml_context* ctx, nn::ComputeTarget target, const Mid& m, ggml_tensor* x) {
    x = apply_resnet(ctx, target, m.block1, x);
    if (m.attn) x = apply_attn(ctx, target, *m.attn, x);
    return apply_resnet(ctx, target, m.block2, x);
}

}  // namespace

struct Vae::Blocks {
    // Encoder.
    nn::Conv2d enc_in;
    std::vector<std::vector<ResnetBlock>> down;
    std::vector<std::optional<nn::Conv2d>> downsample;
    Mid enc_mid;
    nn::Norm enc_norm;
    nn::Conv2d enc_out;
    std::optional<nn::Conv2d> quant;  // absent in Flux's autoencoder
    // Decoder.
    std::optional<nn::Conv2d> post_quant;
    nn::Conv2d dec_in;
    Mid dec_mid;
    std::vector<std::vector<ResnetBlock>> up;  // indexed by ldm level (up.0 is the full-resolution level)
    std::vector<std::optional<nn::Conv2d>> upsample;
    nn::Norm dec_norm;
    nn::Conv2d dec_out;
};

Vae::Vae() = default;
Vae::~Vae() = default;

Result<std::unique_ptr<Vae>> Vae::create(io::WeightDeclarer& weights) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<Vae> vae(new Vae());
    VaeConfig& c = vae->config_;
    auto find = [&](const std::string& name) { return file.find(prefix + name); };
    const io::TensorInfo* dec_in = find("decoder.conv_in.weight");
    const io::TensorInfo* dec_out = find("decoder.conv_out.weight");
    if (!dec_in || dec_in->shape.size() != 4 || !dec_out || dec_out->shape.size() != 4) {
        return Error{"no VAE decoder under '" + prefix +
                     "' (decoder.conv_in or decoder.conv_out missing or malformed)"};
    }
    c.latent_channels = dec_in->shape[1];
    c.image_channels = dec_out->shape[0];
    // Levels and their channels from the decoder (always present): up.i.block.0.conv1 out channels.
    for (int level = 0;; ++level) {
        const io::TensorInfo* conv = find("decoder.up." + std::to_string(level) + ".block.0.conv1.weight");
        if (!conv) break;
        c.level_channels.push_back(conv->shape.empty() ? 0 : conv->shape[0]);  // a scalar: refused below
    }
    if (c.level_channels.empty()) return Error{"VAE under '" + prefix + "' has no decoder levels"};
    // A zero size would reach ggml as an empty weight; a 2^levels stride must fit an int.
    bool sizes_positive = c.latent_channels > 0 && c.image_channels > 0;
    for (int64_t ch : c.level_channels) sizes_positive = sizes_positive && ch > 0;
    if (!sizes_positive || c.level_channels.size() > 16) {
        return Error{"VAE under '" + prefix + "': a zero size in its channels, or more than 16 decoder levels"};
    }
    int blocks = 0;
    while (find("decoder.up.0.block." + std::to_string(blocks) + ".conv1.weight")) ++blocks;
    c.res_blocks = blocks - 1;
    if (c.res_blocks < 1) return Error{"VAE under '" + prefix + "': decoder levels need at least 2 resnets"};
    c.has_encoder = find("encoder.conv_in.weight") != nullptr;
    c.encoder_level_channels = c.level_channels;
    for (size_t level = 0; c.has_encoder && level < c.level_channels.size(); ++level) {
        const io::TensorInfo* conv = find("encoder.down." + std::to_string(level) + ".block.0.conv1.weight");
        if (conv && conv->shape.size() == 4 && conv->shape[0] > 0) c.encoder_level_channels[level] = conv->shape[0];
    }
    c.mid_attention = find("decoder.mid.attn_1.q.weight") != nullptr;
    if (find("decoder.post_quant_conv.weight")) {
        c.quant_conv = "encoder.quant_conv";
        c.post_quant_conv = "decoder.post_quant_conv";
    }
    c.quant_convs = find(c.post_quant_conv + ".weight") != nullptr;
    vae->declare(weights);
    vae->format_ = {c.image_channels, c.latent_channels, c.downscale(), c.has_encoder};
    return vae;
}

void Vae::declare(io::WeightDeclarer& w) {
    const VaeConfig& c = config_;
    blocks_ = std::make_unique<Blocks>();
    Blocks& b = *blocks_;
    const int levels = static_cast<int>(c.level_channels.size());
    const int64_t top = c.level_channels.back();
    if (c.has_encoder) {
        const std::vector<int64_t>& widths = c.encoder_level_channels;
        const int64_t enc_top = widths.back();
        b.enc_in = nn::declare_conv2d(w, "encoder.conv_in", c.image_channels, widths[0], 3, 1, 1);
        int64_t ch = widths[0];
        for (int level = 0; level < levels; ++level) {
            std::vector<ResnetBlock> blocks;
            for (int j = 0; j < c.res_blocks; ++j) {
                blocks.push_back(
                    declare_resnet(w, "encoder.down." + std::to_string(level) + ".block." + std::to_string(j) + ".", ch,
                                   widths[level]));
                ch = widths[level];
            }
            b.down.push_back(std::move(blocks));
            if (level + 1 < levels) {
                b.downsample.push_back(nn::declare_conv2d(
                    w, "encoder.down." + std::to_string(level) + ".downsample.conv", ch, ch, 3, 2, 0));
            } else {
                b.downsample.push_back(std::nullopt);
            }
        }
        b.enc_mid = declare_mid(w, "encoder.", enc_top, c.mid_attention);
        b.enc_norm = nn::declare_norm(w, "encoder.norm_out", enc_top);
        b.enc_out = nn::declare_conv2d(w, "encoder.conv_out", enc_top, 2 * c.latent_channels, 3, 1, 1);
        if (c.quant_convs)
            b.quant = nn::declare_conv2d(w, c.quant_conv, 2 * c.latent_channels, 2 * c.latent_channels, 1);
    }
    if (c.quant_convs) b.post_quant = nn::declare_conv2d(w, c.post_quant_conv, c.latent_channels, c.latent_channels, 1);
    b.dec_in = nn::declare_conv2d(w, "decoder.conv_in", c.latent_channels, top, 3, 1, 1);
    b.dec_mid = declare_mid(w, "decoder.", top, c.mid_attention);
    b.up.resize(levels);
    b.upsample.resize(levels);
    int64_t ch = top;
    for (int level = levels - 1; level >= 0; --level) {
        for (int j = 0; j <= c.res_blocks; ++j) {
            b.up[level].push_back(
                declare_resnet(w, "decoder.up." + std::to_string(level) + ".block." + std::to_string(j) + ".", ch,
                               c.level_channels[level]));
            ch = c.level_channels[level];
        }
        if (level > 0)
            b.upsample[level] =
                nn::declare_conv2d(w, "decoder.up." + std::to_string(level) + ".upsample.conv", ch, ch, 3, 1, 1);
    }
    b.dec_norm = nn::declare_norm(w, "decoder.norm_out", ch);
    b.dec_out = nn::declare_conv2d(w, "decoder.conv_out", ch, c.image_channels, 3, 1, 1);
}

ggml_tensor* Vae::build_decoder(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target,
                                int64_t max_whole_upsample_bytes) const {
    const Blocks& b = *blocks_;
    if (b.post_quant) latent = nn::conv2d(ctx, target, *b.post_quant, latent);
    ggml_tensor* h = nn::conv2d(ctx, target, b.dec_in, latent);
    h = nn::mark_cut(apply_mid(ctx, target, b.dec_mid, h), "decoder.mid");
    // An upsampler left for the next level's first block to read in bands
    // (h is then its input, a quarter of its output's pixels).
    const nn::Conv2d* pending_upsample = nullptr;
    for (int level = static_cast<int>(b.up.size()) - 1; level >= 0; --level) {
        for (const ResnetBlock& r : b.up[level]) {
            std::optional<nn::UpsampledBlockStart> start;
            if (pending_upsample) {
                start = nn::upsampled_block_start_cpu(ctx, *pending_upsample, h, r.norm1, 32, kEps, r.conv1,
                                                      *r.shortcut, kMaxPatchBytes);
                if (!start) h = nn::conv2d_of_upsample_2x(ctx, target, *pending_upsample, h);
                pending_upsample = nullptr;
            }
            h = start ? nn::conv2d_of_group_norm_silu(ctx, target, r.conv2, r.norm2, start->h, 32, kEps, kMaxPatchBytes,
                                                      start->residual)
                      : apply_resnet(ctx, target, r, h);
        }
        if (b.upsample[level]) {
            const nn::Conv2d& up = *b.upsample[level];
            const ResnetBlock* next = level > 0 && !b.up[level - 1].empty() ? &b.up[level - 1][0] : nullptr;
            const int64_t up_bytes =
                4 * h->ne[0] * h->ne[1] * up.weight->ne[3] * h->ne[3] * static_cast<int64_t>(sizeof(float));
            if (target == nn::ComputeTarget::Cpu && next && next->shortcut && up_bytes > max_whole_upsample_bytes) {
                pending_upsample = &up;
            } else {
                h = nn::conv2d_of_upsample_2x(ctx, target, up, h);
            }
        }
        h = nn::mark_cut(h, "decoder.up." + std::to_string(level));
    }
    return nn::conv2d_of_group_norm_silu(ctx, target, b.dec_out, b.dec_norm, h, 32, kEps);
}

ggml_tensor* Vae::build_encoder(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target) const {
    ggml_tensor* h = build_encoder_moments(ctx, image, target);
    // Moments: the first latent_channels are the mean.
    const int64_t zc = config_.latent_channels;
    return ggml_cont(ctx, ggml_view_4d(ctx, h, h->ne[0], h->ne[1], zc, h->ne[3], h->nb[1], h->nb[2], h->nb[3], 0));
}

ggml_tensor* Vae::build_encoder_moments(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target) const {
    const Blocks& b = *blocks_;
    ggml_tensor* h = nn::conv2d(ctx, target, b.enc_in, image);
    for (size_t level = 0; level < b.down.size(); ++level) {
        for (const ResnetBlock& r : b.down[level]) h = apply_resnet(ctx, target, r, h);
        if (b.downsample[level]) {
            // ldm pads right and bottom by one, then convolves with stride 2 and no padding.
            h = nn::conv2d(ctx, target, *b.downsample[level], nn::pad_right_and_bottom(ctx, h, target.seams));
        }
        h = nn::mark_cut(h, "encoder.down." + std::to_string(level));
    }
    h = nn::mark_cut(apply_mid(ctx, target, b.enc_mid, h), "encoder.mid");
    h = ggml_silu(ctx, nn::group_norm(ctx, b.enc_norm, h, 32, kEps));
    h = nn::conv2d(ctx, target, b.enc_out, h);
    return b.quant ? nn::conv2d(ctx, target, *b.quant, h) : h;
}

}  // namespace kiln::models
