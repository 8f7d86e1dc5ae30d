#include "runtime/blas_threads.h"

#include <algorithm>

#ifdef GGML_USE_BLAS
// OpenBLAS's own query (cblas.h of OpenBLAS): 0 sequential, 1 pthreads, 2
// OpenMP. Declared here so kiln needs no OpenBLAS header of its own; ggml's
// BLAS backend links the library.
extern "C" int openblas_get_parallel(void);
#endif

namespace kiln::runtime {

bool blas_shares_openmp_pool() {
#if defined(GGML_USE_BLAS) && defined(KILN_GGML_OPENMP)
    constexpr int kOpenBlasOpenMP = 2;
    return openblas_get_parallel() == kOpenBlasOpenMP;
#else
    return false;
#endif
}

CpuThreadSplit split_cpu_threads(int threads, bool shared_pool) {
    threads = std::max(1, threads);
    if (shared_pool) return {threads, threads};
    const int cpu = std::max(1, threads / 2);
    return {cpu, threads - cpu + 1};
}

}  // namespace kiln::runtime
