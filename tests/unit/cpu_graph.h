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

}  // namespace kiln::test
