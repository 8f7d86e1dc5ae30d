#include "models/nets/unet_encoder.h"

namespace kiln::models {

UnetResBlock declare_unet_res(io::WeightDeclarer& w, const std::string& p, int64_t in, int64_t out, int64_t emb_dim) {
    UnetResBlock r;
    r.in_norm = nn::declare_norm(w, p + "in_layers.0", in);
    r.in_conv = nn::declare_conv2d(w, p + "in_layers.2", in, out, 3, 1, 1);
    r.emb = nn::declare_linear(w, p + "emb_layers.1", emb_dim, out);
    r.out_norm = nn::declare_norm(w, p + "out_layers.0", out);
    r.out_conv = nn::declare_conv2d(w, p + "out_layers.3", out, out, 3, 1, 1);
    if (in != out) r.skip = nn::declare_conv2d(w, p + "skip_connection", in, out, 1);
    return r;
}

UnetSpatialTransformer declare_unet_transformer(io::WeightDeclarer& w, const std::string& p, int64_t ch,
                                                const UnetConfig& c, int depth) {
    UnetSpatialTransformer t;
    t.heads = static_cast<int>(c.heads_at(ch));
    t.norm = nn::declare_norm(w, p + "norm", ch);
    if (c.linear_projection) {
        t.proj_in_linear = nn::declare_linear(w, p + "proj_in", ch, ch);
        t.proj_out_linear = nn::declare_linear(w, p + "proj_out", ch, ch);
    } else {
        t.proj_in_conv = nn::declare_conv2d(w, p + "proj_in", ch, ch, 1);
        t.proj_out_conv = nn::declare_conv2d(w, p + "proj_out", ch, ch, 1);
    }
    for (int d = 0; d < depth; ++d) {
        const std::string b = p + "transformer_blocks." + std::to_string(d) + ".";
        UnetTransformerBlock tb;
        tb.norm1 = nn::declare_norm(w, b + "norm1", ch);
        tb.norm2 = nn::declare_norm(w, b + "norm2", ch);
        tb.norm3 = nn::declare_norm(w, b + "norm3", ch);
        tb.q1 = nn::declare_linear(w, b + "attn1.to_q", ch, ch, false);
        tb.k1 = nn::declare_linear(w, b + "attn1.to_k", ch, ch, false);
        tb.v1 = nn::declare_linear(w, b + "attn1.to_v", ch, ch, false);
        tb.out1 = nn::declare_linear(w, b + "attn1.to_out.0", ch, ch);
        tb.q2 = nn::declare_linear(w, b + "attn2.to_q", ch, ch, false);
        tb.k2 = nn::declare_linear(w, b + "attn2.to_k", c.context_dim, ch, false);
        tb.v2 = nn::declare_linear(w, b + "attn2.to_v", c.context_dim, ch, false);
        tb.out2 = nn::declare_linear(w, b + "attn2.to_out.0", ch, ch);
        tb.ff_in = nn::declare_linear(w, b + "ff.net.0.proj", ch, ch * 8);
        tb.ff_out = nn::declare_linear(w, b + "ff.net.2", ch * 4, ch);
        t.blocks.push_back(tb);
    }
    return t;
}

ggml_tensor* apply_unet_res(ggml_context* ctx, nn::ComputeTarget target, const UnetResBlock& r, ggml_tensor* x,
                            ggml_tensor* emb) {
    ggml_tensor* h = nn::conv2d(ctx, target, r.in_conv, ggml_silu(ctx, nn::group_norm(ctx, r.in_norm, x)));
    ggml_tensor* e = nn::linear(ctx, r.emb, ggml_silu(ctx, emb));  // [out, B]
    h = ggml_add(ctx, h, ggml_reshape_4d(ctx, e, 1, 1, e->ne[0], e->ne[1]));
    h = nn::conv2d(ctx, target, r.out_conv, ggml_silu(ctx, nn::group_norm(ctx, r.out_norm, h)));
    return ggml_add(ctx, r.skip ? nn::conv2d(ctx, target, *r.skip, x) : x, h);
}

ggml_tensor* apply_unet_transformer(ggml_context* ctx, const UnetSpatialTransformer& t, ggml_tensor* x,
                                    ggml_tensor* context, const UnetConfig& c, nn::AttentionOptions attn) {
    attn.heads = t.heads;
    const int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], B = x->ne[3];
    ggml_tensor* h = nn::group_norm(ctx, t.norm, x, 32, 1e-6f);
    auto to_tokens = [&](ggml_tensor* img) {  // [W, H, C, B] -> [C, W*H, B]
        return ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, img, W * H, C, B), 1, 0, 2, 3));
    };
    auto to_image = [&](ggml_tensor* tokens) {  // [C, W*H, B] -> [W, H, C, B]
        return ggml_reshape_4d(ctx, ggml_cont(ctx, ggml_permute(ctx, tokens, 1, 0, 2, 3)), W, H, C, B);
    };
    // SD1's 1x1 convolutions project the tokens as linear layers: the image
    // is transposed to tokens once and back once, not twice more around each
    // convolution's product.
    auto projection = [&](const nn::Linear& linear, const nn::Conv2d& conv) {
        return c.linear_projection ? linear : nn::conv1x1_as_linear(ctx, conv);
    };
    h = nn::linear(ctx, projection(t.proj_in_linear, t.proj_in_conv), to_tokens(h));
    for (const UnetTransformerBlock& b : t.blocks) {
        ggml_tensor* n = nn::layer_norm(ctx, b.norm1, h);
        h = ggml_add(ctx, h,
                     nn::linear(ctx, b.out1,
                                nn::attention(ctx, nn::linear(ctx, b.q1, n), nn::linear(ctx, b.k1, n),
                                              nn::linear(ctx, b.v1, n), attn)));
        n = nn::layer_norm(ctx, b.norm2, h);
        h = ggml_add(ctx, h,
                     nn::linear(ctx, b.out2,
                                nn::attention(ctx, nn::linear(ctx, b.q2, n), nn::linear(ctx, b.k2, context),
                                              nn::linear(ctx, b.v2, context), attn)));
        n = nn::layer_norm(ctx, b.norm3, h);
        // GEGLU: [8C, T, B] is the value half, then the gate half; one fused
        // op computes value * gelu(gate) without copying either half out.
        ggml_tensor* ff = ggml_geglu_erf_swapped(ctx, nn::linear(ctx, b.ff_in, n));
        h = ggml_add(ctx, h, nn::linear(ctx, b.ff_out, ff));
    }
    h = to_image(nn::linear(ctx, projection(t.proj_out_linear, t.proj_out_conv), h));
    return ggml_add(ctx, h, x);
}

Result<int> read_unet_transformer_depth(const io::ModelFile& file, const std::string& prefix, const std::string& p,
                                        const std::string& what, UnetConfig& c) {
    const io::TensorInfo* proj = file.find(prefix + p + "proj_in.weight");
    if (!proj) return 0;
    c.linear_projection = proj->shape.size() == 2;
    // Checked here, not with the other sizes: the output blocks are read
    // after those checks, and a zero width would reach ggml.
    if (const io::TensorInfo* k2 = file.find(prefix + p + "transformer_blocks.0.attn2.to_k.weight")) {
        if (k2->shape.size() != 2 || k2->shape[1] <= 0) {
            return Error{what + " under '" + prefix + "': " + p +
                         "transformer_blocks.0.attn2.to_k.weight is not a matrix with a context width"};
        }
        c.context_dim = k2->shape[1];
    }
    int depth = 0;
    while (file.find(prefix + p + "transformer_blocks." + std::to_string(depth) + ".norm1.weight")) ++depth;
    if (depth == 0) return Error{what + " under '" + prefix + "': " + p + " has no transformer_blocks"};
    return depth;
}

Status read_unet_encoder_config(const io::ModelFile& file, const std::string& prefix, const std::string& what,
                                UnetConfig& c) {
    auto find = [&](const std::string& name) { return file.find(prefix + name); };
    const io::TensorInfo* conv_in = find("input_blocks.0.0.weight");
    const io::TensorInfo* time1 = find("time_embed.0.weight");
    if (!conv_in || conv_in->shape.size() != 4 || !time1 || time1->shape.size() != 2) {
        return Error{"no " + what + " under '" + prefix + "' (input_blocks.0.0 or time_embed.0 missing or malformed)"};
    }
    c.model_channels = conv_in->shape[0];
    c.in_channels = conv_in->shape[1];
    c.time_embed_dim = time1->shape[0];

    // Walk input_blocks: resnets give each level's channels, "op" convs end a level.
    std::vector<int> res_per_level(1, 0);
    c.level_channels.assign(1, c.model_channels);
    c.input_depth.clear();
    for (int k = 1;; ++k) {
        const std::string p = "input_blocks." + std::to_string(k) + ".";
        if (find(p + "0.op.weight")) {
            res_per_level.push_back(0);
            c.level_channels.push_back(c.level_channels.back());
            c.input_depth.push_back(0);
            continue;
        }
        const io::TensorInfo* res = find(p + "0.in_layers.2.weight");
        if (!res) break;
        c.level_channels.back() = res->shape.empty() ? 0 : res->shape[0];  // refused below as a zero size
        ++res_per_level.back();
        auto depth = read_unet_transformer_depth(file, prefix, p + "1.", what, c);
        if (!depth.ok()) return depth.error();
        c.input_depth.push_back(*depth);
    }
    c.res_blocks = res_per_level.front();
    for (int r : res_per_level) {
        if (r != c.res_blocks || r == 0)
            return Error{what + " under '" + prefix + "': levels have different numbers of resnets"};
    }
    auto middle = read_unet_transformer_depth(file, prefix, "middle_block.1.", what, c);
    if (!middle.ok()) return middle.error();
    c.middle_depth = *middle;
    if (const io::TensorInfo* label = find("label_emb.0.0.weight")) {
        if (label->shape.size() != 2)
            return Error{what + " under '" + prefix + "': label_emb.0.0.weight is not a matrix"};
        c.adm_in_channels = label->shape[1];
    }

    // Head counts a file may fix (small test models); present means valid.
    for (const char* key : {"kiln.unet.heads", "kiln.unet.head_channels"}) {
        if (file.metadata().count(key) == 0) continue;
        const double v = file.metadata_number(key, -1);
        if (!(v >= 1 && v <= 4096) || v != static_cast<double>(static_cast<int64_t>(v))) {
            return Error{std::string("metadata ") + key + " is " + file.metadata().at(key).to_string() +
                         ", expected an integer in [1, 4096]"};
        }
    }
    const double fixed_heads = file.metadata_number("kiln.unet.heads", 0);
    const double fixed_head_channels = file.metadata_number("kiln.unet.head_channels", 0);
    if (fixed_heads > 0) {
        c.heads = static_cast<int64_t>(fixed_heads);
    } else if (fixed_head_channels > 0) {
        c.head_channels = static_cast<int64_t>(fixed_head_channels);
    } else if (c.context_dim == 768) {
        c.heads = 8;
    } else {
        // ldm's SD2 and sgm's SDXL configs: num_head_channels 64.
        c.head_channels = 64;
    }
    // A zero size would reach ggml as an empty weight (or a division by zero).
    bool sizes_positive = c.model_channels > 0 && c.in_channels > 0 && c.time_embed_dim > 0 && c.context_dim > 0 &&
                          c.adm_in_channels >= 0;
    for (int64_t ch : c.level_channels) sizes_positive = sizes_positive && ch > 0;
    if (!sizes_positive) {
        return Error{what + " under '" + prefix + "': a zero size in its channels, time embedding or context width"};
    }
    for (int64_t ch : c.level_channels) {
        const int64_t heads = c.heads_at(ch);
        if (heads <= 0 || ch % heads != 0)
            return Error{what + " under '" + prefix + "': " + std::to_string(ch) +
                         " channels do not split into attention heads"};
    }
    return Status::Ok();
}

UnetEncoder declare_unet_encoder(io::WeightDeclarer& w, const UnetConfig& c, const std::string& what) {
    UnetEncoder e;
    e.what = what;
    e.time1 = nn::declare_linear(w, "time_embed.0", c.model_channels, c.time_embed_dim);
    e.time2 = nn::declare_linear(w, "time_embed.2", c.time_embed_dim, c.time_embed_dim);
    if (c.adm_in_channels > 0) {
        e.label1 = nn::declare_linear(w, "label_emb.0.0", c.adm_in_channels, c.time_embed_dim);
        e.label2 = nn::declare_linear(w, "label_emb.0.2", c.time_embed_dim, c.time_embed_dim);
    }
    e.conv_in = nn::declare_conv2d(w, "input_blocks.0.0", c.in_channels, c.model_channels, 3, 1, 1);

    const int levels = static_cast<int>(c.level_channels.size());
    e.block_channels = {c.model_channels};
    int64_t ch = c.model_channels;
    int k = 1;
    for (int level = 0; level < levels; ++level) {
        for (int r = 0; r < c.res_blocks; ++r, ++k) {
            const std::string p = "input_blocks." + std::to_string(k) + ".";
            UnetBlock block;
            block.res = declare_unet_res(w, p + "0.", ch, c.level_channels[level], c.time_embed_dim);
            ch = c.level_channels[level];
            if (const int depth = c.input_depth[k - 1])
                block.attn = declare_unet_transformer(w, p + "1.", ch, c, depth);
            e.input.push_back(std::move(block));
            e.block_channels.push_back(ch);
        }
        if (level + 1 < levels) {
            UnetBlock block;
            block.down = nn::declare_conv2d(w, "input_blocks." + std::to_string(k) + ".0.op", ch, ch, 3, 2, 1);
            e.input.push_back(std::move(block));
            e.block_channels.push_back(ch);
            ++k;
        }
    }
    e.mid_res1.res = declare_unet_res(w, "middle_block.0.", ch, ch, c.time_embed_dim);
    if (c.middle_depth > 0) e.mid_attn = declare_unet_transformer(w, "middle_block.1.", ch, c, c.middle_depth);
    // Without its transformer (SSD-1B, Vega) the middle block keeps sgm's
    // numbering (an Identity at 1); accept the second resnet at 1 as well.
    const bool res2_at_1 = c.middle_depth == 0 && !w.has("middle_block.2.in_layers.2.weight");
    e.mid_res2.res = declare_unet_res(w, res2_at_1 ? "middle_block.1." : "middle_block.2.", ch, ch, c.time_embed_dim);
    return e;
}

Result<UnetEncoderOutputs> build_unet_encoder(ggml_context* ctx, const UnetEncoder& e, const UnetConfig& c,
                                              const UnetInputs& inputs, const UnetBuildOptions& options,
                                              ggml_tensor* hint) {
    const std::string& what = e.what;
    ggml_tensor* x = inputs.x;
    ggml_tensor* context = inputs.context;
    if (!x || !inputs.timesteps || !context) return Error{what + ": x, timesteps and context are required"};
    const int64_t B = x->ne[3];
    const int64_t stride = int64_t(1) << (c.level_channels.size() - 1);
    if (x->ne[2] != c.in_channels) {
        return Error{what + ": x has " + std::to_string(x->ne[2]) + " channels, the network takes " +
                     std::to_string(c.in_channels)};
    }
    if (x->ne[0] % stride != 0 || x->ne[1] % stride != 0) {
        return Error{what + ": latent size " + std::to_string(x->ne[0]) + "x" + std::to_string(x->ne[1]) +
                     " is not a multiple of " + std::to_string(stride)};
    }
    const int64_t steps = ggml_nelements(inputs.timesteps);
    if (steps != B && steps != 1) return Error{what + ": timesteps must have one value, or one per batch item"};
    if (context->ne[0] != c.context_dim) {
        return Error{what + ": context is " + std::to_string(context->ne[0]) + " wide, the network takes " +
                     std::to_string(c.context_dim)};
    }
    if (c.adm_in_channels > 0 && !inputs.y) {
        return Error{what + ": this network has label_emb and needs y (ne [" + std::to_string(c.adm_in_channels) +
                     ", batch])"};
    }
    if (c.adm_in_channels == 0 && inputs.y) return Error{what + ": this network has no label_emb; y must be null"};
    if (inputs.y && (inputs.y->ne[0] != c.adm_in_channels || ggml_nelements(inputs.y) != c.adm_in_channels * B)) {
        return Error{what + ": y must be ne [" + std::to_string(c.adm_in_channels) + ", " + std::to_string(B) + "]"};
    }
    if (hint && (hint->ne[0] != x->ne[0] || hint->ne[1] != x->ne[1] || hint->ne[2] != c.model_channels ||
                 (hint->ne[3] != B && hint->ne[3] != 1))) {
        return Error{what + ": the guided hint does not have input_blocks.0's shape"};
    }

    UnetEncoderOutputs out;
    nn::AttentionOptions& attn = out.attn;
    attn.heads = static_cast<int>(c.heads);
    attn.flash = options.flash_attention;
    // On the CPU, large attention scores go through the cache a block at a
    // time (nn/attention.h).
    const nn::ComputeTarget target = options.target;
    if (target == nn::ComputeTarget::Cpu) attn.scores_block_bytes = nn::kCpuScoresBlockBytes;
    ggml_tensor* emb = ggml_timestep_embedding(ctx, inputs.timesteps, static_cast<int>(c.model_channels), 10000);
    emb = nn::linear(ctx, e.time2, ggml_silu(ctx, nn::linear(ctx, e.time1, emb)));
    if (inputs.y) {
        ggml_tensor* y = ggml_reshape_2d(ctx, inputs.y, c.adm_in_channels, B);
        // label first: a single timestep's embedding broadcasts over the batch.
        emb = ggml_add(ctx, nn::linear(ctx, e.label2, ggml_silu(ctx, nn::linear(ctx, e.label1, y))), emb);
    }
    out.emb = emb;

    ggml_tensor* h = nn::conv2d(ctx, target, e.conv_in, x);
    if (hint) h = ggml_add(ctx, h, hint);
    h = nn::mark_cut(h, "input_blocks.0");
    out.blocks.push_back(h);
    for (size_t i = 0; i < e.input.size(); ++i) {
        const UnetBlock& block = e.input[i];
        if (block.down) {
            h = nn::conv2d(ctx, target, *block.down, h);
        } else {
            h = apply_unet_res(ctx, target, *block.res, h, emb);
            if (block.attn) h = apply_unet_transformer(ctx, *block.attn, h, context, c, attn);
        }
        h = nn::mark_cut(h, "input_blocks." + std::to_string(i + 1));
        out.blocks.push_back(h);
    }
    h = apply_unet_res(ctx, target, *e.mid_res1.res, h, emb);
    if (e.mid_attn) h = apply_unet_transformer(ctx, *e.mid_attn, h, context, c, attn);
    out.middle = nn::mark_cut(apply_unet_res(ctx, target, *e.mid_res2.res, h, emb), "middle_block");
    return out;
}

}  // namespace kiln::models
