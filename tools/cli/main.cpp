#include <unistd.h>

#include <cstdlib>

#include "cli.h"
#include "kiln.h"

namespace {

// OpenBLAS chooses its kernels as it loads, before main. When it did not
// know this CPU and fell back to SSE kernels (several times slower), start
// again with OPENBLAS_CORETYPE naming the kernels the CPU can run
// (src/runtime/blas_core.h). A value the user set is left alone, and the
// restarted process does not restart again.
void restart_for_faster_blas(char** argv) {
    if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("KILN_BLAS_RESTARTED")) return;
    const char* core = kiln_blas_core_to_request();
    if (!core) return;
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0 || setenv("KILN_BLAS_RESTARTED", kiln_blas_core(), 1) != 0) return;
    execv("/proc/self/exe", argv);  // returns only on failure: go on with the slow kernels
    unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace

int main(int argc, char** argv) {
    restart_for_faster_blas(argv);
    return kiln::cli::run_cli(std::vector<std::string>(argv + 1, argv + argc));
}
