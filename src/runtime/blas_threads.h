// How the BLAS library kiln was linked with runs its threads, and so how the
// cores are shared between it and ggml's CPU ops (runtime/compute.h).
#pragma once

namespace kiln::runtime {

struct CpuThreadSplit {
    int ggml_cpu = 1;  // threads of ggml's CPU backend
    int blas = 1;      // threads OpenBLAS may use for one product
};

// True when OpenBLAS runs its products on OpenMP, the pool ggml's CPU backend
// uses too: the two then never run at once and each may use every core.
// False without BLAS, or for an OpenBLAS on pthreads (or sequential).
bool blas_shares_openmp_pool();

// The split for `threads` cores. On a shared OpenMP pool both get all of
// them. Otherwise OpenBLAS's pthread workers keep spinning for a while after
// each product while ggml's CPU threads wait for each other at every node:
// with both at full width a step of the default model ran 7x slower on 2
// cores, so ggml's CPU ops get half the cores and the products the rest plus
// the calling thread.
CpuThreadSplit split_cpu_threads(int threads, bool shared_pool);

}  // namespace kiln::runtime
