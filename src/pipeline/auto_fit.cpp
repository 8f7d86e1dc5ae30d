#include "pipeline/auto_fit.h"

#include <set>
#include <string>

#include "pipeline/image_to_video.h"
#include "pipeline/job_forecast.h"
#include "pipeline/request.h"
#include "util/log.h"

namespace kiln::pipeline {

Status auto_fit(Model& model, const ModelOptions& options) {
    const bool on_gpu = model.placement().front().compute_device != "CPU";
    if (model.auto_fit() && on_gpu) {
        const int width = options.job_width > 0 ? options.job_width : model.defaults().width;
        const int height = options.job_height > 0 ? options.job_height : model.defaults().height;
        // With a hires fix, its second pass at the larger size too; a fix the
        // job's validation will refuse is left to it.
        JobPasses passes;
        // A clip's decode, a latent frame at a time: the frames after the
        // first carry the causal history and need the most, so the guess is
        // checked against a clip of two latent frames.
        passes.video = model.diffusion().capabilities().video;
        if (passes.video) passes.latent_frames = 2;
        passes.first_frame = takes_first_frame(model);
        // Both of Wan 2.2 A14B's experts, one after the other.
        if (model.has_high_noise_expert()) {
            passes.high_noise_steps = 1;
            passes.steps = 2;
            passes.high_noise_cfg = true;
        }
        std::optional<ValidatedRequest> planned;
        if (options.job_hires) {
            GenerationRequest job;
            job.width = width;
            job.height = height;
            job.hires = *options.job_hires;
            auto validated = validate_request(model, job);
            if (validated.ok() && validated->hires) {
                planned = std::move(validated).value();
                passes.hires = &*planned->hires;
            }
        }
        const std::vector<Module*>& modules = model.modules_by_priority();
        for (auto it = modules.rbegin(); it != modules.rend(); ++it) {
            auto forecast =
                forecast_job(model, width, height, /*cfg=*/true, /*flash_attention=*/false, nullptr, passes);
            if (!forecast.ok() || forecast->fits) break;
            if ((*it)->placement->params != runtime::ParamsLocation::ComputeDevice) continue;
            // Only a module on a device that is short moves (with modules
            // spread over GPUs, another device's may have all they need).
            std::set<std::string> short_devices;
            for (const ModuleForecast& m : forecast->modules)
                if (!m.run.fits) short_devices.insert(m.device);
            for (const DeviceForecast& d : forecast->devices)
                if (d.needed > d.limit) short_devices.insert(d.device);
            if (!short_devices.empty() && !short_devices.count((*it)->placement->compute_device)) continue;
            KILN_LOG_VERBOSE("auto-fit: a %dx%d job%s does not fit; %s weights move to RAM", width, height,
                             planned ? " with its hires pass" : "", (*it)->executor_name.c_str());
            KILN_TRY(model.keep_params_in_ram(**it));
        }
    }
    const std::string text = describe_placement(model.placement(), model.module_bytes());
    // kiln plan prints the placement in its report: once is enough.
    if (model.auto_fit() && on_gpu && !options.plan_only) {
        KILN_LOG_INFO("auto-fit:\n%s", text.substr(0, text.size() - 1).c_str());
    } else {
        KILN_LOG_VERBOSE("placement:\n%s", text.substr(0, text.size() - 1).c_str());
    }
    return Status::Ok();
}

Result<std::unique_ptr<Model>> load_model(const ModelPaths& paths, const ModelOptions& options) {
    auto model = Model::load(paths, options);
    if (!model.ok()) return model.error();
    KILN_TRY(auto_fit(**model, options));
    if (options.eager_load && !options.plan_only) KILN_TRY((*model)->load_weights());
    return model;
}

}  // namespace kiln::pipeline
