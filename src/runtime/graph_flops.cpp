#include "runtime/graph_flops.h"

namespace kiln::runtime {

uint64_t node_flops(const ggml_tensor* node) {
    const auto elements = [](const ggml_tensor* t) { return static_cast<uint64_t>(ggml_nelements(t)); };
    switch (node->op) {
        case GGML_OP_MUL_MAT: {
            // The result holds ne01 x ne11 dot products of length ne00 for
            // each of its batches (ne12 * ne13, src0 broadcast over them).
            const uint64_t k = static_cast<uint64_t>(node->src[0]->ne[0]);
            return 2 * k * elements(node);
        }
        case GGML_OP_CONV_2D: {
            const ggml_tensor* kernel = node->src[0];  // [KW, KH, IC, OC]
            const uint64_t per_output = static_cast<uint64_t>(kernel->ne[0] * kernel->ne[1] * kernel->ne[2]);
            return 2 * per_output * elements(node);
        }
        case GGML_OP_FLASH_ATTN_EXT: {
            const ggml_tensor* q = node->src[0];  // [d, n_q, heads, batch]
            const ggml_tensor* k = node->src[1];  // [d, n_kv, heads_kv, batch]
            const ggml_tensor* v = node->src[2];  // [d_v, n_kv, heads_kv, batch]
            const uint64_t queries = static_cast<uint64_t>(q->ne[1] * q->ne[2] * q->ne[3]);  // every head, batch
            const uint64_t n_kv = static_cast<uint64_t>(k->ne[1]);
            const uint64_t scores = 2 * static_cast<uint64_t>(q->ne[0]) * n_kv * queries;
            const uint64_t weighted_values = 2 * static_cast<uint64_t>(v->ne[0]) * n_kv * queries;
            return scores + weighted_values;
        }
        default: return 0;
    }
}

uint64_t graph_flops(const ggml_cgraph* graph) {
    // ggml's graph accessors take a non-const graph; nothing here changes it.
    ggml_cgraph* g = const_cast<ggml_cgraph*>(graph);
    uint64_t total = 0;
    for (int i = 0; i < ggml_graph_n_nodes(g); ++i) total += node_flops(ggml_graph_node(g, i));
    return total;
}

}  // namespace kiln::runtime
