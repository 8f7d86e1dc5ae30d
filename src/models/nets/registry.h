// The networks kiln can build, one line each (src/models/nets/registry.cpp):
// the tensor names that mark a network in a file and the call that
// configures it from its weights. Adding a network: its pair under
// src/models/nets/ filling one of the interfaces of models/network.h, a
// NetworkKind, and its line in registry.cpp.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/weight_declarer.h"
#include "models/nets/llm_file_defaults.h"
#include "models/network.h"
#include "util/result.h"

namespace kiln::models {

// The networks kiln can build, each a file pair under src/models/nets/ and
// a line below.
enum class NetworkKind {
    ClipText,      // models/nets/clip_text: OpenAI CLIP and OpenCLIP text towers
    Unet,          // models/nets/unet: ldm / sgm UNetModel
    Vae,           // models/nets/vae: AutoencoderKL (SD's, Flux's)
    T5,            // models/nets/t5_encoder: T5 v1.1 encoder (T5-XXL)
    FluxDit,       // models/nets/flux_dit: Flux.1 / Chroma transformer
    Llm,           // models/nets/llm_encoder: decoder-only language model (Qwen3) as a text encoder
    ZImageDit,     // models/nets/z_image_dit: Z-Image's single-stream transformer
    ControlNet,    // models/nets/controlnet: ldm / sgm ControlNet (--control-net, not part of a family)
    Taesd,         // models/nets/taesd: a tiny autoencoder's decoder (--taesd), no family's own module
    Flux2Dit,      // models/nets/flux2_dit: FLUX.2's transformer ([klein], [dev])
    Flux2Vae,      // models/nets/flux2_vae: FLUX.2's autoencoder (a normalised 128-channel latent)
    Mmdit,         // models/nets/mmdit: SD3's and SD3.5's MMDiT (MMDiT-X)
    QwenImageDit,  // models/nets/qwen_image_dit: Qwen-Image's MMDiT (and the Edit models')
    WanVae,        // models/nets/wan_vae: Wan 2.1's causal 3D VAE (Qwen-Image's, one frame)
    QwenVision,    // models/nets/qwen25_vl_vision: Qwen2.5-VL's vision tower (Qwen-Image-Edit's prompt images)
    WanDit,        // models/nets/wan_dit: Wan 2.1 / 2.2's video transformer
    ClipVision,    // models/nets/clip_vision: CLIP's vision tower (Wan 2.1 image-to-video's --clip_vision)
};

// What the family asks of a network beyond its weights.
struct NetworkOptions {
    // Layers at the end the family never reads (Z-Image's hidden_states[-2]
    // never needs the LLM's last layer), left undeclared.
    int unused_last_layers = 0;
    // Only the first this many layers are declared (0: see above); FLUX.2
    // klein reads hidden_states up to 27 of Qwen3's 36.
    int first_layers = 0;
    // A CLIP in HF's naming that is an OpenCLIP tower (SD3's CLIP-G):
    // TextEncoderUse::hf_named_openclip.
    bool hf_named_openclip = false;
    // An LLM's rope theta and epsilon where its file says nothing
    // (TextEncoderUse::llm_defaults).
    LlmFileDefaults llm_defaults;
    // Qwen-Image's DiT: Edit-2511's zero-condition timestep for the
    // references (QwenImageConfig::zero_cond_t) even where the file has no marker.
    bool zero_cond_t = false;
};

struct NetworkEntry {
    NetworkKind kind;
    // Tensor names that mark the network in a file, after its prefix.
    std::vector<std::string> probes;
    // Configures the network from the tensors under weights.prefix() and
    // declares them; an error when they are not this network.
    Result<std::unique_ptr<Network>> (*create)(io::WeightDeclarer& weights, const NetworkOptions& options);
};

const NetworkEntry& network_entry(NetworkKind kind);

}  // namespace kiln::models
