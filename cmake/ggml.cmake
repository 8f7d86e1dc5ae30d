# Locates the pinned ggml and adds it to the build.
# Order: -DKILN_GGML_DIR=..., the KILN_GGML_DIR environment variable, then
# third_party/ggml as provisioned by scripts/setup.sh.
set(KILN_GGML_DIR "$ENV{KILN_GGML_DIR}" CACHE PATH "An existing ggml checkout to build against")
if(NOT KILN_GGML_DIR)
    set(KILN_GGML_DIR "${PROJECT_SOURCE_DIR}/third_party/ggml")
endif()
if(NOT EXISTS "${KILN_GGML_DIR}/CMakeLists.txt" OR NOT EXISTS "${KILN_GGML_DIR}/include/ggml.h")
    message(FATAL_ERROR "ggml not found in '${KILN_GGML_DIR}'. Run scripts/setup.sh, or set KILN_GGML_DIR to a ggml checkout.")
endif()
if(EXISTS "${KILN_GGML_DIR}/.kiln-ggml-commit")
    file(READ "${KILN_GGML_DIR}/.kiln-ggml-commit" KILN_GGML_COMMIT)
    string(STRIP "${KILN_GGML_COMMIT}" KILN_GGML_COMMIT)
else()
    set(KILN_GGML_COMMIT "external")
endif()
message(STATUS "kiln: ggml from ${KILN_GGML_DIR} (${KILN_GGML_COMMIT})")

set(GGML_NATIVE ON CACHE BOOL "" FORCE)
set(GGML_RPC ON CACHE BOOL "" FORCE)  # the memory-system tests use RPC on 127.0.0.1 as a GPU-type device
# Without llamafile's sgemm in ggml-cpu: it multiplies two or more rows of
# activations converted to F16 (for F16 weights) with other sums than
# vec_dot's one row, so a CFG batch of two and its two passes would differ
# (runtime/blas_device.h).
set(GGML_LLAMAFILE OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
set(GGML_BACKEND_DL OFF CACHE BOOL "" FORCE)
# ggml links into kiln statically: an installed kiln needs no ggml libraries beside it.
set(BUILD_SHARED_LIBS OFF CACHE BOOL "" FORCE)
include(${CMAKE_CURRENT_LIST_DIR}/openblas.cmake)  # also for bench/, which calls OpenBLAS directly
if(KILN_BLAS)
    set(GGML_BLAS ON CACHE BOOL "" FORCE)
    set(GGML_BLAS_VENDOR "OpenBLAS" CACHE STRING "" FORCE)
else()
    set(GGML_BLAS OFF CACHE BOOL "" FORCE)
endif()
if(KILN_CUDA)
    set(GGML_CUDA ON CACHE BOOL "" FORCE)
    set(CMAKE_CUDA_ARCHITECTURES "${KILN_CUDA_ARCH}" CACHE STRING "" FORCE)
else()
    set(GGML_CUDA OFF CACHE BOOL "" FORCE)
endif()

# Diffusion checkpoints have tensor names longer than ggml's default 64-byte
# limit ("model.diffusion_model.output_blocks.11.1.transformer_blocks.0.attn2.to_k.weight");
# kiln and ggml must agree on the limit, so it is set for the whole build.
add_compile_definitions(GGML_MAX_NAME=128)

# ggml is a dependency: its own warnings are not ours to fix.
add_subdirectory("${KILN_GGML_DIR}" "${CMAKE_BINARY_DIR}/ggml" EXCLUDE_FROM_ALL)

# Treat ggml's headers as system headers so kiln's stricter warnings (-Wshadow,
# -Wconversion) apply to kiln's code only.
foreach(ggml_target ggml ggml-base)
    get_target_property(ggml_includes ${ggml_target} INTERFACE_INCLUDE_DIRECTORIES)
    if(ggml_includes)
        set_target_properties(${ggml_target} PROPERTIES INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${ggml_includes}")
    endif()
endforeach()
