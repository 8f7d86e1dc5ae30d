// What the server can say about a model before it loads it: its defaults
// (size, steps, CFG, sampler) and whether a job of a given size fits the
// machine, as `kiln plan` says it. Both come from a context that only
// places the model's modules (no weight is read), and are kept per file so
// a page that asks on every change of the form costs one plan per size.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "model_registry.h"

namespace kiln::server {

// A job's fit, as kiln_plan's *fits says it.
enum class PlanFit { Fits, StreamsFromDisk, DoesNotFit };
const char* plan_fit_name(PlanFit fit);  // "yes", "streams", "no"

struct ModelPlan {
    PlanFit fit = PlanFit::DoesNotFit;
    std::string report;  // `kiln plan`'s text
};

class ModelPlans {
  public:
    explicit ModelPlans(const ServerOptions& options) : options_(options) {}

    // The model's defaults (family, size, steps, CFG, sampler, scheduler).
    // 400 naming `field` when the model cannot be read.
    kiln_model_info defaults(const ModelEntry& model, const ModelParts& parts, const std::string& field);
    // `kiln plan` for a job of width x height (0: the model's), with a
    // latent hires pass at hires_scale times that size when it is above 0.
    // 400 naming `field` when the model cannot be read or kiln's
    // validation refuses the job.
    ModelPlan plan(const ModelEntry& model, const ModelParts& parts, int width, int height, float hires_scale,
                   const std::string& field);

  private:
    // A file is known by its path, size and change time: a model replaced
    // under the same name is read again.
    std::string key_of(const ModelEntry& model, const ModelParts& parts);

    const ServerOptions& options_;
    std::mutex mutex_;
    std::map<std::string, kiln_model_info> defaults_;
    std::map<std::tuple<std::string, int, int, float>, ModelPlan> plans_;
};

// --max-pixels: 400 naming "width" when a pass of the job (the first at
// its size, a hires fix at its final size) has more than `factor` times
// the pixels of the size the model's family is trained at. A width or
// height of 0 is the init image's, else the model's.
void check_pixels(ModelPlans& plans, const ModelEntry& model, const JobRequest& request, double factor);

}  // namespace kiln::server
