// The one builder of generation graphs: every module's graph with its
// inputs, shaped as a job shapes them. Generation, VAE tiling, kiln plan,
// auto-fit and the benchmarks all build through here, so a plan measures
// exactly the graph a run computes. Inputs given as null are zero-filled
// (planning and benchmarks only need the shapes).
#pragma once

#include <memory>
#include <vector>

#include "pipeline/model.h"
#include "runtime/graph_session.h"

namespace kiln::pipeline {

// A text encoder over `batch` chunks of `length` tokens.
struct TextEncoderGraph {
    std::unique_ptr<runtime::GraphSession> session;
    // The hidden states ne [width, length, batch], then (when the family
    // pools this encoder) the pooled vectors ne [projection, batch], as one
    // flat output: a graph has one output, whatever segments it runs in.
    ggml_tensor* out = nullptr;
    int64_t pooled_width = 0;  // 0: no pooled vectors follow
};
// `ids`: length * batch token ids (null: zeros); `layer`: clip skip (CLIP
// only; an LLM reads the layers its module declared); a CLIP reads its
// textual-inversion rows from encoder.embeddings; `key_mask`: length *
// batch, 1 real 0 padding (T5 only; null: none).
TextEncoderGraph build_text_encoder_graph(const TextEncoder& encoder, const int32_t* ids, int64_t length, int64_t batch,
                                          int layer, const float* key_mask = nullptr);

// A reference image's latent size (Flux.1-Kontext's -r).
struct LatentSize {
    int64_t w = 0;
    int64_t h = 0;
};

// The diffusion network's inputs of one evaluation over `batch` latents.
struct DiffusionShape {
    int64_t latent_w = 0;
    int64_t latent_h = 0;
    int64_t batch = 1;
    int64_t tokens = 77;  // context rows per batch item
    bool flash_attention = false;
    // Flux: the reference latents' sizes (Kontext), and whether the text
    // tokens' padding is masked (Chroma).
    std::vector<LatentSize> refs;
    bool mask = false;
    bool increase_ref_index = false;  // --increase-ref-index (models::flux_rope_table)
    std::vector<int> skip_blocks;     // skip-layer guidance's pass (models::FluxBuildOptions)
    // The UNet takes the ControlNet's residuals (Model::has_control_net()),
    // times this strength.
    bool control = false;
    float control_strength = 1.0f;
};

// The inputs are the graph's; set them with session->set_input. Those a
// network does not take are null.
struct DiffusionGraph {
    std::unique_ptr<runtime::GraphSession> session;
    DiffusionShape shape;
    ggml_tensor* x = nullptr;          // ne [W, H, in_channels, batch]
    ggml_tensor* timesteps = nullptr;  // ne [batch]: the UNet's t, the DiT's sigma
    ggml_tensor* context = nullptr;    // ne [context width, tokens, batch]
    // The UNet's label_emb vector ne [adm width, batch] (SDXL), or the DiT's
    // pooled vector ne [vec_dim, batch] (Flux).
    ggml_tensor* y = nullptr;
    ggml_tensor* guidance = nullptr;  // Flux-dev: ne [batch] distilled guidance
    std::vector<ggml_tensor*> refs;   // Kontext: ne [w, h, channels, batch] each
    // Chroma: the key mask ne flux_attention_mask_shape() over the tokens.
    ggml_tensor* mask = nullptr;
    // The ControlNet's residuals, ne [w, h, c, batch] each
    // (models::ControlNet::residual_shapes); set them from ControlGraph::out.
    std::vector<ggml_tensor*> control;
    ggml_tensor* out = nullptr;  // ne [W, H, out_channels, batch]
};
// An error only when the shapes break the UNet's contract (a bug upstream).
Result<DiffusionGraph> build_diffusion_graph(const Model& model, const DiffusionShape& shape);
// The ControlNet's graph over the diffusion network's inputs of `shape` and
// the control image (planar RGB in [0, 1] at 8x the latent's size, batch 1:
// every batch item reads the same condition).
struct ControlGraph {
    std::unique_ptr<runtime::GraphSession> session;
    DiffusionShape shape;
    ggml_tensor* x = nullptr;          // ne [W, H, latent channels, batch]
    ggml_tensor* timesteps = nullptr;  // ne [batch]
    ggml_tensor* context = nullptr;    // ne [context width, tokens, batch]
    ggml_tensor* y = nullptr;          // SDXL's label_emb vector ne [adm width, batch], else null
    ggml_tensor* hint = nullptr;       // ne [8 W, 8 H, hint channels, 1]
    ggml_tensor* out = nullptr;        // every residual, flattened (models::ControlNet::build)
};
// An error only when the shapes break the ControlNet's contract (a bug upstream).
Result<ControlGraph> build_control_graph(const Model& model, const DiffusionShape& shape);
// The number of tokens a job's context has when its prompts fit one chunk
// (CLIP's 77), T5's fixed length, or the prompt length kiln plan assumes for
// an LLM (TextEncoderUse::plan_tokens).
int64_t single_chunk_tokens(const Model& model);

// The VAE's decoder on a latent of latent_w x latent_h, or its encoder on
// an image of width x height pixels.
struct VaeGraph {
    std::unique_ptr<runtime::GraphSession> session;
    ggml_tensor* out = nullptr;
};
VaeGraph build_vae_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent);
// --taesd's decoder on the scaled latent: an image ne [W, H, 3, 1] in about [0, 1].
VaeGraph build_taesd_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent);
// What the encoder graph gives: the latent distribution's mean, or its mean
// then its log variance (to draw a sample, as sd-cli and A1111 do).
enum class VaeEncoding { Mean, Moments };
VaeGraph build_vae_encode_graph(const Model& model, int64_t width, int64_t height, const float* pixels,
                                VaeEncoding encoding = VaeEncoding::Mean);

}  // namespace kiln::pipeline
