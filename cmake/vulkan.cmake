# KILN_VULKAN: ggml's Vulkan backend (AMD, Intel and other Vulkan GPUs).
#
# The pinned ggml compiles some of its shaders (flash_attn_decode_phase_1.comp
# among them) with GL_KHR_cooperative_matrix whatever the device, so glslc
# must know that extension: glslang 14 or later (shaderc 2024.0 or later, the
# LunarG Vulkan SDK 1.3.275 or later). Debian 12's glslc (shaderc 2023.2,
# glslang 11) does not, and ggml's shader generation would fail minutes into
# the build; this check stops at configure time instead, saying so
# (docs/devices.md).
if(NOT KILN_VULKAN)
    set(GGML_VULKAN OFF CACHE BOOL "" FORCE)
    return()
endif()

find_program(KILN_GLSLC glslc)
if(NOT KILN_GLSLC)
    message(FATAL_ERROR "KILN_VULKAN: no glslc found. ggml's Vulkan shaders need a glslc that knows "
                        "GL_KHR_cooperative_matrix (glslang 14 or later: shaderc 2024.0+, the LunarG Vulkan SDK "
                        "1.3.275+); put it on PATH or pass -DKILN_GLSLC=/path/to/glslc. See docs/devices.md.")
endif()
if(NOT EXISTS "${KILN_GLSLC}" OR IS_DIRECTORY "${KILN_GLSLC}")
    message(FATAL_ERROR "KILN_VULKAN: KILN_GLSLC=${KILN_GLSLC} is not a file.")
endif()
execute_process(COMMAND "${KILN_GLSLC}" --version OUTPUT_VARIABLE kiln_glslc_version ERROR_QUIET)
string(REGEX REPLACE "\n.*" "" kiln_glslc_version "${kiln_glslc_version}")
set(kiln_probe "${CMAKE_BINARY_DIR}/kiln-vulkan-probe/coopmat.comp")
file(WRITE "${kiln_probe}"
     "#version 450\n"
     "#extension GL_KHR_cooperative_matrix : require\n"
     "#extension GL_KHR_memory_scope_semantics : require\n"
     "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n"
     "layout(local_size_x = 32) in;\n"
     "void main() { coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a; }\n")
execute_process(COMMAND "${KILN_GLSLC}" --target-env=vulkan1.3 -fshader-stage=compute "${kiln_probe}"
                        -o "${kiln_probe}.spv"
                RESULT_VARIABLE kiln_probe_status OUTPUT_QUIET ERROR_QUIET)
if(NOT kiln_probe_status EQUAL 0)
    message(FATAL_ERROR "KILN_VULKAN: ${KILN_GLSLC} (${kiln_glslc_version}) cannot compile "
                        "GL_KHR_cooperative_matrix, which the pinned ggml's Vulkan shaders use unconditionally "
                        "(flash_attn_decode_phase_1.comp). It needs glslang 14 or later (shaderc 2024.0+, the "
                        "LunarG Vulkan SDK 1.3.275+); Debian 12's glslc (shaderc 2023.2) is too old. Pass "
                        "-DKILN_GLSLC=/path/to/a/newer/glslc. See docs/devices.md.")
endif()
find_package(Vulkan)
if(NOT Vulkan_FOUND)
    message(FATAL_ERROR "KILN_VULKAN: the Vulkan headers and loader are missing (Debian: libvulkan-dev).")
endif()
message(STATUS "kiln: Vulkan backend with ${KILN_GLSLC} (${kiln_glslc_version})")
set(Vulkan_GLSLC_EXECUTABLE "${KILN_GLSLC}" CACHE FILEPATH "" FORCE)
set(GGML_VULKAN ON CACHE BOOL "" FORCE)
