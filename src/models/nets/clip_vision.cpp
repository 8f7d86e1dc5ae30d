#include "models/nets/clip_vision.h"

#include <cmath>
#include <string>

#include "nn/attention.h"

namespace kiln::models {
namespace {

constexpr float kEps = 1e-5f;   // every LayerNorm of the tower
constexpr int64_t kHeads = 16;  // ViT-H/14's (and ViT-L/14's, ViT-bigG/14's)
constexpr const char* kHeadsKey = "kiln.clip.heads";
// CLIP's image normalisation (OpenAI's and OpenCLIP's preprocess).
constexpr float kMean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
constexpr float kDeviation[3] = {0.26862954f, 0.26130258f, 0.27577711f};
const std::string kRoot = "vision_model.";

}  // namespace

struct ClipVisionEncoder::Layer {
    nn::Norm norm1, norm2;
    nn::Linear q, k, v, out, fc1, fc2;
};

ClipVisionEncoder::ClipVisionEncoder() = default;
ClipVisionEncoder::~ClipVisionEncoder() = default;

Result<std::unique_ptr<ClipVisionEncoder>> ClipVisionEncoder::create(io::WeightDeclarer& weights) {
    const std::string where = "CLIP vision tower under '" + weights.prefix() + "'";
    auto bad = [&](const std::string& what) { return Error::bad_file(where + ": " + what); };
    const io::TensorInfo* kernel = weights.info(kRoot + "embeddings.patch_embedding.weight");
    const io::TensorInfo* positions = weights.info(kRoot + "embeddings.position_embedding.weight");
    if (!kernel || !positions)
        return bad("no vision_model.embeddings.patch_embedding / position_embedding (not a CLIP vision tower)");
    std::unique_ptr<ClipVisionEncoder> enc(new ClipVisionEncoder());
    ClipVisionConfig& c = enc->config_;
    const auto& k = kernel->shape;
    if (k.size() != 4 || k[1] != 3 || k[2] != k[3] || k[0] <= 0 || k[2] <= 0) {
        return bad("vision_model.embeddings.patch_embedding.weight is " + kernel->shape_string() +
                   ", expected [width, 3, patch, patch]");
    }
    c.width = k[0];
    c.patch = k[2];
    // (side / patch)^2 patches and the class token.
    const int64_t rows = positions->shape.size() == 2 ? positions->shape[0] : 0;
    const auto per_side =
        static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(std::max<int64_t>(rows - 1, 0)))));
    if (positions->shape.size() != 2 || positions->shape[1] != c.width || per_side < 1 ||
        per_side * per_side + 1 != rows) {
        return bad("vision_model.embeddings.position_embedding.weight is " + positions->shape_string() +
                   ", expected [a square number of patches + 1, " + std::to_string(c.width) + "]");
    }
    c.image_side = per_side * c.patch;
    const std::string layer_root = kRoot + "encoder.layers.";
    c.layers = 0;
    while (weights.has(layer_root + std::to_string(c.layers) + ".mlp.fc1.weight")) ++c.layers;
    if (c.layers < 2) {
        return bad(std::to_string(c.layers) + " transformer layers; the tower's output is its penultimate layer's, " +
                   "so it needs at least 2");
    }
    const io::TensorInfo* fc1 = weights.info(layer_root + "0.mlp.fc1.weight");
    if (fc1->shape.size() != 2 || fc1->shape[1] != c.width || fc1->shape[0] <= 0)
        return bad(fc1->name + " is " + fc1->shape_string() + ", expected [intermediate, " + std::to_string(c.width) +
                   "]");
    c.intermediate = fc1->shape[0];
    auto heads = weights.file().metadata_integer(kHeadsKey, 1, c.width);
    if (!heads.ok()) return bad(heads.error().message);
    c.heads = heads->value_or(kHeads);
    if (c.width % c.heads != 0) {
        return bad("width " + std::to_string(c.width) + " is not a whole number of " + std::to_string(c.heads) +
                   " heads; set metadata " + kHeadsKey);
    }
    enc->declare(weights);
    return enc;
}

void ClipVisionEncoder::declare(io::WeightDeclarer& w) {
    const ClipVisionConfig& c = config_;
    const int64_t W = c.width;
    patch_kernel_ = w.require(kRoot + "embeddings.patch_embedding.weight", {W, 3, c.patch, c.patch});
    class_embedding_ = w.require_f32(kRoot + "embeddings.class_embedding", {W});
    position_embedding_ = w.require_f32(kRoot + "embeddings.position_embedding.weight", {c.tokens(), W});
    pre_norm_ = nn::declare_norm(w, kRoot + "pre_layrnorm", W);
    // The last layer's output is never read (the penultimate's is).
    for (int i = 0; i + 1 < c.layers; ++i) {
        const std::string p = kRoot + "encoder.layers." + std::to_string(i) + ".";
        auto layer = std::make_unique<Layer>();
        layer->norm1 = nn::declare_norm(w, p + "layer_norm1", W);
        layer->q = nn::declare_linear(w, p + "self_attn.q_proj", W, W);
        layer->k = nn::declare_linear(w, p + "self_attn.k_proj", W, W);
        layer->v = nn::declare_linear(w, p + "self_attn.v_proj", W, W);
        layer->out = nn::declare_linear(w, p + "self_attn.out_proj", W, W);
        layer->norm2 = nn::declare_norm(w, p + "layer_norm2", W);
        layer->fc1 = nn::declare_linear(w, p + "mlp.fc1", W, c.intermediate);
        layer->fc2 = nn::declare_linear(w, p + "mlp.fc2", c.intermediate, W);
        layers_.push_back(std::move(layer));
    }
}

std::vector<float> ClipVisionEncoder::patch_rows(const float* image) const {
    const int64_t side = config_.image_side, p = config_.patch, n = config_.patches_per_side();
    const int64_t row = 3 * p * p;
    std::vector<float> rows(static_cast<size_t>(n * n * row));
    for (int64_t py = 0; py < n; ++py) {
        for (int64_t px = 0; px < n; ++px) {
            float* dst = rows.data() + (py * n + px) * row;
            for (int64_t ch = 0; ch < 3; ++ch) {
                for (int64_t y = 0; y < p; ++y) {
                    for (int64_t x = 0; x < p; ++x) {
                        const float v = image[(ch * side + py * p + y) * side + px * p + x];
                        *dst++ = (v - kMean[ch]) / kDeviation[ch];
                    }
                }
            }
        }
    }
    return rows;
}

VisionEncoderTensors ClipVisionEncoder::build(nn::GraphInputs& inputs, const VisionEncodeShape& shape) const {
    const ClipVisionConfig& c = config_;
    if (shape.width != c.image_side || shape.height != c.image_side || !shape.image) return {};
    ggml_context* ctx = inputs.ctx();
    const int64_t W = c.width, patches = c.tokens() - 1, row = 3 * c.patch * c.patch;
    const std::vector<float> rows = patch_rows(shape.image);
    ggml_tensor* pixels = inputs.input(GGML_TYPE_F32, {row, patches}, rows.data(), "patches");
    // The Conv2d with kernel = stride = patch is a product with each patch's row.
    ggml_tensor* x = ggml_mul_mat(ctx, ggml_reshape_2d(ctx, patch_kernel_, row, W), pixels);  // [W, patches]
    x = ggml_concat(ctx, ggml_reshape_2d(ctx, class_embedding_, W, 1), x, 1);                 // [W, tokens]
    x = ggml_add(ctx, x, position_embedding_);
    x = nn::layer_norm(ctx, pre_norm_, x, kEps);
    nn::AttentionOptions attn;
    attn.heads = static_cast<int>(c.heads);
    attn.flash = shape.flash_attention;
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Layer& l = *layers_[i];
        ggml_tensor* h = nn::layer_norm(ctx, l.norm1, x, kEps);
        h = nn::attention(ctx, nn::linear(ctx, l.q, h), nn::linear(ctx, l.k, h), nn::linear(ctx, l.v, h), attn);
        x = ggml_add(ctx, x, nn::linear(ctx, l.out, h));
        h = ggml_gelu_erf(ctx, nn::linear(ctx, l.fc1, nn::layer_norm(ctx, l.norm2, x, kEps)));
        x = ggml_add(ctx, x, nn::linear(ctx, l.fc2, h));
        x = nn::mark_cut(x, "clip_vision.layers." + std::to_string(i));
    }
    return {x};
}

}  // namespace kiln::models
