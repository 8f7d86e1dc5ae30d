// OpenBLAS's kernel set (runtime/blas_core.h): the rule for asking for a
// better one, and `kiln` leaving a chosen OPENBLAS_CORETYPE alone.
#include "runtime/blas_core.h"

#include <gtest/gtest.h>

#include "test_files.h"

namespace kiln::runtime {
namespace {

TEST(BlasCore, AnSseFallbackOnAnAvxCpuAsksForItsKernels) {
    EXPECT_EQ(better_openblas_core("Prescott", VectorLevel::Avx512), "SkylakeX");  // Emerald Rapids, OpenBLAS 0.3.21
    EXPECT_EQ(better_openblas_core("Nehalem", VectorLevel::Avx2), "Haswell");
    EXPECT_EQ(better_openblas_core("Prescott", VectorLevel::Avx), "");  // no kernels to gain: Sandybridge is AVX only
    EXPECT_EQ(better_openblas_core("Prescott", VectorLevel::Sse), "");
    // A core OpenBLAS chose knowing the CPU stays, even with wider units.
    EXPECT_EQ(better_openblas_core("Haswell", VectorLevel::Avx512), "");
    EXPECT_EQ(better_openblas_core("Zen", VectorLevel::Avx512), "");
    EXPECT_EQ(better_openblas_core("Cooperlake", VectorLevel::Avx512), "");
    EXPECT_EQ(better_openblas_core("", VectorLevel::Avx512), "");  // no OpenBLAS
}

#ifdef GGML_USE_BLAS
TEST(BlasCore, OpenBlasCoreIsNamed) { EXPECT_FALSE(openblas_core().empty()); }
#endif

// A kernel set the user names is kept, even a slow one, and the log says so.
TEST(BlasCore, KilnKeepsTheCoreTheUserAsksFor) {
    test::TempDir dir;
    auto r = test::run_command("OPENBLAS_CORETYPE=Prescott " + std::string(KILN_BIN) + " -v -p x --steps 1 -o " +
                               dir.file("a.png"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (!openblas_core().empty()) {
        EXPECT_NE(r.out.find("OpenBLAS runs its Prescott kernels (OPENBLAS_CORETYPE=Prescott)"), std::string::npos)
            << r.out;
    }
}

}  // namespace
}  // namespace kiln::runtime
