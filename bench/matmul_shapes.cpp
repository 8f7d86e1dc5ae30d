#include "matmul_shapes.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace kiln::bench {

uint64_t matmul_flops(const MatmulShape& s) {
    return 2 * static_cast<uint64_t>(s.m) * static_cast<uint64_t>(s.k) * static_cast<uint64_t>(s.n) *
           static_cast<uint64_t>(s.batch);
}

std::string describe_shape(const MatmulShape& s) {
    std::string text =
        std::to_string(s.m) + "x" + std::to_string(s.k) + " by " + std::to_string(s.k) + "x" + std::to_string(s.n);
    if (s.batch > 1) text += " (x" + std::to_string(s.batch) + ")";
    return text;
}

namespace {

// The weight a product operand is a view or reshape of ("...attn1.to_q.weight"),
// or "" when the operand was computed.
std::string weight_name(const ggml_tensor* operand) {
    const ggml_tensor* t = operand;
    while (t->view_src) t = t->view_src;
    if (t->op != GGML_OP_NONE || (t->flags & GGML_TENSOR_FLAG_INPUT)) return "";
    return t->name;
}

}  // namespace

std::vector<MatmulShape> graph_matmul_shapes(ggml_cgraph* graph) {
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;  // m, k, n, batch, weight_batch
    std::map<Key, MatmulShape> shapes;
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor* node = ggml_graph_node(graph, i);
        if (node->op != GGML_OP_MUL_MAT) continue;
        const ggml_tensor* src0 = node->src[0];
        const ggml_tensor* src1 = node->src[1];
        MatmulShape s;
        s.k = src0->ne[0];
        s.n = src0->ne[1];
        s.m = src1->ne[1];
        s.batch = src1->ne[2] * src1->ne[3];
        s.weight_batch = src0->ne[2] * src0->ne[3];
        if (const std::string weight = weight_name(src0).empty() ? weight_name(src1) : weight_name(src0);
            !weight.empty()) {
            s.label = weight;
        } else {
            s.label = "activations by activations (attention)";
        }
        const Key key{s.m, s.k, s.n, s.batch, s.weight_batch};
        auto [it, inserted] = shapes.emplace(key, s);
        if (!inserted) ++it->second.count;
    }
    std::vector<MatmulShape> out;
    for (auto& [key, s] : shapes) {
        // Labels name one instance: "input_blocks.1.1...attn1.to_q.weight".
        const std::string prefix = "model.diffusion_model.";
        if (s.label.rfind(prefix, 0) == 0) s.label = s.label.substr(prefix.size());
        if (s.count > 1) s.label = "e.g. " + s.label;
        out.push_back(s);
    }
    std::stable_sort(out.begin(), out.end(), [](const MatmulShape& a, const MatmulShape& b) {
        return matmul_flops(a) * static_cast<uint64_t>(a.count) > matmul_flops(b) * static_cast<uint64_t>(b.count);
    });
    return out;
}

std::vector<MatmulShape> sd15_matmul_shapes() {
    // ggml's operand order (nn/layers.cpp, nn/attention.cpp): a linear layer
    // multiplies [C, HW, 2] activations by its [C, out] weights; an im2col
    // convolution multiplies the weights [9 C_in, C_out] (m = C_out) by the
    // patches [9 C_in, HW * 2] (n = HW * 2); attention multiplies Q by K per
    // head and batch (16 = 8 heads x 2), then the scores by V.
    return {
        {"attn q/k/v/out, proj_in/out, 64x64 level", 4096, 320, 320, 2, 1, 1},
        {"attn q/k/v/out, 32x32 level", 1024, 640, 640, 2, 1, 1},
        {"attn q/k/v/out, 16x16 level", 256, 1280, 1280, 2, 1, 1},
        {"cross-attn k/v from the context", 77, 768, 320, 2, 1, 1},
        {"feed-forward in (GEGLU), 64x64", 4096, 320, 2560, 2, 1, 1},
        {"feed-forward out, 64x64", 4096, 1280, 320, 2, 1, 1},
        {"self-attn Q K^T, 64x64 (head dim 40)", 4096, 40, 4096, 16, 16, 1},
        {"self-attn scores x V, 64x64", 4096, 4096, 40, 16, 16, 1},
        {"conv 3x3 320->320 (im2col), 64x64", 320, 2880, 8192, 1, 1, 1},
        {"conv 3x3 640->640 (im2col), 32x32", 640, 5760, 2048, 1, 1, 1},
        {"conv 3x3 1280->1280 (im2col), 16x16", 1280, 11520, 512, 1, 1, 1},
        {"conv 3x3 1280->1280 (im2col), 8x8", 1280, 11520, 128, 1, 1, 1},
    };
}

std::vector<MatmulShape> llm_matmul_shapes() {
    std::vector<MatmulShape> shapes;
    for (int64_t tokens : {16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048}) {
        const std::string at = ", " + std::to_string(tokens) + " tokens";
        shapes.push_back({"q" + at, tokens, 2560, 4096, 1, 1, 1});
        shapes.push_back({"k, v" + at, tokens, 2560, 1024, 1, 1, 2});
        shapes.push_back({"o" + at, tokens, 4096, 2560, 1, 1, 1});
        shapes.push_back({"gate, up" + at, tokens, 2560, 9728, 1, 1, 2});
        shapes.push_back({"down" + at, tokens, 9728, 2560, 1, 1, 1});
    }
    return shapes;
}

MatmulShape reference_shape() { return {"issue 6 reference (4096x14336 by 14336x512)", 4096, 14336, 512, 1, 1, 1}; }

}  // namespace kiln::bench
