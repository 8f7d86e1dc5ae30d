// Runs a graph of ops built in a test's ggml context on ggml's CPU backend,
// with its compute buffer allocated by ggml-alloc, and reads the outputs
// back: for tests of graph builders that also check how large that buffer is.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"

namespace kiln::test {

struct CpuGraphResult {
    std::vector<std::vector<float>> outputs;  // F32 values, in the order given
    size_t compute_bytes = 0;
};

inline CpuGraphResult compute_on_cpu(ggml_backend_t cpu, ggml_context* ctx, const std::vector<ggml_tensor*>& outputs,
                                     size_t max_nodes) {
    ggml_cgraph* graph = ggml_new_graph_custom(ctx, max_nodes, false);
    for (ggml_tensor* t : outputs) ggml_build_forward_expand(graph, t);
    ggml_gallocr_t allocator = ggml_gallocr_new(ggml_backend_get_default_buffer_type(cpu));
    CpuGraphResult r;
    EXPECT_TRUE(ggml_gallocr_alloc_graph(allocator, graph));
    r.compute_bytes = ggml_gallocr_get_buffer_size(allocator, 0);
    EXPECT_EQ(ggml_backend_graph_compute(cpu, graph), GGML_STATUS_SUCCESS);
    for (ggml_tensor* t : outputs) {
        r.outputs.emplace_back(static_cast<size_t>(ggml_nelements(t)));
        ggml_backend_tensor_get(t, r.outputs.back().data(), 0, ggml_nbytes(t));
    }
    ggml_gallocr_free(allocator);
    return r;
}

// The compute buffer ggml-alloc plans for `graph` (its activations; the
// leaves it reads, the weights and inputs, are kept out with a placeholder
// buffer): measured, never run, so a full-size network's graph is measured
// without its weights.
inline size_t planned_compute_bytes(ggml_cgraph* graph) {
    ggml_backend_buffer_t placeholder = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), 1);
    std::vector<ggml_tensor*> placed;
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        for (ggml_tensor* src : ggml_graph_node(graph, i)->src) {
            if (src && src->op == GGML_OP_NONE && !src->view_src && !src->buffer) {
                src->buffer = placeholder;
                placed.push_back(src);
            }
        }
    }
    ggml_gallocr_t allocator = ggml_gallocr_new(ggml_backend_cpu_buffer_type());
    size_t bytes = 0;
    ggml_gallocr_reserve_n_size(allocator, graph, nullptr, nullptr, &bytes);
    ggml_gallocr_free(allocator);
    for (ggml_tensor* t : placed) t->buffer = nullptr;
    ggml_backend_buffer_free(placeholder);
    return bytes;
}

}  // namespace kiln::test
