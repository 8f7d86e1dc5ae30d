#include "model_plans.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <memory>

namespace kiln::server {
namespace {

using ContextPtr = std::unique_ptr<kiln_context, decltype(&kiln_context_free)>;

[[noreturn]] void refuse(const ServerOptions& options, const std::string& field, const ModelEntry& model, char* error) {
    std::string message = error ? error : "it cannot be read";
    if (!options.model_dir.empty()) message = in_request_terms(message);
    kiln_free_string(error);
    throw RequestError{400, field, field + ": " + model.name + ": " + message};
}

// A context that places the model's modules for a job of that size and
// loads no weight: what `kiln plan` opens.
ContextPtr plan_context(const ServerOptions& options, const ModelEntry& model, const ModelParts& parts, int width,
                        int height, float hires_scale, const std::string& field) {
    kiln_context_params params = options.context;
    params.model_path = model.path.c_str();
    parts.apply(params);
    params.plan_only = 1;
    params.job_width = width;
    params.job_height = height;
    params.job_hires = hires_scale > 0 ? 1 : 0;
    params.job_hires_scale = hires_scale;
    kiln_context* ctx = nullptr;
    char* error = nullptr;
    if (kiln_context_create(&params, &ctx, &error) != KILN_OK) refuse(options, field, model, error);
    kiln_free_string(error);
    return ContextPtr(ctx, &kiln_context_free);
}

}  // namespace

const char* plan_fit_name(PlanFit fit) {
    switch (fit) {
        case PlanFit::Fits: return "yes";
        case PlanFit::StreamsFromDisk: return "streams";
        case PlanFit::DoesNotFit: return "no";
    }
    return "no";
}

std::string ModelPlans::key_of(const ModelEntry& model, const ModelParts& parts) {
    struct stat st {};
    if (stat(model.path.c_str(), &st) != 0) return model.path + parts.describe();
    return model.path + "|" + std::to_string(st.st_size) + "|" + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec) + parts.describe();
}

kiln_model_info ModelPlans::defaults(const ModelEntry& model, const ModelParts& parts, const std::string& field) {
    const std::string key = key_of(model, parts);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto it = defaults_.find(key); it != defaults_.end()) return it->second;
    }
    // Planned outside the lock: two requests may both read a new model once.
    ContextPtr ctx = plan_context(options_, model, parts, 0, 0, 0.0f, field);
    kiln_model_info info{};
    kiln_context_info(ctx.get(), &info);
    std::lock_guard<std::mutex> lock(mutex_);
    defaults_[key] = info;
    return info;
}

ModelPlan ModelPlans::plan(const ModelEntry& model, const ModelParts& parts, int width, int height, float hires_scale,
                           const std::string& field) {
    const auto key = std::make_tuple(key_of(model, parts), width, height, hires_scale);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    }
    ContextPtr ctx = plan_context(options_, model, parts, width, height, hires_scale, field);
    kiln_generation_params gp;
    kiln_generation_params_init(&gp);
    gp.width = width;
    gp.height = height;
    gp.hires = hires_scale > 0 ? 1 : 0;
    if (gp.hires) gp.hires_scale = hires_scale;
    char* text = nullptr;
    char* error = nullptr;
    int fits = 0;
    if (kiln_plan(ctx.get(), &gp, &text, &fits, &error) != KILN_OK) refuse(options_, field, model, error);
    ModelPlan out;
    out.fit = fits == 1 ? PlanFit::Fits : fits == 2 ? PlanFit::StreamsFromDisk : PlanFit::DoesNotFit;
    out.report = text ? text : "";
    kiln_free_string(text);
    kiln_free_string(error);
    std::lock_guard<std::mutex> lock(mutex_);
    // Sizes a page may try are many: the cache stays small.
    if (plans_.size() >= 256) plans_.clear();
    plans_[key] = out;
    return out;
}

void check_pixels(ModelPlans& plans, const ModelEntry& model, const JobRequest& request, double factor) {
    kiln_model_info info{};
    try {
        info = plans.defaults(model, request.parts, "model");
    } catch (const RequestError&) {
        // A model that cannot be placed now (its device's budget is taken by
        // a loaded one, which the queue frees first): its job's load says why.
        return;
    }
    const double trained = double(info.trained_width) * info.trained_height;
    if (trained <= 0) return;
    const auto side = [&](int asked, uint32_t of_init, int fallback) {
        return asked > 0 ? asked : request.init_image && !request.init_latent_resize ? int(of_init) : fallback;
    };
    const int width = side(request.width, request.init_image ? request.init_image->width : 0, info.width);
    const int height = side(request.height, request.init_image ? request.init_image->height : 0, info.height);
    const auto refuse_if_over = [&](long long w, long long h, const std::string& what) {
        if (double(w) * h <= trained * factor) return;
        char times[32];
        std::snprintf(times, sizeof times, "%.3g", double(w) * h / trained);
        char allowed[32];
        std::snprintf(allowed, sizeof allowed, "%g", factor);
        throw RequestError{400, "width",
                           "width: " + what + std::to_string(w) + "x" + std::to_string(h) + " is " + times +
                               " times the pixels " + info.family + " is trained at (" +
                               std::to_string(info.trained_width) + "x" + std::to_string(info.trained_height) +
                               "); this server allows " + allowed + " times (--max-pixels)"};
    };
    refuse_if_over(width, height, "");
    if (request.hires) {
        const long long w = request.hires_width ? request.hires_width : std::llround(width * request.hires_scale);
        const long long h = request.hires_height ? request.hires_height : std::llround(height * request.hires_scale);
        refuse_if_over(w, h, "the hires fix's ");
    }
}

}  // namespace kiln::server
