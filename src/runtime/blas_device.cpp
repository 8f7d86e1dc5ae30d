#include "runtime/blas_device.h"

#include "runtime/proxy_device.h"
#if __has_include("ggml-blas.h")
#include "ggml-blas.h"
#endif

namespace kiln::runtime {

bool is_thin_product(const ggml_tensor* op) {
    return op->op == GGML_OP_MUL_MAT && op->src[0]->type != GGML_TYPE_F32 && op->src[1]->ne[1] < kThinProductRows;
}

ggml_backend_dev_t blas_device() {
#ifdef GGML_USE_BLAS
    static ggml_backend_dev_t device = [] {
        ggml_backend_dev_t real = ggml_backend_reg_dev_get(ggml_backend_blas_reg(), 0);
        ProxyRules rules;
        rules.declines_op = is_thin_product;
        return real ? proxy_device(real, rules) : nullptr;
    }();
    return device;
#else
    return nullptr;
#endif
}

}  // namespace kiln::runtime
