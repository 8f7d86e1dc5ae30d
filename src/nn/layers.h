// ggml building blocks shared by every model: linear, 2-D convolution, layer
// and group norm, activations. Each block is a small struct of weight
// tensors, declared once through io::WeightDeclarer (which checks the shapes) and
// applied in graph builders.
//
// Layout: activations are ggml tensors with ne = [features, tokens, batch] for
// sequences and ne = [W, H, C, N] for images, as ggml's conv ops expect.
#pragma once

#include <functional>
#include <string>

#include "ggml.h"
#include "io/weight_declarer.h"
#include "nn/seams.h"

namespace kiln::nn {

struct Linear {
    ggml_tensor* weight = nullptr;  // ne [in, out]
    ggml_tensor* bias = nullptr;    // ne [out] or null
};
Linear declare_linear(io::WeightDeclarer& w, const std::string& name, int64_t in, int64_t out, bool bias = true);
// x: ne [in, ...] -> ne [out, ...]
ggml_tensor* linear(ggml_context* ctx, const Linear& layer, ggml_tensor* x);
// Rows [first, first + count) of a linear layer's output: views of its
// weight rows and bias, so each part of a fused projection (qkv) is a
// contiguous product of its own.
Linear linear_rows(ggml_context* ctx, const Linear& layer, int64_t first, int64_t count);

struct Conv2d {
    ggml_tensor* weight = nullptr;  // ne [kw, kh, in, out]
    ggml_tensor* bias = nullptr;    // ne [out] or null
    int stride = 1;
    int padding = 0;
};
// `bias` false: a convolution without one (PyTorch's bias=False), no .bias tensor.
Conv2d declare_conv2d(io::WeightDeclarer& w, const std::string& name, int64_t in, int64_t out, int kernel,
                      int stride = 1, int padding = 0, bool bias = true);
// How a graph's layers are built: where they compute, for layers whose best
// form differs (on the CPU convolutions unfold into F32 patches that reach
// BLAS; on a device they use ggml's own im2col and kernels), and the image's
// seams, which every padded convolution reads. A build option of each
// network, set by the caller from placement and the job; never read from the
// weights. Compared with a Place, it says where the graph computes.
struct ComputeTarget {
    enum Place { Cpu, Device };
    Place place = Cpu;
    Seams seams;
    ComputeTarget(Place where = Cpu, Seams edges = {}) : place(where), seams(edges) {}
    bool operator==(Place where) const { return place == where; }
    bool operator!=(Place where) const { return place != where; }
};

// x: ne [W, H, in, N] -> ne [W', H', out, N]
ggml_tensor* conv2d(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, ggml_tensor* x);
// conv2d on the CPU, unfolding and multiplying at most `max_patch_bytes` of
// F32 patches at a time (bands of output rows; at least one row, at most 64
// bands, so a very large image's bands exceed the limit). conv2d uses 64 MiB;
// the same numbers for any limit.
ggml_tensor* conv2d_cpu_in_row_bands(ggml_context* ctx, const Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                                     Seams seams = {});
// conv2d on a device: ggml's im2col and mul_mat (ops every backend has), a
// band of output rows at a time when the patches would be over
// `max_patch_bytes` (at least one row, at most 64 bands): each band unfolds
// only the input rows it reads, its product goes into the output with
// ggml_set, and its patches are freed before the next band's are made.
// `upsample_2x`: of upsample_nearest_2x(x), each band upsampling only its
// rows, the upsample never made whole. conv2d uses 64 MiB; each output row
// is the same products for any limit.
ggml_tensor* conv2d_device_in_row_bands(ggml_context* ctx, const Conv2d& layer, ggml_tensor* x, int64_t max_patch_bytes,
                                        bool upsample_2x = false, Seams seams = {});
// The rows [top, bottom) of a convolution's input (any layout, F32):
// ne [in_w, bottom - top, C, N].
using InputRows = std::function<ggml_tensor*(int64_t top, int64_t bottom)>;
// The banded device convolution of an input made a band of rows at a time
// by `input_rows` (a per-pixel norm of x's rows, say), of in_w x in_h
// pixels and `batch` images. `added_to`: null, or a tensor of the output's
// shape (never one input_rows reads) that the result is added to; banded,
// each band's sum goes into added_to's rows in place (its values are then
// gone), so the sum is not a tensor of its own. The same numbers as
// ggml_add(convolution, added_to).
// With `seams`, rows above and below the image are read from its other
// edge, and columns beyond its sides from the other side.
ggml_tensor* conv2d_on_device_in_row_bands(ggml_context* ctx, const Conv2d& layer, int64_t in_w, int64_t in_h,
                                           int64_t batch, const InputRows& input_rows, int64_t max_patch_bytes,
                                           ggml_tensor* added_to = nullptr, Seams seams = {});
// A 1x1 convolution (stride 1, no padding) is a linear layer over channels:
// this one, its weights viewed as ne [in, out], for activations already laid
// out as tokens. Same numbers as conv2d, without the two transposes conv2d
// makes around the product for an image.
Linear conv1x1_as_linear(ggml_context* ctx, const Conv2d& layer);

struct Norm {
    ggml_tensor* weight = nullptr;
    ggml_tensor* bias = nullptr;
};
Norm declare_norm(io::WeightDeclarer& w, const std::string& name, int64_t channels);
// Normalises over ne0 (features).
ggml_tensor* layer_norm(ggml_context* ctx, const Norm& norm, ggml_tensor* x, float eps = 1e-5f);
// RMSNorm over ne0 times `weight`.
ggml_tensor* rms_norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* weight, float eps);
// x ne [heads * head_dim, L, B] -> RMSNorm over each head times `weight`
// (a DiT's QK norm): ne [head_dim, heads, L, B].
ggml_tensor* head_rms_norm(ggml_context* ctx, ggml_tensor* x, ggml_tensor* weight, int64_t heads, float eps);
// x: ne [W, H, C, N]; normalises each of `groups` channel groups.
ggml_tensor* group_norm(ggml_context* ctx, const Norm& norm, ggml_tensor* x, int groups = 32, float eps = 1e-5f);
// conv2d of silu(group_norm(x)): a residual block's "norm, SiLU,
// convolution". On the CPU, when x is over `max_patch_bytes` (as a whole
// conv2d would band it), the normalisation is folded into the convolution's
// unfold (nn/im2col_cpu.h), so the normalised tensor, as large as x, is never
// made; the numbers are the unfused graph's, bit for bit. Elsewhere it is
// the three ops. `norm`'s weights must be F32 for the fold (kiln holds
// vectors as F32).
// `added_to` (a residual block's x): the result is added_to + the
// convolution, the same bits as ggml_add. Folded, each band of the
// convolution is added into added_to in place, so neither the convolution's
// output nor the sum is a tensor of its own; added_to's values are then gone.
ggml_tensor* conv2d_of_group_norm_silu(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, const Norm& norm,
                                       ggml_tensor* x, int groups, float eps, int64_t max_patch_bytes = 64ll << 20,
                                       ggml_tensor* added_to = nullptr);

// x * sigmoid(1.702 x): CLIP ViT-L's activation.
ggml_tensor* quick_gelu(ggml_context* ctx, ggml_tensor* x);

// GELU, tanh approximation (PyTorch's approximate="tanh"):
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). On the CPU it is composed
// of exact ops as x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)), since ggml's
// CPU GELU looks x up in an F16 table (about 1e-3 off); on a device it is
// ggml_gelu, which computes the formula.
ggml_tensor* gelu_tanh(ggml_context* ctx, ComputeTarget target, ggml_tensor* x);

// x ne [W, H, C, N] with one more column on the right and one more row at
// the bottom: zeros (the stride-2 downsampler of SD's and Wan's VAE
// encoders pads so), or across a seam the first column or row.
ggml_tensor* pad_right_and_bottom(ggml_context* ctx, ggml_tensor* x, Seams seams);

// Nearest-neighbour 2x upsampling of ne [W, H, C, N].
ggml_tensor* upsample_nearest_2x(ggml_context* ctx, ggml_tensor* x);
// conv2d of upsample_nearest_2x(x): a decoder's upsampler. On the CPU, when
// the upsample would be over `max_patch_bytes`, the convolution's unfold
// reads x where the upsample would hold each sample, so the upsample (four
// times x) is never made; the same numbers.
ggml_tensor* conv2d_of_upsample_2x(ggml_context* ctx, ComputeTarget target, const Conv2d& layer, ggml_tensor* x,
                                   int64_t max_patch_bytes = 64ll << 20);

// Names `x` "cut:<name>": a block boundary where the runtime may cut the
// graph into segments (docs/architecture.md, "The memory system").
ggml_tensor* mark_cut(ggml_tensor* x, const std::string& name);
// Tokens [first, first + count) of x ne [width, L, B], contiguous. Named
// "tokens": ggml names a view after its source ("cut:layers.0 (view)"),
// which would read as another cut marker.
ggml_tensor* token_range(ggml_context* ctx, ggml_tensor* x, int64_t first, int64_t count);

}  // namespace kiln::nn
