// One adapter file as the weight changes it holds: LoRA (kohya lora_down /
// lora_up / alpha, PEFT and diffusers lora_A / lora_B), LyCORIS LoHa
// (hada_*), LoKr (lokr_*) and full differences (diff, diff_b), each with
// Tucker cores and DoRA magnitudes where LyCORIS writes them, in
// safetensors, GGUF or .ckpt/.pt. Each layer
// is keyed by the name the file gives it with the adapter's suffix removed
// ("lora_unet_down_blocks_0_attentions_0_proj_in"); which of a model's
// weights that names is pipeline/lora_targets.h's business.
//
// The weight change of a layer at strength s is, as kohya's and ComfyUI's
// loaders compute it (W in PyTorch's [out, in, kh, kw] order):
//   LoRA  s * alpha / rank * up @ down           (rank = down's rows; no alpha: alpha = rank)
//   LoHa  s * alpha / rank * (w1a @ w1b) * (w2a @ w2b)   (rank = w1b's rows; no alpha: 1)
//   LoKr  s * alpha / dim * kron(w1, w2), w1 = w1 or w1a @ w1b, w2 = w2 or w2a @ w2b
//         (dim = the rows of the last factored b; nothing factored or no alpha: 1)
//   diff  s * diff (no alpha)
// Tucker (LyCORIS's use_tucker, convolutions): LoRA's lora_mid [r, r, kh, kw]
// makes down [r, in, kh, kw] = sum_s mid[., s] down[s]; LoHa's hada_t1/t2 and
// LoKr's lokr_t2 make a factor einsum("i j k l, j r, i p -> p r k l", t, b, a)
// (a then holds [rank, out]). Read time folds them in, so the rest of kiln
// sees plain factors.
// DoRA (dora_scale, [out, 1, ...] or [1, in, ...]) rescales W + change, as
// ComfyUI's weight_decompose does: see apply_dora. diff_b adds s * diff_b to
// the layer's bias.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "util/result.h"

namespace kiln::pipeline {

// A matrix read as F32, PyTorch's shape (outermost first).
struct HostTensor {
    std::vector<int64_t> shape;
    std::vector<float> data;

    int64_t rows() const { return shape.empty() ? 1 : shape.front(); }
    int64_t columns() const;  // the product of the other dimensions
};

// Full: a whole weight difference (LyCORIS's "full", diff); BiasOnly: a
// layer that changes only its bias (diff_b).
enum class AdapterKind { LoRA, LoHa, LoKr, Full, BiasOnly };
const char* adapter_kind_name(AdapterKind kind);  // "LoRA", "LoHa", "LoKr", "diff", "diff_b"

struct LayerAdapter {
    std::string key;  // the file's layer name, without the adapter suffix
    AdapterKind kind = AdapterKind::LoRA;
    // LoRA: down, up. LoHa: w1a, w1b, w2a, w2b (with Tucker cores: w1 and w2,
    // the whole factors). LoKr: w1 or w1a and w1b, w2 or w2a and w2b. Full: diff.
    std::optional<HostTensor> down, up, w1, w1a, w1b, w2, w2a, w2b, diff;
    std::optional<HostTensor> mid, t1, t2;  // Tucker cores, folded in at read time
    std::optional<HostTensor> dora_scale;   // DoRA magnitudes
    std::optional<HostTensor> diff_b;       // the bias's change
    std::optional<float> alpha;

    bool changes_weight() const { return kind != AdapterKind::BiasOnly; }

    // alpha / rank, or 1, as the header says.
    float scale() const;
    // LoRA's factors as matrices: down [rank, in], up [out, rank].
    int64_t rank() const { return down->rows(); }
    // The change at strength 1, [out, in] (a convolution's in = in * kh * kw), for
    // a weight of `out` rows and `in` columns; an error names the layer when the
    // factors do not make that shape.
    Result<std::vector<float>> dense_delta(int64_t out, int64_t in) const;
    // Rows and columns of the weight this adapter changes (from its factors).
    int64_t out_rows() const;
    int64_t in_columns() const;
};

struct AdapterFile {
    std::string path;
    std::vector<LayerAdapter> layers;
    // Tensors that belong to no adapter kiln applies (unknown suffixes,
    // an alpha without factors): named at -v.
    std::vector<std::string> unused;
};

// Reads and groups every adapter of the file. Errors (bad file): the file
// cannot be read, a layer lacks one of its factors or has factors whose
// shapes do not chain, an alpha that is not one finite number, or the file
// holds no adapter at all.
Result<AdapterFile> read_adapter_file(const std::string& path);

// The part of `layer`'s change that lands on rows [first, first + count)
// of the weight it changes, after the rows' two halves are swapped when
// `swap_halves`, as an adapter of its own: a LoRA keeps its down and rank
// (and so its alpha) with those rows of its up; the other kinds become the
// rows of their dense change (alpha applied). A bias change and per-row
// DoRA magnitudes are cut alike. Error (bad file): DoRA magnitudes per
// input channel, whose norm runs over every row and so cannot be cut.
Result<LayerAdapter> adapter_rows(const LayerAdapter& layer, int64_t first, int64_t count, bool swap_halves);

// DoRA on rows [first_row, first_row + rows) of `weight` (row-major,
// `columns` wide), as ComfyUI's weight_decompose: c = W + delta (alpha
// included, strength not); n = the norm of each row of W when dora_scale
// has a value per row (ComfyUI takes W's norm there, where LyCORIS and PEFT
// take c's), else of each column of c; W += strength * (c * dora_scale /
// (n + FLT_EPSILON) - W). An error names the layer when dora_scale has
// neither shape.
Status apply_dora(const LayerAdapter& layer, std::vector<float>& weight, int64_t first_row, int64_t rows,
                  int64_t columns, const std::vector<float>& delta, float strength);

}  // namespace kiln::pipeline
