#include "models/nets/clip_text.h"

#include "nn/attention.h"
#include "nn/layers.h"

namespace kiln::models {

struct ClipTextEncoder::Layer {
    nn::Norm norm1, norm2;
    // HF: separate q/k/v; OpenCLIP: one fused in_proj ([3*width, width]).
    nn::Linear q, k, v, in_proj, out;
    nn::Linear fc1, fc2;
};

Result<std::unique_ptr<ClipTextEncoder>> ClipTextEncoder::create(io::WeightDeclarer& weights,
                                                                 bool hf_named_openclip) {
    const io::ModelFile& file = weights.file();
    const std::string& prefix = weights.prefix();
    std::unique_ptr<ClipTextEncoder> enc(new ClipTextEncoder());
    ClipTextConfig& c = enc->config_;
    std::string root;
    const io::TensorInfo* tok = nullptr;
    const io::TensorInfo* pos = nullptr;
    if ((tok = file.find(prefix + "text_model.embeddings.token_embedding.weight"))) {
        c.naming = ClipTextConfig::Naming::HuggingFace;
        root = prefix + "text_model.";
        pos = file.find(root + "embeddings.position_embedding.weight");
    } else if ((tok = file.find(prefix + "token_embedding.weight"))) {
        c.naming = ClipTextConfig::Naming::OpenClip;
        root = prefix;
        pos = file.find(root + "positional_embedding");
    } else {
        return Error{"no CLIP text encoder under '" + prefix + "' (no token embedding)"};
    }
    if (tok->shape.size() != 2 || !pos || pos->shape.size() != 2 || pos->shape[1] != tok->shape[1]) {
        return Error{"CLIP text encoder under '" + prefix + "': token/position embeddings are missing or inconsistent"};
    }
    c.vocab = tok->shape[0];
    c.width = tok->shape[1];
    c.context = pos->shape[0];
    c.heads = std::max<int64_t>(1, c.width / 64);
    const bool hf = c.naming == ClipTextConfig::Naming::HuggingFace;
    c.quick_gelu = hf && !hf_named_openclip;  // OpenAI's ViT-L; OpenCLIP's towers use gelu
    const std::string layer_root = hf ? root + "encoder.layers." : root + "transformer.resblocks.";
    const std::string fc1_name = hf ? ".mlp.fc1.weight" : ".mlp.c_fc.weight";
    while (file.find(layer_root + std::to_string(c.layers) + fc1_name)) ++c.layers;
    if (c.layers == 0) return Error{"CLIP text encoder under '" + prefix + "' has no transformer layers"};
    const io::TensorInfo* fc1 = file.find(layer_root + "0" + fc1_name);
    if (fc1->shape.size() != 2) {
        return Error{"CLIP text encoder under '" + prefix + "': " + fc1->name + " is not a matrix"};
    }
    c.intermediate = fc1->shape[0];
    // A zero size would reach ggml as an empty weight (or a division by zero).
    if (c.vocab <= 0 || c.width <= 0 || c.context <= 0 || c.intermediate <= 0) {
        return Error{"CLIP text encoder under '" + prefix + "': a zero size in its embeddings or feed-forward (vocab " +
                     std::to_string(c.vocab) + ", width " + std::to_string(c.width) + ", context " +
                     std::to_string(c.context) + ", feed-forward " + std::to_string(c.intermediate) + ")"};
    }
    // open_clip's text_projection [width, projection], applied as x @ P, or
    // the Linear of HF's CLIPTextModelWithProjection, [projection, width] =
    // P^T, which a diffusers text_encoder_2 keeps under its HF name
    // (io/diffusers_names.h). SD1's and SDXL's HF-named ViT-L have none.
    const std::string linear_name = (hf ? prefix : root) + "text_projection.weight";
    if (const io::TensorInfo* proj = hf ? nullptr : file.find(root + "text_projection")) {
        if (proj->shape.size() != 2 || proj->shape[0] != c.width)
            return Error{"CLIP text encoder under '" + prefix + "': text_projection has the wrong shape"};
        c.projection = proj->shape[1];
    } else if (const io::TensorInfo* linear = hf && !hf_named_openclip ? nullptr : file.find(linear_name)) {
        if (linear->shape.size() != 2 || linear->shape[1] != c.width)
            return Error{"CLIP text encoder under '" + prefix + "': text_projection.weight has the wrong shape"};
        c.projection = linear->shape[0];
        c.projection_linear = true;
    }
    // Small models may say otherwise in their metadata.
    auto fixed_heads = file.metadata_integer("kiln.clip.heads", 1, 4096);
    if (!fixed_heads.ok()) return fixed_heads.error();
    if (*fixed_heads) c.heads = **fixed_heads;
    if (c.heads <= 0 || c.width % c.heads != 0)
        return Error{"CLIP text encoder: width " + std::to_string(c.width) + " is not divisible by its head count"};

    enc->root_ = root.substr(prefix.size());
    enc->declare(weights);
    return enc;
}

void ClipTextEncoder::declare(io::WeightDeclarer& w) {
    const ClipTextConfig& c = config_;
    const int64_t W = c.width;
    if (c.naming == ClipTextConfig::Naming::HuggingFace) {
        const std::string& r = root_;
        token_embedding_ = w.require(r + "embeddings.token_embedding.weight", {c.vocab, W});
        position_embedding_ = w.require_f32(r + "embeddings.position_embedding.weight", {c.context, W});
        for (int64_t i = 0; i < c.layers; ++i) {
            auto layer = std::make_shared<Layer>();
            const std::string p = r + "encoder.layers." + std::to_string(i) + ".";
            layer->norm1 = nn::declare_norm(w, p + "layer_norm1", W);
            layer->q = nn::declare_linear(w, p + "self_attn.q_proj", W, W);
            layer->k = nn::declare_linear(w, p + "self_attn.k_proj", W, W);
            layer->v = nn::declare_linear(w, p + "self_attn.v_proj", W, W);
            layer->out = nn::declare_linear(w, p + "self_attn.out_proj", W, W);
            layer->norm2 = nn::declare_norm(w, p + "layer_norm2", W);
            layer->fc1 = nn::declare_linear(w, p + "mlp.fc1", W, c.intermediate);
            layer->fc2 = nn::declare_linear(w, p + "mlp.fc2", c.intermediate, W);
            layers_.push_back(layer);
        }
        final_norm_weight_ = w.require(r + "final_layer_norm.weight", {W});
        final_norm_bias_ = w.require(r + "final_layer_norm.bias", {W});
    } else {
        token_embedding_ = w.require("token_embedding.weight", {c.vocab, W});
        position_embedding_ = w.require_f32("positional_embedding", {c.context, W});
        for (int64_t i = 0; i < c.layers; ++i) {
            auto layer = std::make_shared<Layer>();
            const std::string p = "transformer.resblocks." + std::to_string(i) + ".";
            layer->norm1 = nn::declare_norm(w, p + "ln_1", W);
            const std::string hf = "text_model.encoder.layers." + std::to_string(i) + ".self_attn.";
            if (!w.has(p + "attn.in_proj_weight") && w.has(hf + "q_proj.weight")) {
                // A diffusers OpenCLIP keeps q, k, v apart (io/diffusers_names.h
                // leaves them under their HF names): no need to fuse them.
                layer->q = nn::declare_linear(w, hf + "q_proj", W, W);
                layer->k = nn::declare_linear(w, hf + "k_proj", W, W);
                layer->v = nn::declare_linear(w, hf + "v_proj", W, W);
            } else {
                layer->in_proj = {w.require(p + "attn.in_proj_weight", {3 * W, W}),
                                  w.require(p + "attn.in_proj_bias", {3 * W})};
            }
            layer->out = nn::declare_linear(w, p + "attn.out_proj", W, W);
            layer->norm2 = nn::declare_norm(w, p + "ln_2", W);
            layer->fc1 = nn::declare_linear(w, p + "mlp.c_fc", W, c.intermediate);
            layer->fc2 = nn::declare_linear(w, p + "mlp.c_proj", c.intermediate, W);
            layers_.push_back(layer);
        }
        final_norm_weight_ = w.require("ln_final.weight", {W});
        final_norm_bias_ = w.require("ln_final.bias", {W});
    }
    if (c.projection && c.projection_linear) {
        projection_ = w.require("text_projection.weight", {c.projection, W});
    } else if (c.projection) {
        projection_ = w.require("text_projection", {W, c.projection});
    }
}

ggml_tensor* ClipTextEncoder::build(ggml_context* ctx, ggml_tensor* tokens, int clip_skip,
                                    ggml_tensor* extra_embeddings) const {
    ClipTextOptions options;
    options.layer_from_end = clip_skip;
    options.extra_embeddings = extra_embeddings;
    return encode(ctx, tokens, options).hidden;
}

ClipTextOutput ClipTextEncoder::encode(ggml_context* ctx, ggml_tensor* tokens, const ClipTextOptions& options) const {
    const ClipTextConfig& c = config_;
    const int64_t n = tokens->ne[0], batch = tokens->ne[1];
    ggml_tensor* table = token_embedding_;
    if (options.extra_embeddings) {
        // Textual-inversion vectors continue the vocabulary's table.
        if (table->type != GGML_TYPE_F32) table = ggml_cast(ctx, table, GGML_TYPE_F32);
        table = ggml_concat(ctx, table, options.extra_embeddings, 1);
    }
    ggml_tensor* x = ggml_get_rows(ctx, table, ggml_reshape_1d(ctx, tokens, n * batch));  // [W, n*B]
    x = ggml_reshape_3d(ctx, x, c.width, n, batch);
    x = ggml_add(ctx, x, ggml_view_2d(ctx, position_embedding_, c.width, n, position_embedding_->nb[1], 0));

    auto final_norm = [&](ggml_tensor* h) {
        h = ggml_norm(ctx, h, 1e-5f);
        return ggml_add(ctx, ggml_mul(ctx, h, final_norm_weight_), final_norm_bias_);
    };
    const int64_t hidden_layers = std::max<int64_t>(1, c.layers - std::max(1, options.layer_from_end) + 1);
    const int64_t run_layers = options.pooled ? c.layers : hidden_layers;
    nn::AttentionOptions attn{static_cast<int>(c.heads), /*causal=*/true, /*flash=*/false};
    ClipTextOutput out;
    for (int64_t i = 0; i < run_layers; ++i) {
        const Layer& l = *layers_[i];
        ggml_tensor* h = nn::layer_norm(ctx, l.norm1, x);
        ggml_tensor *q, *k, *v;
        if (!l.in_proj.weight) {
            q = nn::linear(ctx, l.q, h);
            k = nn::linear(ctx, l.k, h);
            v = nn::linear(ctx, l.v, h);
        } else {
            // The fused in_proj as three products over its thirds, each the
            // product a file with q, k, v apart (diffusers, HF names) runs,
            // so both give the same bits.
            auto part = [&](int idx) {
                const nn::Linear& f = l.in_proj;
                nn::Linear third{
                    ggml_view_2d(ctx, f.weight, c.width, c.width, f.weight->nb[1],
                                 static_cast<size_t>(idx) * c.width * f.weight->nb[1]),
                    ggml_view_1d(ctx, f.bias, c.width, static_cast<size_t>(idx) * c.width * ggml_element_size(f.bias))};
                return nn::linear(ctx, third, h);
            };
            q = part(0);
            k = part(1);
            v = part(2);
        }
        x = ggml_add(ctx, x, nn::linear(ctx, l.out, nn::attention(ctx, q, k, v, attn)));
        h = nn::layer_norm(ctx, l.norm2, x);
        h = nn::linear(ctx, l.fc1, h);
        h = c.quick_gelu ? nn::quick_gelu(ctx, h) : ggml_gelu_erf(ctx, h);
        x = ggml_add(ctx, x, nn::linear(ctx, l.fc2, h));
        x = nn::mark_cut(x, "clip.layers." + std::to_string(i));
        if (i + 1 == hidden_layers) out.hidden = options.final_norm ? final_norm(x) : x;
    }
    if (options.pooled) {
        ggml_tensor* last = hidden_layers == c.layers && options.final_norm ? out.hidden : final_norm(x);
        out.pooled = pool(ctx, last, tokens, options.pooled_token);
    }
    return out;
}

ggml_tensor* ClipTextEncoder::pool(ggml_context* ctx, ggml_tensor* normed, ggml_tensor* tokens,
                                   std::optional<int32_t> pooled_token) const {
    const int64_t n = tokens->ne[0], batch = tokens->ne[1];
    // The position to pool is the argmax of a key that is exact in F32 (ids
    // below 2^24 / context) and unique per position, so the first match wins
    // whatever order a backend's argmax scans in: id * n - position, or
    // -|id - pooled_token| * n - position.
    ggml_tensor* key = ggml_cast(ctx, tokens, GGML_TYPE_F32);  // [n, B]
    if (pooled_token) key = ggml_neg(ctx, ggml_abs(ctx, ggml_scale_bias(ctx, key, 1.0f, -float(*pooled_token))));
    key = ggml_sub(ctx, ggml_scale(ctx, key, float(n)), ggml_arange(ctx, 0.0f, float(n), 1.0f));
    ggml_tensor* position = ggml_reshape_2d(ctx, ggml_argmax(ctx, key), 1, batch);  // I32 [1, B]
    ggml_tensor* pooled = ggml_reshape_2d(ctx, ggml_get_rows(ctx, normed, position), config_.width, batch);
    if (!projection_) return pooled;
    // x @ P: P is ne [projection, width]; the product wants it as ne
    // [width, projection], the layout a Linear's weight already has.
    ggml_tensor* p = config_.projection_linear ? projection_ : ggml_cont(ctx, ggml_transpose(ctx, projection_));
    return ggml_mul_mat(ctx, p, pooled);  // [projection, B]
}

TextEncoderTensors ClipTextEncoder::build(nn::GraphInputs& s, const TextEncodeShape& shape) const {
    TextEncoderTensors g;
    g.tokens = s.input(GGML_TYPE_I32, {shape.length, shape.batch}, nullptr, "tokens");
    ClipTextOptions options;
    options.layer_from_end = shape.layer;
    options.final_norm = shape.final_norm;
    options.pooled = shape.pooled;
    if (shape.extra_rows > 0) {
        options.extra_embeddings =
            s.input(GGML_TYPE_F32, {config_.width, shape.extra_rows}, shape.extra_embeddings, "embeddings");
        // Embedding ids lie above the vocabulary, so the largest id is no
        // longer the EOS: pool at the EOS itself (sd-cli, ComfyUI).
        options.pooled_token = shape.pooled_token;
    }
    const ClipTextOutput out = encode(s.ctx(), g.tokens, options);
    g.out = out.hidden;
    if (out.pooled) {
        ggml_context* c = s.ctx();
        g.pooled_width = out.pooled->ne[0];
        g.out = ggml_concat(c, ggml_reshape_1d(c, ggml_cont(c, out.hidden), ggml_nelements(out.hidden)),
                            ggml_reshape_1d(c, ggml_cont(c, out.pooled), ggml_nelements(out.pooled)), 0);
    }
    return g;
}

}  // namespace kiln::models
