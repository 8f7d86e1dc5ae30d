// The seam every network fills (docs/architecture.md, "Networks"). A network is one file
// pair under src/models/nets/ and one line in src/models/nets/registry.cpp:
// it recognises its weights and configures itself from them (the registry's
// probes and create), declares its tensors through io::WeightDeclarer, makes
// its own graph inputs (host tables included) through nn::GraphInputs,
// builds its graph with cut markers, and states what it can take as data
// (DiffusionCapabilities), so the pipeline never asks which network it runs.
//
// A network plays one of a few roles, each an interface below: a diffusion
// network (UNet, DiTs), a text encoder (CLIP, T5, LLMs), an autoencoder
// (SD's and Flux's KL autoencoder, FLUX.2's), or a network the pipeline holds
// by its concrete type because kiln has one of its kind (the ControlNet, the
// preview decoder, the upscaler).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ggml.h"
#include "io/name_map.h"
#include "nn/graph_inputs.h"
#include "nn/layers.h"
#include "util/result.h"

namespace kiln::models {

class DiffusionNetwork;
class TextEncoderNetwork;
class AutoencoderNetwork;
class VisionEncoderNetwork;
class ControlNet;

class Network {
  public:
    virtual ~Network() = default;

    // The role views: the network's own interface for its role, or null.
    virtual const DiffusionNetwork* as_diffusion() const { return nullptr; }
    virtual const TextEncoderNetwork* as_text_encoder() const { return nullptr; }
    virtual const AutoencoderNetwork* as_autoencoder() const { return nullptr; }
    virtual const VisionEncoderNetwork* as_vision_encoder() const { return nullptr; }

    // LoRA: whether files trained for the model change this network's
    // weights (a preview decoder's and a ControlNet's are never targets).
    virtual bool takes_lora() const { return true; }
    // LoRA: the network's layers are named by the SD families' diffusers
    // and HF name tables (io/name_map.h); for a UNet, with its block layout.
    virtual bool uses_sd_name_tables() const { return false; }
    virtual std::optional<io::UnetLayout> unet_layout() const { return std::nullopt; }
    // LoRA: the parts of a fused layer `stem` as other namings split it, in
    // row order (diffusers' q, k, v of a DiT's fused projection); `stem`
    // itself when it is not fused.
    virtual std::vector<std::string> lora_split_names(const std::string& stem) const { return {stem}; }
    // LoRA, the other way round: the layer of another naming that weight
    // `stem` is part `part` of `parts` (BFL's fused qkv, whose rows
    // diffusers' to_q, to_k and to_v hold apart), or is whole under another
    // name (parts 1). LoraTargets takes the part's rows of that layer from
    // the widths of its sibling parts.
    struct LoraFusedLayer {
        std::string stem;
        int part = 0;
        int parts = 1;
    };
    virtual std::optional<LoraFusedLayer> lora_fused_layer(const std::string& /*stem*/) const { return std::nullopt; }
    // LoRA: whether the other naming's layer for weight `stem` (either
    // direction above) holds its rows' two halves the other way round
    // (diffusers' norm_out.linear is scale then shift, BFL's final
    // adaLN_modulation shift then scale).
    virtual bool lora_other_name_swaps_halves(const std::string& /*stem*/) const { return false; }
};

// ---- Diffusion networks ----------------------------------------------------

// What the planes of x after the latent's hold, when a network takes more
// than it predicts (DiffusionCapabilities::in_channels > out_channels), and
// so how a job fills them from its init image and mask (-i, --mask).
enum class LatentConcat {
    None,
    // SD inpainting UNets: the mask at the latent's size (1 plane), then the
    // masked image's latent. Without a mask: mask 1, latent 0.
    MaskThenMaskedImage,
    // Flux.1-Fill: the masked image's latent, then the pixel mask, each
    // latent pixel's d x d pixels (d the VAE's downscale) as d^2 planes, row
    // by row (BFL's "b (h ph) (w pw) -> b (ph pw) h w"). Without a mask:
    // latent 0, mask 1 (sd-cli's).
    MaskedImageThenPixelMask,
    // Wan's image-to-video and first-last-frame DiTs: a mask of the VAE's
    // temporal_downscale planes per latent frame, then the latent of the clip
    // holding the given frames (pipeline/image_to_video.h); every pass the
    // same.
    FirstFrameCondition,
};

// What a diffusion network takes, decided from its weights, once. The
// request validation, the conditioner and generation read these instead of
// the network's kind.
struct DiffusionCapabilities {
    const char* label = "DiT";  // "UNet", "DiT": messages
    int64_t in_channels = 4;    // latent planes of x (more than out_channels: an inpainting model's concat)
    LatentConcat concat = LatentConcat::None;  // what the planes past out_channels hold
    int64_t out_channels = 4;   // planes of its prediction: the latent's channels
    int64_t context_width = 0;  // width of each text token
    // Width of the stream of tokens its blocks carry (a DiT's dim): what
    // tells two releases of one family apart (Wan 1.3B 1536, 14B 5120); 0: not said.
    int64_t hidden_width = 0;
    // Width of the vector input (SDXL's label_emb, Flux's pooled CLIP-L): 0 for none.
    int64_t vector_width = 0;
    // Image sizes must be multiples of this many latent pixels (a UNet's
    // 2^(levels-1), a DiT's patch), times the VAE's downscale.
    int size_stride = 1;
    // The largest latent side it can take (an MMDiT's position embedding
    // covers pos_embed_max_size patches); 0: no limit of its own.
    int64_t max_latent_side = 0;
    bool guidance = false;           // a distilled-guidance embedding (--guidance)
    // A video network: x holds DiffusionShape::frames latent frames per batch
    // item (Wan); others take one frame.
    bool video = false;
    bool skip_layers = false;        // skip-layer guidance's pass (--slg-scale)
    bool text_mask = false;          // can mask the text padding out of attention
    bool reference_images = false;   // reference latents as extra tokens (-r) are understood
    bool control_residuals = false;  // takes a ControlNet's residuals
    // Can wrap the image's edges (DiffusionShape::target's seams, sd-cli's
    // --circular): its convolutions pad across them and its positions repeat.
    bool seams = false;
    // The text tokens share one attention with the image's (DiTs): a context
    // repeated to another's length would change the result, so contexts of
    // different lengths run their CFG passes apart.
    bool joint_attention = false;
    // The blocks of the loop a block-level step cache (pipeline/block_cache.h)
    // splits into front, middle and back, when the network builds the
    // BlockStage parts of an evaluation; 0: it builds whole evaluations only.
    int64_t cache_blocks = 0;
    // Image context (Wan 2.1 I2V, FLF2V): the width of a vision encoder's
    // rows it reads beside the text (0: none), and of how many images (the
    // first frame; FLF2V the first and the last), their rows one after the other.
    int64_t image_context_width = 0;
    int image_context_images = 0;
    // The first latent frame's tokens can take timestep 0 while the rest
    // take the job's (Wan 2.2's per-token timesteps, TI2V-5B's image-to-video:
    // DiffusionShape::clean_first_frame).
    bool clean_first_frame = false;
    // VACE (Wan 2.1 VACE): the planes per latent frame of the context its
    // VACE blocks read (pipeline/vace_context.h); 0: none.
    int64_t vace_channels = 0;
};

// The part of one evaluation a graph computes. A block-level step cache runs
// the first `front` blocks, then either the rest or, reusing the middle
// blocks' residual, only the last `back` blocks. The stream is the hidden
// state the blocks carry, ne [width, tokens, batch].
enum class BlockStage {
    Whole,   // the evaluation: out is the prediction
    Front,   // the embeddings and blocks [0, front): out is the stream after them, then (batch items after batch
             // items) that stream less the one the first block took
    Rest,    // blocks [front, blocks) on the stream input, and the final layer: out is the prediction, flat, then
             // the middle blocks' residual (the stream before the back blocks less the stream input), flat
    Cached,  // blocks [blocks - back, blocks) on the stream input plus the residual input, and the final layer:
             // out is the prediction
};
struct BlockSplit {
    BlockStage stage = BlockStage::Whole;
    int front = 0;
    int back = 0;
};

// A reference image's latent size (-r).
struct LatentSize {
    int64_t w = 0;
    int64_t h = 0;
};

// One evaluation's shapes: what a graph is built for.
struct DiffusionShape {
    int64_t latent_w = 0;
    int64_t latent_h = 0;
    int64_t batch = 1;
    int64_t tokens = 77;  // context rows per batch item
    bool flash_attention = false;
    std::vector<LatentSize> refs;     // reference latents (reference_images)
    bool mask = false;                // the text padding is masked (text_mask)
    bool increase_ref_index = false;  // --increase-ref-index
    std::vector<int> skip_blocks;     // skip-layer guidance's pass (skip_layers)
    // A ControlNet's residual shapes ([w, h, c] each, batch aside), times
    // control_strength (control_residuals). Empty: no control.
    std::vector<std::array<int64_t, 3>> control;
    float control_strength = 1.0f;
    BlockSplit split;  // cache_blocks networks only
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
    // Latent frames of a video network (capabilities().video); 1 otherwise.
    // x and out are then ne [W, H, frames * channels, batch]: each batch item
    // channel after channel, each channel frame after frame (the original's
    // [C, T, H, W]).
    int64_t frames = 1;
    // Rows of the image context per batch item (image_context_width networks).
    int64_t image_context_rows = 0;
    // The first latent frame is clean: its tokens take timestep 0 (clean_first_frame networks).
    bool clean_first_frame = false;
    // The VACE hints' factor (vace_channels networks; sd-cli's --vace-strength).
    float vace_strength = 1.0f;
};

// The inputs the caller sets before each evaluation; those a network does
// not take are null. Host tables that follow from the shape alone (RoPE,
// index embeddings, caption pads) the network filled when it built them.
struct DiffusionTensors {
    ggml_tensor* x = nullptr;           // ne [W, H, in_channels, batch]
    ggml_tensor* timesteps = nullptr;   // ne [batch]: the UNet's t, the DiT's sigma
    ggml_tensor* context = nullptr;     // ne [context_width, tokens, batch]
    ggml_tensor* y = nullptr;           // ne [vector_width, batch]
    ggml_tensor* guidance = nullptr;    // ne [batch] distilled guidance
    std::vector<ggml_tensor*> refs;     // ne [w, h, channels, batch] each
    ggml_tensor* mask = nullptr;        // the text mask (text_mask_values)
    std::vector<ggml_tensor*> control;  // ne [w, h, c, batch] each
    ggml_tensor* stream = nullptr;      // BlockStage Rest and Cached: the stream after the front blocks
    ggml_tensor* residual = nullptr;    // BlockStage Cached: the middle blocks' residual, the stream's shape
    ggml_tensor* image_context = nullptr;  // ne [image_context_width, image_context_rows, batch]
    ggml_tensor* vace_context = nullptr;   // ne [W, H, frames * vace_channels, batch]
    ggml_tensor* out = nullptr;         // ne [W, H, out_channels, batch]; other stages: see BlockStage
};

// What the family's encoders and the VAE make, for a network to check
// itself against before any graph is built.
struct EncoderOutput {
    std::string module;  // "clip_l", "t5xxl": messages
    std::string label;   // the encoder's own name ("Qwen3-4B"): messages
    int64_t width = 0;   // hidden-state width
    int64_t pooled_width = 0;
    bool context = true;  // its hidden states are part of the context
    bool pooled = false;  // its pooled output feeds the vector input
    // Encoders of one group sit side by side, groups one after the other
    // along the tokens (models::TextEncoderUse::token_group).
    int token_group = 0;
};
struct ConditioningShape {
    std::string family;        // "SDXL": messages
    std::string family_label;  // "SDXL inpainting": messages
    std::vector<EncoderOutput> encoders;
    bool size_embedding = false;  // SDXL's micro-conditioning joins the pooled vector
    int64_t latent_channels = 4;  // the VAE's
    int64_t vae_downscale = 8;    // pixels per latent pixel along each side
    int64_t vae_temporal_downscale = 0;  // frames per latent frame (a video VAE's); 0: images only
};

class DiffusionNetwork : public Network {
  public:
    const DiffusionNetwork* as_diffusion() const override { return this; }
    virtual const DiffusionCapabilities& capabilities() const = 0;
    // An error (BadFile) naming the module whose output this network
    // cannot take.
    virtual Status check_conditioning(const ConditioningShape& shape) const = 0;
    // A ControlNet (--control-net) must have been trained for this network:
    // an error (BadFile) saying what differs. Only for control_residuals.
    virtual Status check_control_net(const ControlNet& net, const std::string& family_label) const {
        (void)net;
        return Error::invalid_request("ControlNets are for UNet models (SD1.x, SD2.x, SDXL); " + family_label +
                                      " has none");
    }
    // Builds one evaluation over `shape` in `inputs`. An error only when
    // the shape breaks the network's contract (a bug upstream: requests are
    // validated against capabilities() first).
    virtual Result<DiffusionTensors> build(nn::GraphInputs& inputs, const DiffusionShape& shape) const = 0;
    // The text mask's values for a batch whose text tokens are real (1) or
    // padding (0), batch item after batch item; text_mask networks only.
    virtual std::vector<float> text_mask_values(const std::vector<float>& text_valid,
                                                const DiffusionShape& shape) const {
        (void)text_valid;
        (void)shape;
        return {};
    }
};

// ---- Text encoders ----------------------------------------------------------

// An image's tokens in a prompt: rows x cols of them from token `first` on, row-major.
struct TokenGrid {
    int64_t first = 0;
    int64_t rows = 0;
    int64_t cols = 0;
};

// How a family uses a text encoder (models::TextEncoderUse), as far as its
// graph is concerned.
struct TextEncodeShape {
    int64_t length = 0;  // tokens per sequence
    int64_t batch = 1;
    int layer = 1;           // hidden states counted from the end (clip skip)
    bool final_norm = true;  // the final layer norm on that layer
    bool pooled = false;     // also the pooled, projected vector (CLIP)
    // `extra_rows` vectors of width(): CLIP's textual-inversion rows for the
    // ids after the vocabulary, pooling at `pooled_token` (their EOS); an
    // LLM's image rows (image_grids, below).
    const float* extra_embeddings = nullptr;
    int64_t extra_rows = 0;
    int32_t pooled_token = -1;
    // T5, an LLM: 1 real, 0 padding per token (length * batch; an LLM: one
    // sequence); null: none.
    const float* key_mask = nullptr;
    // An LLM: HF's hidden_states[k] for each k, joined along the features
    // (FLUX.2 klein's 9, 18, 27); empty: the `layer` as above.
    std::vector<int> hidden_states;
    // An LLM: images in the prompt (Qwen-Image-Edit's), each a grid of
    // tokens; their embeddings are extra_embeddings' rows, grid after grid
    // (HF's masked_scatter of a vision tower's rows over the image pads),
    // and every position turns by multimodal RoPE (HF's get_rope_index).
    std::vector<TokenGrid> image_grids;
};

struct TextEncoderTensors {
    ggml_tensor* tokens = nullptr;  // I32 ne [length, batch]
    // The hidden states ne [width, length, batch], then (when pooled) the
    // pooled vectors ne [pooled_width, batch], as one flat output: a graph
    // has one output, whatever segments it runs in.
    ggml_tensor* out = nullptr;
    int64_t pooled_width = 0;  // 0: no pooled vectors follow
};

class TextEncoderNetwork : public Network {
  public:
    const TextEncoderNetwork* as_text_encoder() const override { return this; }
    virtual int64_t width() const = 0;
    // The pooled vector's width (CLIP's projection, else its width); 0 when
    // it has none.
    virtual int64_t pooled_width() const { return 0; }
    virtual int64_t vocab() const = 0;
    // The most tokens one sequence may have (CLIP's 77 positions); 0: no
    // limit of its own.
    virtual int64_t max_length() const { return 0; }
    // Its layers, for clip skip; 0: clip skip does not apply.
    virtual int64_t clip_skip_layers() const { return 0; }
    // The encoder's own name for messages ("CLIP", "T5", "Qwen3").
    virtual std::string label() const = 0;
    virtual TextEncoderTensors build(nn::GraphInputs& inputs, const TextEncodeShape& shape) const = 0;
};

// ---- Autoencoders -------------------------------------------------------------

// The latent an autoencoder makes, as the pipeline sees it.
struct AutoencoderFormat {
    int64_t image_channels = 3;
    int64_t latent_channels = 4;  // of the latent the sampler works on
    int downscale = 8;            // image pixels per latent pixel, along each side
    bool has_encoder = true;
    // A video autoencoder (decode_chunk): frames per latent frame after the
    // first, whose latent frame is the first frame alone (Wan's 4); 0: an
    // image autoencoder.
    int temporal_downscale = 0;
};

// One chunk of a clip's decode or encode (a video autoencoder's decode_chunk, encode_chunk).
struct ClipChunk {
    ggml_tensor* frames = nullptr;  // ne [W, H, 3, frames]
    // The causal history after this chunk: what the next chunk's
    // decode_chunk takes, in this order and with these shapes. The graph
    // keeps them beside `frames` (runtime::GraphSession::add_output).
    std::vector<ggml_tensor*> history;
};

// What an encoder graph gives: the latent distribution's mean, or its mean
// then its log variance (to draw a sample, as sd-cli and A1111 do).
enum class LatentEncoding { Mean, Moments };

class AutoencoderNetwork : public Network {
  public:
    const AutoencoderNetwork* as_autoencoder() const override { return this; }
    virtual const AutoencoderFormat& format() const = 0;
    // latent ne [w, h, latent_channels, B] (unscaled: the family's latent
    // scale and shift are the pipeline's) -> image ne [W, H, image_channels,
    // B] in [-1, 1].
    virtual ggml_tensor* decode(ggml_context* ctx, ggml_tensor* latent, nn::ComputeTarget target) const = 0;
    // image ne [W, H, image_channels, B] in [-1, 1] -> ne [w, h,
    // latent_channels (x2 for Moments), B]. Requires format().has_encoder.
    virtual ggml_tensor* encode(ggml_context* ctx, ggml_tensor* image, nn::ComputeTarget target,
                                LatentEncoding encoding) const = 0;
    // A video autoencoder (format().temporal_downscale > 0): latent frames
    // ne [w, h, latent_channels, T] continuing a clip, given the history the
    // previous chunk left (empty at the clip's start), decoded to 1 +
    // temporal_downscale (T - 1) frames at the start, temporal_downscale T
    // later; chunks of any length give the whole clip's frames, so memory
    // stays flat as clips grow. All null when `history` does not fit.
    virtual ClipChunk decode_chunk(ggml_context* ctx, ggml_tensor* latent, const std::vector<ggml_tensor*>& history,
                                   nn::ComputeTarget target) const {
        (void)ctx, (void)latent, (void)history, (void)target;
        return {};
    }
    // A video autoencoder: a clip ne [W, H, image_channels, 1 + temporal_downscale k]
    // in [-1, 1] -> its latent ne [w, h, latent_channels (x2 for Moments), 1 + k]
    // (the pipeline's scale and shift not applied). Null when it encodes images only.
    virtual ggml_tensor* encode_clip(ggml_context* ctx, ggml_tensor* video, nn::ComputeTarget target,
                                     LatentEncoding encoding) const {
        (void)ctx, (void)video, (void)target, (void)encoding;
        return nullptr;
    }
    // The same a chunk at a time: the clip's first frame (empty `history`),
    // then temporal_downscale frames at a time with the history the chunk
    // before left; frames is each chunk's latent frame (ClipChunk's frames
    // then hold the latent). All null when the chunk or history does not fit.
    virtual ClipChunk encode_chunk(ggml_context* ctx, ggml_tensor* video, const std::vector<ggml_tensor*>& history,
                                   nn::ComputeTarget target, LatentEncoding encoding) const {
        (void)ctx, (void)video, (void)history, (void)target, (void)encoding;
        return {};
    }
};

// ---- Vision encoders -----------------------------------------------------------

// An image a vision encoder reads: ne [width, height, 3], values in [0, 1],
// sides multiples of size_unit().
struct VisionEncodeShape {
    int64_t width = 0;
    int64_t height = 0;
    const float* image = nullptr;  // the network makes its own inputs from it
    bool flash_attention = false;
    nn::ComputeTarget target = nn::ComputeTarget::Cpu;
};

struct VisionEncoderTensors {
    ggml_tensor* out = nullptr;  // ne [out_width, tokens]
};

// An image encoder: its rows join a text encoder's input (Qwen2.5-VL's vision
// tower in Qwen-Image-Edit's prompt) or the diffusion network's image context
// (CLIP vision in Wan 2.1's image-to-video).
class VisionEncoderNetwork : public Network {
  public:
    const VisionEncoderNetwork* as_vision_encoder() const override { return this; }
    bool takes_lora() const override { return false; }
    virtual int64_t out_width() const = 0;
    // Image sides are multiples of this many pixels.
    virtual int64_t size_unit() const = 0;
    // The one side it takes, square (CLIP's 224); 0: any multiples of size_unit().
    virtual int64_t input_side() const { return 0; }
    // Output rows for an image of width x height.
    virtual int64_t tokens(int64_t width, int64_t height) const = 0;
    virtual VisionEncoderTensors build(nn::GraphInputs& inputs, const VisionEncodeShape& shape) const = 0;
};

}  // namespace kiln::models
