#include "pipeline/graphs.h"

#include <algorithm>

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

TextEncoderGraph build_text_encoder_graph(const TextEncoder& encoder, const int32_t* ids, int64_t length, int64_t batch,
                                          int layer, const float* key_mask) {
    TextEncoderGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    std::vector<int32_t> zeros;
    ggml_tensor* tokens =
        s.input(GGML_TYPE_I32, {length, batch}, or_zeros(ids, static_cast<size_t>(length * batch), zeros), "tokens");
    if (encoder.t5) {
        models::T5Options options;
        const std::vector<int32_t> buckets = encoder.t5->relative_buckets(length);
        options.relative_buckets = s.input(GGML_TYPE_I32, {length, length}, buckets.data(), "relative_buckets");
        if (key_mask) options.key_mask = s.input(GGML_TYPE_F32, {length, batch}, key_mask, "key_mask");
        g.out = encoder.t5->weights().apply_patches(s.ctx(), encoder.t5->encode(s.ctx(), tokens, options));
        return g;
    }
    if (encoder.llm) {
        // Positions 0..n-1 and the causal mask: every sequence of a batch
        // has the same length (the conditioner encodes one prompt at a time).
        std::vector<int32_t> positions(static_cast<size_t>(length));
        for (int64_t i = 0; i < length; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(i);
        const std::vector<float> mask = models::llm_causal_mask(length);
        models::LlmOptions options;
        options.positions = s.input(GGML_TYPE_I32, {length}, positions.data(), "positions");
        options.mask = s.input(GGML_TYPE_F32, {length, length}, mask.data(), "causal_mask");
        // Every declared layer runs; the final norm only when that is all of them.
        options.final_norm = encoder.use->final_norm && encoder.llm->declared_layers() == encoder.llm->config().layers;
        g.out = encoder.llm->weights().apply_patches(s.ctx(), encoder.llm->encode(s.ctx(), tokens, options));
        return g;
    }
    models::ClipTextOptions options;
    options.layer_from_end = layer;
    options.final_norm = encoder.use->final_norm;
    options.pooled = encoder.use->pooled;
    const EmbeddingTable& extra = encoder.embeddings;
    if (extra.rows() > 0) {
        options.extra_embeddings = s.input(GGML_TYPE_F32, {extra.width, static_cast<int64_t>(extra.rows())},
                                           extra.vectors.data(), "embeddings");
        // Embedding ids lie above the vocabulary, so the largest id is no
        // longer the EOS: pool at the EOS itself (sd-cli, ComfyUI).
        options.pooled_token = extra.eos_id;
    }
    const models::ClipTextOutput out = encoder.network->encode(s.ctx(), tokens, options);
    g.out = out.hidden;
    if (out.pooled) {
        ggml_context* c = s.ctx();
        g.pooled_width = out.pooled->ne[0];
        g.out = ggml_concat(c, ggml_reshape_1d(c, ggml_cont(c, out.hidden), ggml_nelements(out.hidden)),
                            ggml_reshape_1d(c, ggml_cont(c, out.pooled), ggml_nelements(out.pooled)), 0);
    }
    g.out = encoder.network->weights().apply_patches(s.ctx(), g.out);
    return g;
}

namespace {

// The DiT's graph; its constant inputs (RoPE table, Chroma's index
// embeddings) are filled here from the shape.
Result<DiffusionGraph> build_flux_graph(const Model& model, const DiffusionShape& shape) {
    const models::FluxConfig& fc = model.flux().config();
    DiffusionGraph g;
    g.shape = shape;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    const int64_t b = shape.batch;
    const int64_t c = fc.latent_channels;
    int64_t largest = std::max({shape.latent_w * shape.latent_h * c, fc.context_dim * shape.tokens, fc.vec_dim});
    for (const LatentSize& r : shape.refs) largest = std::max(largest, r.w * r.h * c);
    const std::vector<float> zeros(static_cast<size_t>(largest * b));
    models::FluxInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c, b}, zeros.data(), "x");
    for (size_t i = 0; i < shape.refs.size(); ++i) {
        g.refs.push_back(s.input(GGML_TYPE_F32, {shape.refs[i].w, shape.refs[i].h, c, b}, zeros.data(),
                                 ("ref" + std::to_string(i)).c_str()));
    }
    in.refs = g.refs;
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, zeros.data(), "timesteps");
    if (fc.guidance_embed) in.guidance = g.guidance = s.input(GGML_TYPE_F32, {b}, zeros.data(), "guidance");
    in.context = g.context = s.input(GGML_TYPE_F32, {fc.context_dim, shape.tokens, b}, zeros.data(), "context");
    if (fc.vec_dim > 0) in.pooled = g.y = s.input(GGML_TYPE_F32, {fc.vec_dim, b}, zeros.data(), "pooled");
    const int64_t patch = fc.patch;
    const models::FluxTokenGrid image{shape.latent_w / patch, shape.latent_h / patch};
    std::vector<models::FluxTokenGrid> ref_grids;
    for (const LatentSize& r : shape.refs) ref_grids.push_back({r.w / patch, r.h / patch});
    const std::vector<float> rope =
        models::flux_rope_table(fc, shape.tokens, image, ref_grids, shape.increase_ref_index);
    in.rope = s.input(GGML_TYPE_F32, models::flux_rope_shape(fc, shape.tokens, image, ref_grids), rope.data(), "rope");
    if (shape.mask) {
        int64_t image_tokens = image.w * image.h;
        for (const models::FluxTokenGrid& r : ref_grids) image_tokens += r.w * r.h;
        const std::vector<float> open(static_cast<size_t>(shape.tokens * b), 1.0f);
        const std::vector<float> mask = models::flux_attention_mask(open, image_tokens, b);
        in.mask = g.mask = s.input(GGML_TYPE_F32, models::flux_attention_mask_shape(shape.tokens, image_tokens, b),
                                   mask.data(), "mask");
    }
    if (fc.chroma) {
        const std::vector<float> index = models::chroma_index_table(fc);
        in.chroma_index = s.input(GGML_TYPE_F32, models::chroma_index_shape(fc), index.data(), "chroma_index");
    }
    models::FluxBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = model.diffusion_target();
    options.skip_blocks = shape.skip_blocks;
    auto out = model.flux().build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = model.flux().weights().apply_patches(s.ctx(), *out);
    return g;
}

// Z-Image's DiT: every batch item's caption has shape.tokens tokens (the
// conditioner's passes of different lengths run apart), so the RoPE table
// and the caption's padding are constants of the shape.
Result<DiffusionGraph> build_z_image_graph(const Model& model, const DiffusionShape& shape) {
    const models::ZImageConfig& zc = model.z_image().config();
    DiffusionGraph g;
    g.shape = shape;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    const int64_t b = shape.batch;
    const int64_t c = zc.latent_channels();
    const std::vector<float> zeros(
        static_cast<size_t>(std::max(shape.latent_w * shape.latent_h * c, zc.cap_dim * shape.tokens) * b));
    models::ZImageInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, c, b}, zeros.data(), "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, zeros.data(), "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {zc.cap_dim, shape.tokens, b}, zeros.data(), "context");
    auto tokens = models::z_image_tokens(zc, shape.latent_w, shape.latent_h, shape.tokens,
                                         std::vector<int64_t>(static_cast<size_t>(b), shape.tokens));
    if (!tokens.ok()) return Error{"DiT graph: " + tokens.error().message};
    const std::vector<float> rope = models::z_image_rope_table(zc, *tokens);
    in.rope = s.input(GGML_TYPE_F32, models::z_image_rope_shape(zc, *tokens), rope.data(), "rope");
    const std::vector<float> pad = models::z_image_caption_pad(*tokens);
    in.cap_pad = s.input(GGML_TYPE_F32, models::z_image_caption_pad_shape(*tokens), pad.data(), "cap_pad");
    models::ZImageBuildOptions options;
    options.flash_attention = shape.flash_attention;
    auto out = model.z_image().build(s.ctx(), in, options);
    if (!out.ok()) return Error{"DiT graph: " + out.error().message};
    g.out = model.z_image().weights().apply_patches(s.ctx(), *out);
    return g;
}

}  // namespace

Result<DiffusionGraph> build_diffusion_graph(const Model& model, const DiffusionShape& shape) {
    if (model.has_flux()) return build_flux_graph(model, shape);
    if (model.has_z_image()) return build_z_image_graph(model, shape);
    const models::UnetConfig& uc = model.unet().config();
    DiffusionGraph g;
    g.shape = shape;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    const int64_t b = shape.batch;
    std::vector<float> zeros(static_cast<size_t>(std::max({shape.latent_w * shape.latent_h * uc.in_channels,
                                                           uc.context_dim * shape.tokens, uc.adm_in_channels}) *
                                                 b));
    models::UnetInputs in;
    in.x = g.x = s.input(GGML_TYPE_F32, {shape.latent_w, shape.latent_h, uc.in_channels, b}, zeros.data(), "x");
    in.timesteps = g.timesteps = s.input(GGML_TYPE_F32, {b}, zeros.data(), "timesteps");
    in.context = g.context = s.input(GGML_TYPE_F32, {uc.context_dim, shape.tokens, b}, zeros.data(), "context");
    if (uc.adm_in_channels > 0) in.y = g.y = s.input(GGML_TYPE_F32, {uc.adm_in_channels, b}, zeros.data(), "y");
    if (shape.control) {
        for (const models::ControlResidualShape& r :
             model.control_net().residual_shapes(shape.latent_w, shape.latent_h)) {
            const std::vector<float> none(static_cast<size_t>(r.values() * b));
            g.control.push_back(s.input(GGML_TYPE_F32, {r.w, r.h, r.c, b}, none.data(),
                                        ("control" + std::to_string(g.control.size())).c_str()));
        }
        in.control = g.control;
        in.control_strength = shape.control_strength;
    }
    models::UnetBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = model.diffusion_target();
    // The request was validated and the inputs are shaped from the UNet's
    // own config, so the contract holds; a failure here is a bug.
    auto out = model.unet().build(s.ctx(), in, options);
    if (!out.ok()) return Error{"UNet graph: " + out.error().message};
    g.out = model.unet().weights().apply_patches(s.ctx(), *out);
    return g;
}

Result<ControlGraph> build_control_graph(const Model& model, const DiffusionShape& shape) {
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
    g.out = model.control_net().weights().apply_patches(s.ctx(), *out);
    return g;
}

int64_t single_chunk_tokens(const Model& model) {
    int64_t tokens = 0;
    for (const TextEncoder& te : model.text_encoders()) {
        if (!te.use->context) continue;
        tokens = te.t5 ? te.use->max_length : te.llm ? te.use->plan_tokens : te.network->config().context;
    }
    return tokens;
}

VaeGraph build_vae_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent) {
    const models::VaeConfig& vc = model.vae().config();
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in = g.session->input(
        GGML_TYPE_F32, {latent_w, latent_h, vc.latent_channels, 1},
        or_zeros(latent, static_cast<size_t>(latent_w * latent_h * vc.latent_channels), zeros), "latent");
    g.out = model.vae().weights().apply_patches(g.session->ctx(),
                                                model.vae().build_decoder(g.session->ctx(), in, model.vae_target()));
    return g;
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
                                VaeEncoding encoding) {
    const models::VaeConfig& vc = model.vae().config();
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in =
        g.session->input(GGML_TYPE_F32, {width, height, vc.image_channels, 1},
                         or_zeros(pixels, static_cast<size_t>(width * height * vc.image_channels), zeros), "image");
    g.out = model.vae().weights().apply_patches(
        g.session->ctx(), encoding == VaeEncoding::Moments
                              ? model.vae().build_encoder_moments(g.session->ctx(), in, model.vae_target())
                              : model.vae().build_encoder(g.session->ctx(), in, model.vae_target()));
    return g;
}

}  // namespace kiln::pipeline
