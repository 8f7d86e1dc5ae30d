// How the cores are shared between ggml's CPU ops and OpenBLAS
// (runtime/blas_threads.h), and that the build runs the OpenBLAS it chose.
#include "runtime/blas_threads.h"

#include <gtest/gtest.h>

namespace kiln::runtime {
namespace {

TEST(BlasThreads, SharedOpenMPPoolGivesBothEveryCore) {
    for (int threads : {1, 2, 16}) {
        const CpuThreadSplit split = split_cpu_threads(threads, /*shared_pool=*/true);
        EXPECT_EQ(split.ggml_cpu, threads);
        EXPECT_EQ(split.blas, threads);
    }
}

TEST(BlasThreads, SeparatePthreadPoolSplitsTheCores) {
    // ggml's CPU ops get half the cores; a product gets the rest plus the
    // calling thread, which waits for it.
    EXPECT_EQ(split_cpu_threads(1, false).ggml_cpu, 1);
    EXPECT_EQ(split_cpu_threads(1, false).blas, 1);
    EXPECT_EQ(split_cpu_threads(2, false).ggml_cpu, 1);
    EXPECT_EQ(split_cpu_threads(2, false).blas, 2);
    EXPECT_EQ(split_cpu_threads(16, false).ggml_cpu, 8);
    EXPECT_EQ(split_cpu_threads(16, false).blas, 9);
    EXPECT_EQ(split_cpu_threads(0, false).ggml_cpu, 1);  // "no threads" still runs
}

#ifdef KILN_TEST_EXPECT_OPENBLAS_OPENMP
// cmake/openblas.cmake linked the OpenMP build: the programs must load it
// through their run path, not whatever OpenBLAS the system's alternatives
// name (Debian's default is the pthread build).
TEST(BlasThreads, TheOpenMPBuildOfOpenBlasIsTheOneLoaded) { EXPECT_TRUE(blas_shares_openmp_pool()); }
#endif

}  // namespace
}  // namespace kiln::runtime
