// Which kernel set ("core") OpenBLAS runs, and a better one to ask for when
// OpenBLAS did not know the CPU.
//
// A dynamic OpenBLAS picks its kernels for the CPU when the library loads.
// One older than the CPU does not recognise it and falls back to its SSE
// kernels: Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids Xeon runs every
// product on its Prescott (SSE3) kernels at 44 GFLOP/s, against 245 with
// the SkylakeX ones (bench/README.md), so every CPU step is about 5.5x
// slower than it could be. OpenBLAS reads OPENBLAS_CORETYPE only as it
// loads, so the fix is to start the process again with it set
// (tools/cli/main.cpp does, through kiln_blas_core_to_request()).
#pragma once

#include <string>

namespace kiln::runtime {

// The widest vector instructions both the CPU and the OS (saved register
// state) support, in the steps OpenBLAS's kernel sets need.
enum class VectorLevel { Sse, Avx, Avx2, Avx512 };

VectorLevel cpu_vector_level();

// The kernel set OpenBLAS chose ("Haswell", "SkylakeX", "Prescott"); "" when
// kiln was built without OpenBLAS.
std::string openblas_core();

// The OPENBLAS_CORETYPE to restart with, or "" to leave OpenBLAS's choice:
// only when `chosen` is one of OpenBLAS's SSE-level cores (it did not know
// the CPU) and the CPU has AVX2 and FMA (Haswell) or AVX-512 F/BW/DQ/VL
// (SkylakeX). A CPU OpenBLAS knows keeps its own core.
std::string better_openblas_core(const std::string& chosen, VectorLevel cpu);

}  // namespace kiln::runtime
