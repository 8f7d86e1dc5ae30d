// The one builder of generation graphs: every module's graph with its
// inputs, shaped as a job shapes them. Generation, VAE tiling, kiln plan,
// auto-fit and the benchmarks all build through here, so a plan measures
// exactly the graph a run computes. Inputs given as null are zero-filled
// (planning and benchmarks only need the shapes).
#pragma once

#include <array>
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
// batch, 1 real 0 padding (T5 only; null: none). An LLM's image rows
// (models::TextEncodeShape::image_grids; `rows` their rows in order).
TextEncoderGraph build_text_encoder_graph(const TextEncoder& encoder, const int32_t* ids, int64_t length, int64_t batch,
                                          int layer, const float* key_mask = nullptr,
                                          const std::vector<models::TokenGrid>& image_grids = {},
                                          const float* rows = nullptr);

// The vision tower (Model::has_vision) over one image ne [width, height, 3]
// with values in [0, 1] (null: zeros), at sides the tower takes; out ne
// [out_width, tokens]. An error when the tower refuses the size.
struct VisionGraph {
    std::unique_ptr<runtime::GraphSession> session;
    ggml_tensor* out = nullptr;
};
Result<VisionGraph> build_vision_graph(const Model& model, const float* image, int64_t width, int64_t height);

// The diffusion network's graph of one evaluation: the inputs its network
// made (set the per-evaluation ones with session->set_input) and its output.
struct DiffusionGraph : models::DiffusionTensors {
    std::unique_ptr<runtime::GraphSession> session;
    models::DiffusionShape shape;
};
// `shape.target` is the module's (placement's); an error only when the
// shapes break the network's contract (a bug upstream).
Result<DiffusionGraph> build_diffusion_graph(const Model& model, models::DiffusionShape shape);
// The ControlNet's residual shapes at `shape`'s latent size, times
// `strength`, into `shape` (Model::has_control_net()).
void add_control_residuals(const Model& model, models::DiffusionShape& shape, float strength);
// The ControlNet's graph over the diffusion network's inputs of `shape` and
// the control image (planar RGB in [0, 1] at 8x the latent's size, batch 1:
// every batch item reads the same condition).
struct ControlGraph {
    std::unique_ptr<runtime::GraphSession> session;
    models::DiffusionShape shape;
    ggml_tensor* x = nullptr;          // ne [W, H, latent channels, batch]
    ggml_tensor* timesteps = nullptr;  // ne [batch]
    ggml_tensor* context = nullptr;    // ne [context width, tokens, batch]
    ggml_tensor* y = nullptr;          // SDXL's label_emb vector ne [adm width, batch], else null
    ggml_tensor* hint = nullptr;       // ne [8 W, 8 H, hint channels, 1]
    ggml_tensor* out = nullptr;        // every residual, flattened (models::ControlNet::build)
};
// An error only when the shapes break the ControlNet's contract (a bug upstream).
Result<ControlGraph> build_control_graph(const Model& model, const models::DiffusionShape& shape);
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
// One chunk of a video's decode or encode (AutoencoderNetwork::decode_chunk,
// encode_chunk): the input (a decode's VAE latent ne [w, h, channels, 1],
// an encode's pixels ne [W, H, 3, frames] in [-1, 1]) and the previous
// chunk's history, of `history_shapes` (none at the clip's start), all
// zeros until set; out is the chunk's frames (an encode's latent, the
// distribution's mean), and chunk.history, the graph's other outputs, is
// readable after the run. An error when the VAE takes no clips or the
// history does not fit.
struct ClipChunkGraph {
    std::unique_ptr<runtime::GraphSession> session;
    ggml_tensor* input = nullptr;
    std::vector<ggml_tensor*> history;
    models::ClipChunk chunk;
    ggml_tensor* out = nullptr;
};
Result<ClipChunkGraph> build_clip_chunk_graph(const Model& model, int64_t latent_w, int64_t latent_h,
                                              const std::vector<std::array<int64_t, 4>>& history_shapes);
Result<ClipChunkGraph> build_clip_encode_chunk_graph(const Model& model, int64_t width, int64_t height, int64_t frames,
                                                     const std::vector<std::array<int64_t, 4>>& history_shapes);
// --taesd's decoder on the scaled latent: an image ne [W, H, 3, 1] in about [0, 1].
VaeGraph build_taesd_decode_graph(const Model& model, int64_t latent_w, int64_t latent_h, const float* latent);
// `encoding`: the latent distribution's mean, or its mean then its log
// variance (models::LatentEncoding).
VaeGraph build_vae_encode_graph(const Model& model, int64_t width, int64_t height, const float* pixels,
                                models::LatentEncoding encoding = models::LatentEncoding::Mean);

}  // namespace kiln::pipeline
