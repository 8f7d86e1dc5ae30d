// A DiT's patch tokens: a latent ne [W, H, C, B] cut into p x p patches, one
// token per patch in row-major order, and back. The order of a token's
// features differs between releases: BFL's Flux packs (c ph pw), channel
// slowest; Tongyi's Z-Image packs (ph pw c), channel fastest.
#pragma once

#include <cstdint>

#include "ggml.h"

namespace kiln::nn {

enum class PatchFeatures {
    ChannelSlowest,  // "b c (h ph) (w pw) -> b (h w) (c ph pw)" (Flux)
    ChannelFastest,  // "c (h ph) (w pw) -> (h w) (ph pw c)" (Z-Image)
};

// ne [W, H, C, B] (W, H multiples of p) -> [C p p, (H/p)(W/p), B].
ggml_tensor* patchify(ggml_context* ctx, ggml_tensor* x, int p, PatchFeatures order);
// The inverse: ne [C p p, h w, B] -> [w p, h p, C, B].
ggml_tensor* unpatchify(ggml_context* ctx, ggml_tensor* x, int64_t w, int64_t h, int p, PatchFeatures order);

}  // namespace kiln::nn
