#include "nn/upsampled_block_cpu.h"

#include <algorithm>

#include "nn/band_statistics_cpu.h"
#include "nn/concat_rows_cpu.h"
#include "nn/conv_cpu.h"
#include "nn/im2col_cpu.h"

namespace kiln::nn {
namespace {

bool is_3x3_same(const Conv2d& c) {
    return c.weight->ne[0] == 3 && c.weight->ne[1] == 3 && c.stride == 1 && c.padding == 1;
}

}  // namespace

std::optional<UpsampledBlockStart> upsampled_block_start_cpu(ggml_context* ctx, const Conv2d& upsample,
                                                             ggml_tensor* y, const Norm& norm, int groups, float eps,
                                                             const Conv2d& conv1, const Conv2d& shortcut,
                                                             int64_t max_patch_bytes) {
    const int64_t C = upsample.weight->ne[3];
    if (y->type != GGML_TYPE_F32 || y->nb[0] != sizeof(float) || !is_3x3_same(upsample) || !is_3x3_same(conv1) ||
        shortcut.weight->ne[0] != 1 || shortcut.weight->ne[1] != 1 || shortcut.stride != 1 ||
        shortcut.padding != 0 || upsample.weight->ne[2] != y->ne[2] || conv1.weight->ne[2] != C ||
        shortcut.weight->ne[2] != C || norm.weight->type != GGML_TYPE_F32 || norm.bias->type != GGML_TYPE_F32 ||
        ggml_nelements(norm.weight) != C || groups < 1) {
        return std::nullopt;
    }
    const int64_t W = 2 * y->ne[0], H = 2 * y->ne[1], N = y->ne[3];
    const int64_t up_k = 9 * y->ne[2], conv_k = 9 * C;
    // Bands of output rows whose patches (the upsampler's, for the band and
    // its two neighbour rows, or conv1's) stay within max_patch_bytes.
    const int64_t row_bytes = std::max(up_k, conv_k) * W * N * static_cast<int64_t>(sizeof(float));
    // At most kMaxBands bands, so that the graph's nodes stay within a
    // constant factor of the unbanded one's at any size.
    constexpr int64_t kMaxBands = 256;
    const int64_t band_rows =
        std::clamp<int64_t>(max_patch_bytes / row_bytes - 2, (H + kMaxBands - 1) / kMaxBands, H);

    ggml_tensor* up_kernel = kernel_matrix_for_cpu(ctx, upsample.weight);
    // Rows [first, first + rows) of x, ordered after `after` when given.
    auto x_rows = [&](int64_t first, int64_t rows, ggml_tensor* after) {
        ggml_tensor* patches = im2col_upsampled_2x_f32_cpu(ctx, upsample.weight, y, 1, 1, first, rows, after);
        return pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, patches, up_k, W * rows * N), up_kernel, W, rows,
                                           N, upsample.bias);
    };

    // First pass: the group norm's statistics over x's bands, each freed
    // once summed.
    ggml_tensor* sums = nullptr;
    for (int64_t first = 0; first < H; first += band_rows) {
        sums = add_group_sums_cpu(ctx, sums, x_rows(first, std::min(band_rows, H - first), sums), groups);
    }
    ggml_tensor* statistics = group_norm_statistics_of_sums_cpu(ctx, sums, eps);

    // Second pass: each band of x again with its neighbour rows (a slab),
    // unfolded normalised for conv1 and as it is for the shortcut. The
    // slab's rows past the image are the convolution's zero padding, so a
    // slab's first and last rows are the band's neighbours or the padding.
    // A slab's first two rows are the previous slab's last two, copied
    // rather than made again. The graph makes each slab, its h band and its
    // residual band before the next slab (the `after` sources): otherwise
    // one output's bands would all be made first and every slab held for
    // the other's.
    ggml_tensor* conv1_kernel = kernel_matrix_for_cpu(ctx, conv1.weight);
    ggml_tensor* shortcut_kernel = kernel_matrix_for_cpu(ctx, shortcut.weight);
    UpsampledBlockStart out;
    ggml_tensor* slab = nullptr;
    int64_t slab_first = 0;
    for (int64_t first = 0; first < H; first += band_rows) {
        const int64_t rows = std::min(band_rows, H - first);
        const int64_t next_first = std::max<int64_t>(0, first - 1);
        const int64_t next_end = std::min(H, first + rows + 1);
        if (!slab) {
            slab = x_rows(next_first, next_end - next_first, out.residual);
        } else {
            const int64_t made_end = slab_first + slab->ne[1];
            ggml_tensor* kept = ggml_view_4d(ctx, slab, W, made_end - next_first, C, N, slab->nb[1], slab->nb[2],
                                             slab->nb[3], static_cast<size_t>(next_first - slab_first) * slab->nb[1]);
            slab = next_end > made_end
                       ? ggml_concat(ctx, kept, x_rows(made_end, next_end - made_end, out.residual), 1)
                       : ggml_cont(ctx, kept);
        }
        slab_first = next_first;
        ggml_tensor* normalised = im2col_group_norm_silu_f32_cpu(ctx, conv1.weight, slab, statistics, norm.weight,
                                                                 norm.bias, 1, 1, first - slab_first, rows);
        ggml_tensor* h = pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, normalised, conv_k, W * rows * N),
                                                     conv1_kernel, W, rows, N, conv1.bias);
        out.h = out.h ? set_rows_cpu(ctx, out.h, h, first) : image_from_first_rows_cpu(ctx, h, H);
        ggml_tensor* plain = im2col_f32_cpu(ctx, shortcut.weight, slab, 1, 0, first - slab_first, rows, out.h);
        ggml_tensor* residual = pixels_by_channels_to_image(ctx, ggml_reshape_2d(ctx, plain, C, W * rows * N),
                                                            shortcut_kernel, W, rows, N, shortcut.bias);
        out.residual =
            out.residual ? set_rows_cpu(ctx, out.residual, residual, first) : image_from_first_rows_cpu(ctx, residual, H);
    }
    return out;
}

}  // namespace kiln::nn
