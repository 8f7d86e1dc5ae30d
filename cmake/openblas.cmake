# Picks the OpenBLAS that ggml's BLAS backend and bench/ link against, and
# sets KILN_OPENBLAS_LIBRARY and KILN_OPENBLAS_INCLUDE_DIR for both.
#
# ggml's CPU backend runs its threads on OpenMP. An OpenBLAS built on pthreads
# brings a second set of worker threads that spin after every product; on a
# machine with few cores they starve ggml's threads, which wait for each other
# at every node, so the cores had to be split between the two. An OpenBLAS
# built on OpenMP runs its products on the same OpenMP pool, and both can use
# every core (full-size SD1.5 VAE decode at 256x256 on 2 cores: 10.3 s -> 7.4 s,
# docs/performance.md). Debian ships that build beside the pthread one
# (libopenblas-openmp-dev, installed by scripts/setup.sh); where it is missing,
# the default OpenBLAS is used and src/runtime/compute.cpp splits the cores.
set(_kiln_openblas_openmp_dir "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
find_library(KILN_OPENBLAS_LIBRARY NAMES openblas PATHS "${_kiln_openblas_openmp_dir}" NO_DEFAULT_PATH)
if(KILN_OPENBLAS_LIBRARY)
    set(KILN_OPENBLAS_OPENMP ON)
    set(KILN_OPENBLAS_INCLUDE_DIR "/usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp")
    # ggml's FindBLAS call takes the cached library instead of searching; the
    # folder is not a default one, so CMake puts it in the programs' run path
    # and they load this build whatever Debian's alternatives point at.
    set(BLAS_openblas_LIBRARY "${KILN_OPENBLAS_LIBRARY}" CACHE FILEPATH "OpenBLAS for ggml's BLAS backend" FORCE)
    set(BLAS_INCLUDE_DIRS "${KILN_OPENBLAS_INCLUDE_DIR}")
    message(STATUS "kiln: OpenBLAS on OpenMP: ${KILN_OPENBLAS_LIBRARY}")
else()
    set(KILN_OPENBLAS_OPENMP OFF)
    unset(KILN_OPENBLAS_LIBRARY CACHE)
    find_package(PkgConfig REQUIRED)
    pkg_check_modules(KILN_OPENBLAS_PC openblas)
    if(KILN_OPENBLAS_PC_FOUND)
        find_library(KILN_OPENBLAS_LIBRARY NAMES openblas HINTS ${KILN_OPENBLAS_PC_LIBRARY_DIRS})
        set(KILN_OPENBLAS_INCLUDE_DIR "${KILN_OPENBLAS_PC_INCLUDE_DIRS}")
    endif()
    message(STATUS "kiln: OpenBLAS without OpenMP (${KILN_OPENBLAS_LIBRARY}): ggml's CPU ops and OpenBLAS split the cores")
endif()
