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
                                          int layer, const EmbeddingTable* extra) {
    TextEncoderGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    runtime::GraphSession& s = *g.session;
    std::vector<int32_t> zeros;
    ggml_tensor* tokens =
        s.input(GGML_TYPE_I32, {length, batch}, or_zeros(ids, static_cast<size_t>(length * batch), zeros), "tokens");
    ggml_tensor* extra_rows = nullptr;
    if (extra && extra->rows() > 0) {
        extra_rows = s.input(GGML_TYPE_F32, {extra->width, static_cast<int64_t>(extra->rows())}, extra->vectors.data(),
                             "embeddings");
    }
    models::ClipTextOptions options;
    options.layer_from_end = layer;
    options.final_norm = encoder.use->final_norm;
    options.pooled = encoder.use->pooled;
    options.extra_embeddings = extra_rows;
    const models::ClipTextOutput out = encoder.network->encode(s.ctx(), tokens, options);
    g.out = out.hidden;
    if (out.pooled) {
        ggml_context* c = s.ctx();
        g.pooled_width = out.pooled->ne[0];
        g.out = ggml_concat(c, ggml_reshape_1d(c, ggml_cont(c, out.hidden), ggml_nelements(out.hidden)),
                            ggml_reshape_1d(c, ggml_cont(c, out.pooled), ggml_nelements(out.pooled)), 0);
    }
    return g;
}

Result<DiffusionGraph> build_diffusion_graph(const Model& model, const DiffusionShape& shape) {
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
    models::UnetBuildOptions options;
    options.flash_attention = shape.flash_attention;
    options.target = model.diffusion_target();
    // The request was validated and the inputs are shaped from the UNet's
    // own config, so the contract holds; a failure here is a bug.
    auto out = model.unet().build(s.ctx(), in, options);
    if (!out.ok()) return Error{"UNet graph: " + out.error().message};
    g.out = *out;
    return g;
}

int64_t single_chunk_tokens(const Model& model) { return model.text_encoders().front().network->config().context; }

VaeGraph build_vae_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent) {
    const models::VaeConfig& vc = model.vae().config();
    VaeGraph g;
    g.session = std::make_unique<runtime::GraphSession>();
    std::vector<float> zeros;
    ggml_tensor* in = g.session->input(
        GGML_TYPE_F32, {latent_w, latent_h, vc.latent_channels, 1},
        or_zeros(latent, static_cast<size_t>(latent_w * latent_h * vc.latent_channels), zeros), "latent");
    g.out = model.vae().build_decoder(g.session->ctx(), in, model.vae_target());
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
    g.out = encoding == VaeEncoding::Moments
                ? model.vae().build_encoder_moments(g.session->ctx(), in, model.vae_target())
                : model.vae().build_encoder(g.session->ctx(), in, model.vae_target());
    return g;
}

}  // namespace kiln::pipeline
