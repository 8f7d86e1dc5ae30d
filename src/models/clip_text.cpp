#include "models/clip_text.h"

#include "nn/attention.h"
#include "nn/layers.h"

namespace kiln::models {

struct ClipTextEncoder::Layer {
    nn::Norm norm1, norm2;
    // HF: separate q/k/v; OpenCLIP: one fused in_proj ([3*width, width]).
    nn::Linear q, k, v, in_proj, out;
    nn::Linear fc1, fc2;
};

Result<std::unique_ptr<ClipTextEncoder>> ClipTextEncoder::create(const io::ModelFile& file, const std::string& prefix,
                                                                 std::optional<ggml_type> weight_type) {
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
    c.quick_gelu = hf;  // ViT-L (HF naming) uses quick_gelu; OpenCLIP models use gelu
    const std::string layer_root = hf ? root + "encoder.layers." : root + "transformer.resblocks.";
    const std::string fc1_name = hf ? ".mlp.fc1.weight" : ".mlp.c_fc.weight";
    while (file.find(layer_root + std::to_string(c.layers) + fc1_name)) ++c.layers;
    if (c.layers == 0) return Error{"CLIP text encoder under '" + prefix + "' has no transformer layers"};
    c.intermediate = file.find(layer_root + "0" + fc1_name)->shape[0];
    // Small models may say otherwise in their metadata.
    c.heads = static_cast<int64_t>(file.metadata_number("kiln.clip.heads", static_cast<double>(c.heads)));
    if (c.heads <= 0 || c.width % c.heads != 0)
        return Error{"CLIP text encoder: width " + std::to_string(c.width) + " is not divisible by its head count"};

    enc->weights_ = std::make_unique<runtime::ModuleWeights>(file, root, weight_type);
    enc->declare();
    return enc;
}

void ClipTextEncoder::declare() {
    const ClipTextConfig& c = config_;
    runtime::ModuleWeights& w = *weights_;
    const int64_t W = c.width;
    if (c.naming == ClipTextConfig::Naming::HuggingFace) {
        token_embedding_ = w.require("embeddings.token_embedding.weight", {c.vocab, W});
        position_embedding_ = w.require_f32("embeddings.position_embedding.weight", {c.context, W});
        for (int64_t i = 0; i < c.layers; ++i) {
            auto layer = std::make_shared<Layer>();
            const std::string p = "encoder.layers." + std::to_string(i) + ".";
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
        final_norm_weight_ = w.require("final_layer_norm.weight", {W});
        final_norm_bias_ = w.require("final_layer_norm.bias", {W});
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
}

ggml_tensor* ClipTextEncoder::build(ggml_context* ctx, ggml_tensor* tokens, int clip_skip,
                                    ggml_tensor* extra_embeddings) const {
    const ClipTextConfig& c = config_;
    const int64_t n = tokens->ne[0], batch = tokens->ne[1];
    ggml_tensor* table = token_embedding_;
    if (extra_embeddings) {
        // Textual-inversion vectors continue the vocabulary's table.
        if (table->type != GGML_TYPE_F32) table = ggml_cast(ctx, table, GGML_TYPE_F32);
        table = ggml_concat(ctx, table, extra_embeddings, 1);
    }
    ggml_tensor* x = ggml_get_rows(ctx, table, ggml_reshape_1d(ctx, tokens, n * batch));  // [W, n*B]
    x = ggml_reshape_3d(ctx, x, c.width, n, batch);
    x = ggml_add(ctx, x, ggml_view_2d(ctx, position_embedding_, c.width, n, position_embedding_->nb[1], 0));

    const int64_t run_layers = std::max<int64_t>(1, c.layers - std::max(1, clip_skip) + 1);
    nn::AttentionOptions attn{static_cast<int>(c.heads), /*causal=*/true, /*flash=*/false};
    for (int64_t i = 0; i < run_layers; ++i) {
        const Layer& l = *layers_[i];
        ggml_tensor* h = nn::layer_norm(ctx, l.norm1, x);
        ggml_tensor *q, *k, *v;
        if (!l.in_proj.weight) {
            q = nn::linear(ctx, l.q, h);
            k = nn::linear(ctx, l.k, h);
            v = nn::linear(ctx, l.v, h);
        } else {
            ggml_tensor* qkv = nn::linear(ctx, l.in_proj, h);  // [3W, n, B]
            auto part = [&](int idx) {
                return ggml_cont(ctx, ggml_view_3d(ctx, qkv, c.width, n, batch, qkv->nb[1], qkv->nb[2],
                                                   static_cast<size_t>(idx) * c.width * ggml_element_size(qkv)));
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
    }
    x = ggml_norm(ctx, x, 1e-5f);
    return ggml_add(ctx, ggml_mul(ctx, x, final_norm_weight_), final_norm_bias_);
}

}  // namespace kiln::models
