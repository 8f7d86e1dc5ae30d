// A decoder's upsampler and the first half of the residual block after it,
// computed on the CPU a band of rows at a time, so that the upsampler's
// output x = conv(upsample_2x(y)) is never held whole.
//
// At the top level of a 1024x1024 VAE decode, x is 256 channels of 1024x1024
// in F32: 1 GiB. The block after it needs x for its group norm's statistics,
// its first convolution and its 1x1 shortcut, and made whole x sits beside
// their two 512 MiB outputs: 2 GiB at once. Here x is made twice, in bands:
// once for the group norm's statistics (nn/band_statistics_cpu.h), and once
// more, each band with the row above and below it, for the convolution and
// the shortcut. What is held is y (a quarter of x's pixels), the two outputs
// and one band's work. The cost is the upsampler's convolution twice
// instead of once: about a tenth more decode time at 1024x1024
// (docs/sdxl.md), which is why it is kept for inputs that are large.
#pragma once

#include <cstdint>
#include <optional>

#include "nn/layers.h"

namespace kiln::nn {

// What the block's second half needs: h = conv1(silu(group_norm(x))) and
// residual = shortcut(x), both ne [2W, 2H, OC, N].
struct UpsampledBlockStart {
    ggml_tensor* h = nullptr;
    ggml_tensor* residual = nullptr;
};

// For y ne [W, H, C, N] F32 with contiguous rows; `upsample` and `conv1`
// 3x3, stride 1, padding 1; `shortcut` 1x1 (a block whose channels change:
// without a shortcut the residual is x itself, which would have to be held
// whole); `norm`'s vectors F32. Bands unfold at most `max_patch_bytes` of
// patches (at least one row each). nullopt for anything else: the caller
// builds the usual ops.
std::optional<UpsampledBlockStart> upsampled_block_start_cpu(ggml_context* ctx, const Conv2d& upsample,
                                                             ggml_tensor* y, const Norm& norm, int groups, float eps,
                                                             const Conv2d& conv1, const Conv2d& shortcut,
                                                             int64_t max_patch_bytes);

}  // namespace kiln::nn
