#include "runtime/weight_patches.h"

#include <cstring>
#include <unordered_set>

namespace kiln::runtime {
namespace {

// Which rows of a patched weight a product's operand holds: the weight
// itself, a reshape or cast of all of it, or a view of whole rows (a fused
// q/k/v weight read a third at a time).
struct WeightRows {
    const ggml_tensor* weight = nullptr;
    int64_t first = 0;
    int64_t count = 0;
};

int64_t output_rows(const ggml_tensor* w) { return w->ne[ggml_n_dims(w) - 1]; }

WeightRows rows_read(const ggml_tensor* operand, const WeightPatches& patches) {
    int64_t element_offset = 0;
    const ggml_tensor* t = operand;
    while (!patches.count(t)) {
        if (t->op == GGML_OP_VIEW || t->op == GGML_OP_RESHAPE) {
            const ggml_tensor* src = t->view_src ? t->view_src : t->src[0];
            if (!src) return {};
            element_offset += static_cast<int64_t>(t->view_offs) * ggml_blck_size(src->type) /
                              static_cast<int64_t>(ggml_type_size(src->type));
            t = src;
        } else if ((t->op == GGML_OP_CPY || t->op == GGML_OP_CONT) && element_offset == 0 && t->src[0] &&
                   ggml_nelements(t) == ggml_nelements(t->src[0]) && ggml_is_contiguous(t->src[0])) {
            t = t->src[0];  // a cast (the CPU convolution's F32 kernel) keeps the element order
        } else {
            return {};
        }
    }
    const int64_t rows = output_rows(t);
    const int64_t row_length = ggml_nelements(t) / rows;
    if (operand->ne[0] != row_length || element_offset % row_length != 0 ||
        ggml_nelements(operand) % row_length != 0) {
        return {};
    }
    WeightRows r{t, element_offset / row_length, ggml_nelements(operand) / row_length};
    if (r.first + r.count > rows) return {};
    return r;
}

// The rows [first, first + count) of a matrix stored ne [row length, rows].
ggml_tensor* row_range(ggml_context* ctx, ggml_tensor* m, int64_t first, int64_t count) {
    if (first == 0 && count == m->ne[1]) return m;
    return ggml_view_2d(ctx, m, m->ne[0], count, m->nb[1], static_cast<size_t>(first) * m->nb[1]);
}

// The patch's terms for `product` (a matrix product whose operand number
// `side` reads `rows` of the weight), added to it.
ggml_tensor* patched_product(ggml_context* ctx, ggml_tensor* product, int side, const WeightRows& rows,
                             const WeightPatch& patch) {
    ggml_tensor* x = product->src[side == 0 ? 1 : 0];
    ggml_tensor* sum = product;
    for (const LowRankTerm& term : patch.low_rank) {
        ggml_tensor* up = row_range(ctx, term.up, rows.first, rows.count);
        ggml_tensor* h = ggml_mul_mat(ctx, term.down, x);  // [rank, tokens...]
        // Scaled at the rank's width, not the layer's: the term's only pass
        // over a tensor as large as the layer's output is then the add.
        if (term.scale != 1.0f) h = ggml_scale_inplace(ctx, h, term.scale);
        ggml_tensor* d = side == 0 ? ggml_mul_mat(ctx, up, h) : ggml_mul_mat(ctx, h, up);
        sum = ggml_add(ctx, sum, d);
    }
    for (ggml_tensor* delta : patch.dense) {
        ggml_tensor* flat = ggml_reshape_2d(ctx, delta, ggml_nelements(delta) / output_rows(delta), output_rows(delta));
        ggml_tensor* part = row_range(ctx, flat, rows.first, rows.count);
        sum = ggml_add(ctx, sum, side == 0 ? ggml_mul_mat(ctx, part, x) : ggml_mul_mat(ctx, x, part));
    }
    return sum;
}

bool is_cut_marker(const ggml_tensor* t) { return std::strncmp(t->name, "cut:", 4) == 0; }

}  // namespace

ggml_tensor* apply_weight_patches(ggml_context* ctx, ggml_tensor* out, const WeightPatches& patches) {
    if (patches.empty()) return out;
    // Post-order over everything `out` depends on, so each tensor is
    // visited after its sources have been rewritten.
    std::vector<ggml_tensor*> order;
    std::unordered_set<const ggml_tensor*> seen;
    std::vector<std::pair<ggml_tensor*, int>> stack{{out, 0}};
    seen.insert(out);
    while (!stack.empty()) {
        auto& [t, next] = stack.back();
        if (next < GGML_MAX_SRC) {
            ggml_tensor* src = t->src[next++];
            if (src && seen.insert(src).second) stack.push_back({src, 0});
            continue;
        }
        if (t->view_src && seen.insert(t->view_src).second) {
            stack.push_back({t->view_src, 0});
            continue;
        }
        order.push_back(t);
        stack.pop_back();
    }

    std::unordered_map<const ggml_tensor*, ggml_tensor*> replaced;
    for (ggml_tensor* t : order) {
        for (int i = 0; i < GGML_MAX_SRC; ++i) {
            if (!t->src[i]) continue;
            if (auto it = replaced.find(t->src[i]); it != replaced.end()) t->src[i] = it->second;
        }
        if (t->view_src) {
            if (auto it = replaced.find(t->view_src); it != replaced.end()) {
                // A view made of the weight before it was replaced points
                // into the old data: point it into the replacement's.
                t->view_src = it->second;
                t->buffer = it->second->buffer;
                t->data = it->second->data ? static_cast<char*>(it->second->data) + t->view_offs : nullptr;
            }
        }
        if (auto it = patches.find(t); it != patches.end() && it->second.replacement) {
            replaced[t] = it->second.replacement;
            continue;
        }
        if (t->op != GGML_OP_MUL_MAT) continue;
        for (int side = 0; side < 2; ++side) {
            const WeightRows rows = rows_read(t->src[side], patches);
            if (!rows.weight) continue;
            const WeightPatch& patch = patches.at(rows.weight);
            if (patch.low_rank.empty() && patch.dense.empty()) break;
            ggml_tensor* sum = patched_product(ctx, t, side, rows, patch);
            if (is_cut_marker(t)) {
                ggml_set_name(sum, t->name);
                ggml_format_name(t, "patched product");
            }
            replaced[t] = sum;
            break;
        }
    }
    auto it = replaced.find(out);
    return it == replaced.end() ? out : it->second;
}

}  // namespace kiln::runtime
