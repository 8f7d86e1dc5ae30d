#include "pipeline/graphs.h"

#include <algorithm>

#include "pipeline/session_inputs.h"

namespace kiln::pipeline {
namespace {

// `data`, or zeros of the same size when it is null.
template <class T>
const T* or_zeros(const T* data, size_t count, std::vector<T>& zeros) {
    if (data) return data;
    zeros.assign(count, T(0));
    return zeros.data();
}


}  // namespace

Result<VisionGraph> build_vision_graph(const Model& model, const float* image, int64_t width, int64_t height) {
    VisionGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    SessionInputs inputs(*g.session);
    std::vector<float> zeros;
    models::VisionEncodeShape shape;
    shape.width = width;
    shape.height = height;
    shape.image = or_zeros(image, static_cast<size_t>(3 * width * height), zeros);
    shape.target = model.vision_target();
    g.out = model.vision().build(inputs, shape).out;
    if (!g.out)
        return Error{"the vision tower takes no " + std::to_string(width) + "x" + std::to_string(height) + " image"};
    return g;
}

TextEncoderGraph build_text_encoder_graph(const TextEncoder& encoder, const int32_t* ids, int64_t length, int64_t batch,
                                          int layer, const float* key_mask,
                                          const std::vector<models::TokenGrid>& image_grids, const float* rows) {
    TextEncoderGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    SessionInputs inputs(*g.session);
    models::TextEncodeShape shape;
    shape.length = length;
    shape.batch = batch;
    shape.layer = layer;
    shape.final_norm = encoder.use->final_norm;
    shape.pooled = encoder.use->pooled;
    shape.key_mask = key_mask;
    shape.hidden_states = encoder.use->hidden_states;
    if (!image_grids.empty()) {
        shape.image_grids = image_grids;
        shape.extra_embeddings = rows;
        for (const models::TokenGrid& grid : image_grids) shape.extra_rows += grid.rows * grid.cols;
    }
    const EmbeddingTable& extra = encoder.embeddings;
    if (extra.rows() > 0) {
        shape.extra_embeddings = extra.vectors.data();
        shape.extra_rows = static_cast<int64_t>(extra.rows());
        shape.pooled_token = extra.eos_id;
    }
    const models::TextEncoderTensors t = encoder.network->build(inputs, shape);
    if (ids) g.session->set_input(t.tokens, ids);
    g.pooled_width = t.pooled_width;
    g.out = encoder.weights->apply_patches(g.session->ctx(), t.out);
    return g;
}

Result<DiffusionGraph> build_diffusion_graph(const Model& model, models::DiffusionShape shape) {
    DiffusionGraph g;
    shape.target = model.diffusion_target();
    g.shape = shape;
    g.session = std::make_unique<runtime::GraphSession>();
    SessionInputs inputs(*g.session);
    auto built = model.diffusion().build(inputs, shape);
    if (!built.ok()) return built.error();
    static_cast<models::DiffusionTensors&>(g) = *built;
    g.out = model.diffusion_weights().apply_patches(g.session->ctx(), built->out);
    return g;
}

void add_control_residuals(const Model& model, models::DiffusionShape& shape, float strength) {
    shape.control.clear();
    for (const models::ControlResidualShape& r : model.control_net().residual_shapes(shape.latent_w, shape.latent_h))
        shape.control.push_back({r.w, r.h, r.c});
    shape.control_strength = strength;
}

Result<ControlGraph> build_control_graph(const Model& model, const models::DiffusionShape& shape) {
    const models::ControlNetConfig& cc = model.control_net().config();
    const models::UnetConfig& uc = cc.unet;
    ControlGraph g;
    g.shape = shape;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    const int64_t b = shape.batch;
    const int64_t f = models::ControlNetConfig::kHintDownscale;
    const int64_t hint_values = shape.latent_w * f * shape.latent_h * f * cc.hint_channels;
    const std::vector<float> zeros(
        static_cast<size_t>(std::max({shape.latent_w * shape.latent_h * uc.in_channels * b,
                                      uc.context_dim * shape.tokens * b, uc.adm_in_channels * b, hint_values})));
    models::UnetInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, uc.in_channels, b}, zeros.data(), "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, zeros.data(), "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {uc.context_dim, shape.tokens, b}, zeros.data(), "context");
    if (uc.adm_in_channels > 0) in.y = g.y = s.input(GGML_TYPE_F32, {uc.adm_in_channels, b}, zeros.data(), "y");
    g.hint =
        s.input(GGML_TYPE_F32, {shape.latent_w * f, shape.latent_h * f, cc.hint_channels, 1}, zeros.data(), "hint");
    models::UnetBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = model.control_target();
    auto out = model.control_net().build(s.ctx(), in, g.hint, options);
    if (!out.ok()) return Error{"ControlNet graph: " + out.error().message};
    g.out = model.control_weights().apply_patches(s.ctx(), *out);
    return g;
}

int64_t single_chunk_tokens(const Model& model) {
    // Each token group's length (its encoders side by side have the same),
    // the groups one after the other.
    std::vector<int64_t> group_tokens;
    auto add = [&](const models::TextEncoderUse& use, int64_t tokens) {
        if (!use.context) return;
        if (group_tokens.size() <= static_cast<size_t>(use.token_group)) group_tokens.resize(use.token_group + 1, 0);
        group_tokens[static_cast<size_t>(use.token_group)] = tokens;
    };
    for (const TextEncoder& te : model.text_encoders()) {
        switch (te.use->layout) {
            case models::PromptLayout::ClipChunks: add(*te.use, te.network->max_length()); break;
            case models::PromptLayout::FixedLength: add(*te.use, te.use->max_length); break;
            case models::PromptLayout::ChatTemplate: add(*te.use, te.use->plan_tokens); break;
        }
    }
    for (const models::TextEncoderUse* use : model.absent_text_encoders()) add(*use, use->max_length);
    int64_t tokens = 0;
    for (int64_t t : group_tokens) tokens += t;
    return tokens;
}

VaeGraph build_vae_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent) {
    const models::AutoencoderFormat& vc = model.vae().format();
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in = g.session->input(
        GGML_TYPE_F32, {latent_w, latent_h, vc.latent_channels, 1},
        or_zeros(latent, static_cast<size_t>(latent_w * latent_h * vc.latent_channels), zeros), "latent");
    g.out = model.vae_weights().apply_patches(g.session->ctx(),
                                              model.vae().decode(g.session->ctx(), in, model.vae_target()));
    return g;
}

namespace {

// A clip chunk's graph around its input and history inputs (no data: zeros
// until set_input, which a plan never calls); `build` makes the chunk.
template <typename Build>
Result<ClipChunkGraph> clip_chunk_graph(const Model& model, const std::vector<int64_t>& input_ne,
                                        const std::vector<std::array<int64_t, 4>>& history_shapes, Build&& build) {
    ClipChunkGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    g.input = g.session->input(GGML_TYPE_F32, input_ne, nullptr, "input");
    for (const auto& ne : history_shapes) {
        g.history.push_back(g.session->input(GGML_TYPE_F32, {ne[0], ne[1], ne[2], ne[3]}, nullptr, "history"));
    }
    g.chunk = build(g.session->ctx(), g.input, g.history);
    if (!g.chunk.frames) return Error{"the VAE cannot take this clip's chunk (it takes images only)"};
    // The history is read where the graph leaves it, not copied into the output.
    for (ggml_tensor* h : g.chunk.history) g.session->add_output(h);
    g.out = model.vae_weights().apply_patches(g.session->ctx(), g.chunk.frames);
    return g;
}

}  // namespace

Result<ClipChunkGraph> build_clip_chunk_graph(const Model& model, int64_t latent_w, int64_t latent_h,
                                              const std::vector<std::array<int64_t, 4>>& history_shapes) {
    const int64_t channels = model.vae().format().latent_channels;
    return clip_chunk_graph(model, {latent_w, latent_h, channels, 1}, history_shapes,
                            [&](ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history) {
                                return model.vae().decode_chunk(ctx, latent, history, model.vae_target());
                            });
}

Result<ClipChunkGraph> build_clip_encode_chunk_graph(const Model& model, int64_t width, int64_t height, int64_t frames,
                                                     const std::vector<std::array<int64_t, 4>>& history_shapes) {
    return clip_chunk_graph(model, {width, height, 3, frames}, history_shapes,
                            [&](ggml_context* ctx, ggml_tensor* pixels, const std::vector<ggml_tensor*>& history) {
                                return model.vae().encode_chunk(ctx, pixels, history, model.vae_target(),
                                                                models::LatentEncoding::Mean);
                            });
}

VaeGraph build_taesd_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent) {
    const int64_t channels = model.taesd().config().latent_channels;
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in =
        g.session->input(GGML_TYPE_F32, {latent_w, latent_h, channels, 1},
                         or_zeros(latent, static_cast<size_t>(latent_w * latent_h * channels), zeros), "latent");
    g.out = model.taesd().build_decoder(g.session->ctx(), in, model.taesd_target());
    return g;
}

VaeGraph build_vae_encode_graph(const Model& model, int64_t width, int64_t height, const float* pixels,
                                models::LatentEncoding encoding) {
    const models::AutoencoderFormat& vc = model.vae().format();
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in =
        g.session->input(GGML_TYPE_F32, {width, height, vc.image_channels, 1},
                         or_zeros(pixels, static_cast<size_t>(width * height * vc.image_channels), zeros), "image");
    g.out = model.vae_weights().apply_patches(g.session->ctx(),
                                              model.vae().encode(g.session->ctx(), in, model.vae_target(), encoding));
    return g;
}

}  // namespace kiln::pipeline
