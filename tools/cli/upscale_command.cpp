#include "upscale_command.h"

#include <cstdlib>

#include "cli.h"
#include "output_target.h"
#include "util/log.h"

namespace kiln::cli {

UpscalerPtr load_upscaler(const Options& options, int* exit_code) {
    kiln_upscaler_params params;
    kiln_upscaler_params_init(&params);
    params.model_path = options.upscale_model.c_str();
    params.n_threads = options.threads;
    params.tile_size = options.upscale_tile_size;
    kiln_upscaler* upscaler = nullptr;
    ErrorText error;
    if (kiln_status st = kiln_upscaler_create(&params, &upscaler, &error.text); st != KILN_OK) {
        KILN_LOG_ERROR("--upscale-model: %s", error.c_str());
        *exit_code = exit_code_of(st);
        return nullptr;
    }
    return UpscalerPtr(upscaler);
}

int upscale_in_place(kiln_upscaler* upscaler, const Options& options, kiln_image& image) {
    kiln_image* result = nullptr;
    ErrorText error;
    if (kiln_status st = kiln_upscale(upscaler, &image, options.upscale_repeats, &result, &error.text); st != KILN_OK) {
        KILN_LOG_ERROR("upscale: %s", error.c_str());
        return exit_code_of(st);
    }
    std::free(image.data);
    std::free(image.parameters);
    image = *result;
    std::free(result);  // the struct only: its buffers now belong to `image`
    return kExitOk;
}

int run_upscale(const Options& options) {
    if (options.init_image.empty()) {
        KILN_LOG_ERROR("upscale: no image given (kiln -M upscale -i IMAGE --upscale-model FILE)");
        return kExitUsage;
    }
    if (options.upscale_model.empty()) {
        KILN_LOG_ERROR("upscale: no model given (--upscale-model FILE: an ESRGAN / Real-ESRGAN .pth or .safetensors)");
        return kExitUsage;
    }
    // As sd-cli: a name without an image format's extension is written as PNG, with .png added.
    const std::string output = has_image_extension(options.output) ? options.output : options.output + ".png";
    if (auto problem = output_path_problem(output)) {
        KILN_LOG_ERROR("-o %s: %s", options.output.c_str(), problem->c_str());
        return kExitUsage;
    }
    int exit_code = kExitOk;
    UpscalerPtr upscaler = load_upscaler(options, &exit_code);
    if (!upscaler) return exit_code;

    kiln_image* image = nullptr;
    {
        ErrorText error;
        if (kiln_status st = kiln_image_load_limited(
                options.init_image.c_str(), static_cast<uint64_t>(options.max_image_pixels), &image, &error.text);
            st != KILN_OK) {
            KILN_LOG_ERROR("%s", error.c_str());
            return exit_code_of(st);
        }
    }
    struct FreeImage {
        kiln_image*& image;
        ~FreeImage() { kiln_images_free(image, image ? 1 : 0); }
    } free_image{image};
    // The image's own parameters, kept and extended (none is fine).
    {
        char* text = nullptr;
        ErrorText ignored;
        if (kiln_image_read_parameters(options.init_image.c_str(), &text, &ignored.text) == KILN_OK) {
            image->parameters = text;  // freed with the image (kiln_free_string is free)
        }
    }
    const uint32_t width = image->width, height = image->height;
    if (int code = upscale_in_place(upscaler.get(), options, *image); code != kExitOk) return code;
    ErrorText error;
    if (kiln_status st = kiln_image_save(image, output.c_str(), &error.text); st != KILN_OK) {
        KILN_LOG_ERROR("%s", error.c_str());
        return exit_code_of(st);
    }
    KILN_LOG_INFO("saved %s (%ux%u, from %ux%u)", output.c_str(), image->width, image->height, width, height);
    return kExitOk;
}

}  // namespace kiln::cli
