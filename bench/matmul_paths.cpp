#include "matmul_paths.h"

#include <cstdlib>

#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "runtime/blas_device.h"
#include "runtime/graph_flops.h"

namespace kiln::bench {

bool cpu_scheduler_has_blas() {
#ifdef GGML_USE_BLAS
    return std::getenv("KILN_NO_BLAS") == nullptr;
#else
    return false;
#endif
}

namespace {

// The answer of the BLAS device kiln's scheduler asks (runtime/blas_device.h).
bool blas_takes(const ggml_tensor* node) {
    ggml_backend_dev_t device = runtime::blas_device();
    return device && ggml_backend_dev_supports_op(device, node);
}

std::string cpu_path(ggml_type type) {
    const ggml_type dot = ggml_get_type_traits_cpu(type)->vec_dot_type;
    return std::string("CPU: vec_dot ") + ggml_type_name(type) + " x " + ggml_type_name(dot);
}

}  // namespace

void add_matmul_paths(const std::string& network, const std::vector<ggml_cgraph*>& graphs, bool blas,
                      std::vector<MatmulPathRow>* rows) {
    for (ggml_cgraph* graph : graphs) {
        if (!graph) continue;
        for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
            const ggml_tensor* node = ggml_graph_node(graph, i);
            if (node->op != GGML_OP_MUL_MAT) continue;
            const ggml_type type = node->src[0]->type;
            const bool on_blas = blas && blas_takes(node);
            const std::string path =
                on_blas ? (type == GGML_TYPE_F32 ? "BLAS: sgemm" : "BLAS: to_float + sgemm") : cpu_path(type);
            MatmulPathRow* row = nullptr;
            for (MatmulPathRow& r : *rows) {
                if (r.network == network && r.type == ggml_type_name(type) && r.path == path) row = &r;
            }
            if (!row) {
                rows->push_back({network, ggml_type_name(type), path, 0, 0});
                row = &rows->back();
            }
            ++row->products;
            row->flops += runtime::node_flops(node);
        }
    }
}

}  // namespace kiln::bench
