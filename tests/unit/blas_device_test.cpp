// kiln's BLAS device (runtime/blas_device.h): ggml's, except that products
// with fewer than 96 activation rows and weights that are not F32 stay on
// ggml-cpu. Asked the way ggml's scheduler asks (supports_op on the device).
#include <gtest/gtest.h>

#include "ggml.h"
#include "runtime/blas_device.h"

namespace kiln::runtime {
namespace {

// A product of weights [2560, 4096] of `type` by `rows` activations, per
// item of a batch of `batch`.
bool blas_takes(ggml_type type, int64_t rows, int64_t batch = 1) {
    ggml_init_params params{4 * ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* weights = ggml_new_tensor_2d(ctx, type, 2560, 4096);
    ggml_tensor* activations = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 2560, rows, batch);
    ggml_tensor* product = ggml_mul_mat(ctx, weights, activations);
    const bool takes = ggml_backend_dev_supports_op(blas_device(), product);
    EXPECT_EQ(is_thin_product(product), type != GGML_TYPE_F32 && rows < kThinProductRows);
    ggml_free(ctx);
    return takes;
}

TEST(BlasDevice, ThinProductsOfWeightsThatAreNotF32StayOnTheCpu) {
    if (!blas_device()) GTEST_SKIP() << "built without BLAS";
    for (ggml_type type : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K}) {
        SCOPED_TRACE(ggml_type_name(type));
        EXPECT_FALSE(blas_takes(type, 37));  // a 37-token prompt: widening the weight would be most of the work
        EXPECT_FALSE(blas_takes(type, 95));
        EXPECT_TRUE(blas_takes(type, 96));
        EXPECT_TRUE(blas_takes(type, 4096));  // a DiT's image tokens
        // The rows of one batch item count, as ggml's own rule counts them:
        // a CFG batch of two 64-token halves stays on the CPU like one half.
        EXPECT_FALSE(blas_takes(type, 64, 2));
    }
    // F32 weights have nothing to widen: ggml's own rule (32 rows and up).
    EXPECT_TRUE(blas_takes(GGML_TYPE_F32, 37));
    EXPECT_FALSE(blas_takes(GGML_TYPE_F32, 31));
}

// Any other op is the real device's answer.
TEST(BlasDevice, OtherOpsAreGgmlsAnswer) {
    if (!blas_device()) GTEST_SKIP() << "built without BLAS";
    ggml_init_params params{4 * ggml_tensor_overhead(), nullptr, /*no_alloc=*/true};
    ggml_context* ctx = ggml_init(params);
    ggml_tensor* a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 64, 64);
    EXPECT_FALSE(ggml_backend_dev_supports_op(blas_device(), ggml_soft_max(ctx, a)));
    ggml_free(ctx);
}

}  // namespace
}  // namespace kiln::runtime
