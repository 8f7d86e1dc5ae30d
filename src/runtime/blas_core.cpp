#include "runtime/blas_core.h"

#include <algorithm>
#include <array>
#include <string_view>

#ifdef GGML_USE_BLAS
// OpenBLAS's own query (its cblas.h); ggml's BLAS backend links the library.
extern "C" char* openblas_get_corename(void);
#endif

namespace kiln::runtime {

VectorLevel cpu_vector_level() {
#if defined(__x86_64__) || defined(__i386__)
    // libgcc's CPU model checks the OS's saved-state flags (XGETBV) before
    // it reports AVX, AVX2 or AVX-512 usable.
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")) {
        return VectorLevel::Avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorLevel::Avx2;
    if (__builtin_cpu_supports("avx")) return VectorLevel::Avx;
#endif
    return VectorLevel::Sse;
}

std::string openblas_core() {
#ifdef GGML_USE_BLAS
    const char* name = openblas_get_corename();
    return name ? name : "";
#else
    return "";
#endif
}

std::string better_openblas_core(const std::string& chosen, VectorLevel cpu) {
    // OpenBLAS's x86-64 cores without AVX: what it falls back to for a CPU it
    // does not know (Prescott for Intel), and the older CPUs' own.
    static constexpr std::array<std::string_view, 16> kSseCores = {
        "Prescott",  "Core2",  "Penryn", "Dunnington", "Nehalem",       "Atom",      "Katmai", "Coppermine",
        "Northwood", "Banias", "Athlon", "Opteron",    "Opteron(SSE3)", "Barcelona", "Bobcat", "Nano"};
    const bool sse_core = std::find(kSseCores.begin(), kSseCores.end(), chosen) != kSseCores.end();
    if (!sse_core) return "";
    if (cpu == VectorLevel::Avx512) return "SkylakeX";
    if (cpu == VectorLevel::Avx2) return "Haswell";
    return "";
}

}  // namespace kiln::runtime
