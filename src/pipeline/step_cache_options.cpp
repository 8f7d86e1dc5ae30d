#include "pipeline/step_cache_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "util/format.h"

namespace kiln::pipeline {
namespace {

struct ModeName {
    CacheMode mode;
    const char* name;
};
constexpr ModeName kModes[] = {
    {CacheMode::UCache, "ucache"},         {CacheMode::EasyCache, "easycache"}, {CacheMode::DbCache, "dbcache"},
    {CacheMode::TaylorSeer, "taylorseer"}, {CacheMode::CacheDit, "cache-dit"},  {CacheMode::Spectrum, "spectrum"},
};

// The --cache-option keys each mode reads, as sd-cli's docs name them.
std::vector<std::string> mode_keys(CacheMode mode) {
    switch (mode) {
        case CacheMode::UCache: return {"threshold", "start", "end", "decay", "relative", "reset"};
        case CacheMode::EasyCache: return {"threshold", "start", "end"};
        case CacheMode::DbCache:
        case CacheMode::CacheDit: return {"Fn", "Bn", "threshold", "warmup"};
        case CacheMode::TaylorSeer: return {"Fn", "Bn", "warmup"};
        case CacheMode::Spectrum: return {"w", "m", "lam", "window", "flex", "warmup", "stop"};
        case CacheMode::None: break;
    }
    return {};
}

bool takes_scm(CacheMode mode) { return is_block_cache(mode); }

Error option_error(const std::string& what) { return Error::invalid_request("--cache-option: " + what); }

Result<double> number_value(const std::string& key, const std::string& text) {
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) {
        return option_error(key + "=" + text + " is not a finite number");
    }
    return v;
}

Result<float> share_value(const std::string& key, double v) {
    if (v < 0.0 || v > 1.0)
        return option_error(key + " must be in [0, 1], got " + format_number(static_cast<float>(v)));
    return static_cast<float>(v);
}

Result<int> count_value(const std::string& key, double v, int max) {
    if (v != std::floor(v) || v < 0.0 || v > max) {
        return option_error(key + " must be a whole number in [0, " + std::to_string(max) + "], got " +
                            format_number(static_cast<float>(v)));
    }
    return static_cast<int>(v);
}

Result<bool> flag_value(const std::string& key, double v) {
    if (v != 0.0 && v != 1.0) return option_error(key + " must be 0 or 1, got " + format_number(static_cast<float>(v)));
    return v == 1.0;
}

// One key=value into `o` (the key already matched one of the mode's).
Status set_option(StepCacheOptions& o, const std::string& key, const std::string& text) {
    auto parsed = number_value(key, text);
    if (!parsed.ok()) return parsed.error();
    const double v = *parsed;
    auto assign = [](auto& field, auto result) -> Status {
        if (!result.ok()) return result.error();
        field = *result;
        return Status::Ok();
    };
    if (key == "threshold") {
        if (v < 0.0) return option_error("threshold must be at least 0, got " + text);
        o.threshold = static_cast<float>(v);
        return Status::Ok();
    }
    if (key == "start") return assign(o.start, share_value(key, v));
    if (key == "end") return assign(o.end, share_value(key, v));
    if (key == "decay") return assign(o.decay, share_value(key, v));
    if (key == "relative") return assign(o.relative, flag_value(key, v));
    if (key == "reset") return assign(o.reset, flag_value(key, v));
    if (key == "Fn") return assign(o.front_blocks, count_value(key, v, 1000));
    if (key == "Bn") return assign(o.back_blocks, count_value(key, v, 1000));
    if (key == "warmup") return assign(o.warmup, count_value(key, v, 10000));
    if (key == "w") return assign(o.w, share_value(key, v));
    if (key == "m") {
        if (v != std::floor(v) || v < 1.0 || v > 8.0)
            return option_error("m must be a whole number in [1, 8], got " + text);
        o.m = static_cast<int>(v);
        return Status::Ok();
    }
    if (key == "lam") {
        if (v < 0.0) return option_error("lam must be at least 0, got " + text);
        o.lam = static_cast<float>(v);
        return Status::Ok();
    }
    if (key == "window") {
        if (v != std::floor(v) || v < 1.0 || v > 10000.0) {
            return option_error("window must be a whole number in [1, 10000], got " + text);
        }
        o.window = static_cast<int>(v);
        return Status::Ok();
    }
    if (key == "flex") {
        if (v < 0.0 || v > 100.0) return option_error("flex must be in [0, 100], got " + text);
        o.flex = static_cast<float>(v);
        return Status::Ok();
    }
    return assign(o.stop, share_value(key, v));  // "stop", the last key of mode_keys
}

// The mode's defaults where they differ between modes.
void mode_defaults(StepCacheOptions& o) {
    switch (o.mode) {
        case CacheMode::UCache: o.threshold = 1.0f; break;
        case CacheMode::EasyCache: o.threshold = 0.2f; break;
        case CacheMode::DbCache:
        case CacheMode::CacheDit: o.threshold = 0.08f; break;
        case CacheMode::TaylorSeer: o.warmup = 2; break;
        case CacheMode::Spectrum: o.warmup = 4; break;
        case CacheMode::None: break;
    }
}

}  // namespace

std::string_view cache_mode_name(CacheMode mode) {
    for (const ModeName& m : kModes) {
        if (m.mode == mode) return m.name;
    }
    return "disabled";
}

std::string cache_mode_names() {
    std::vector<std::string> names;
    for (const ModeName& m : kModes) names.emplace_back(m.name);
    return join_list(names);
}

Result<CacheMode> parse_cache_mode(std::string_view name) {
    const std::string lower = ascii_lower(trim_space(name));
    if (lower.empty() || lower == "none" || lower == "disabled") return CacheMode::None;
    for (const ModeName& m : kModes) {
        if (lower == m.name) return m.mode;
    }
    return Error::invalid_request("--cache-mode: unknown mode \"" + escaped(name) + "\"; the modes are " +
                                  cache_mode_names());
}

bool is_block_cache(CacheMode mode) {
    return mode == CacheMode::DbCache || mode == CacheMode::TaylorSeer || mode == CacheMode::CacheDit;
}

Result<StepCacheOptions> make_step_cache_options(std::string_view mode, std::string_view options,
                                                 std::string_view scm_mask, std::string_view scm_policy) {
    auto parsed_mode = parse_cache_mode(mode);
    if (!parsed_mode.ok()) return parsed_mode.error();
    StepCacheOptions o;
    o.mode = *parsed_mode;
    if (o.mode == CacheMode::None) {
        if (!trim_space(options).empty()) return option_error("needs --cache-mode (the options are the mode's)");
        if (!trim_space(scm_mask).empty() || !trim_space(scm_policy).empty()) {
            return Error::invalid_request(
                "--scm-mask and --scm-policy need --cache-mode dbcache, taylorseer or cache-dit");
        }
        return o;
    }
    mode_defaults(o);
    const std::vector<std::string> keys = mode_keys(o.mode);
    for (const std::string& item : split_list(options, ',')) {
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string::npos) return option_error("\"" + escaped(item) + "\" is not key=value");
        const std::string key = trim_space(item.substr(0, eq)), value = trim_space(item.substr(eq + 1));
        const std::string lower = ascii_lower(key);
        const std::string* known = nullptr;
        for (const std::string& k : keys) {
            if (ascii_lower(k) == lower) known = &k;
        }
        if (!known) {
            return option_error("unknown key \"" + escaped(key) + "\" for " + std::string(cache_mode_name(o.mode)) +
                                "; its keys are " + join_list(keys));
        }
        KILN_TRY(set_option(o, *known, value));
    }
    if (o.start > o.end) {
        return option_error("start (" + format_number(o.start) + ") is after end (" + format_number(o.end) + ")");
    }
    const std::string mask_text = trim_space(scm_mask), policy = ascii_lower(trim_space(scm_policy));
    if ((!mask_text.empty() || !policy.empty()) && !takes_scm(o.mode)) {
        return Error::invalid_request("--scm-mask and --scm-policy are for dbcache, taylorseer and cache-dit, not " +
                                      std::string(cache_mode_name(o.mode)));
    }
    for (const std::string& item : split_list(mask_text, ',')) {
        if (mask_text.empty()) break;
        if (item != "0" && item != "1") {
            return Error::invalid_request("--scm-mask: \"" + escaped(item) + "\" is not 0 (may cache) or 1 (compute)");
        }
        o.scm_mask.push_back(item == "1" ? 1 : 0);
    }
    if (policy == "static") {
        o.scm_dynamic = false;
    } else if (!policy.empty() && policy != "dynamic") {
        return Error::invalid_request("--scm-policy: \"" + escaped(scm_policy) + "\" is not dynamic or static");
    }
    return o;
}

Status validate_step_cache(const StepCacheOptions& o, const CacheTarget& target, int steps) {
    if (!o.enabled()) return Status::Ok();
    // What the parser checks key by key, again for requests made in code (the C API, the server).
    const auto share = [](float v) { return v >= 0.0f && v <= 1.0f; };
    if (!(o.threshold >= 0.0f && std::isfinite(o.threshold)) || !share(o.start) || !share(o.end) || o.start > o.end ||
        !share(o.decay) || !share(o.w) || !share(o.stop) || !(o.lam >= 0.0f && std::isfinite(o.lam)) ||
        !(o.flex >= 0.0f && o.flex <= 100.0f) || o.front_blocks < 0 || o.back_blocks < 0 || o.warmup < 0 || o.m < 1 ||
        o.m > 8 || o.window < 1) {
        return option_error("a value is out of range: " + describe_step_cache(o));
    }
    const std::string name(cache_mode_name(o.mode));
    const char* applies = target.unet         ? "ucache and spectrum"
                          : target.blocks > 0 ? "easycache, dbcache, taylorseer, cache-dit and spectrum"
                                              : "easycache and spectrum";
    const bool fits = o.mode == CacheMode::Spectrum || (o.mode == CacheMode::UCache && target.unet) ||
                      (o.mode == CacheMode::EasyCache && !target.unet) ||
                      (is_block_cache(o.mode) && !target.unet && target.blocks > 0);
    if (!fits) {
        return Error::invalid_request("--cache-mode " + name + " does not apply to " + target.family + " (a " +
                                      (target.unet ? "UNet" : "DiT") + "); its modes are " + applies);
    }
    if (is_block_cache(o.mode) && o.front_blocks + o.back_blocks >= target.blocks) {
        return Error::invalid_request("--cache-option: Fn=" + std::to_string(o.front_blocks) +
                                      " and Bn=" + std::to_string(o.back_blocks) + " leave none of " + target.family +
                                      "'s " + std::to_string(target.blocks) + " blocks to cache");
    }
    if (!o.scm_mask.empty() && static_cast<int>(o.scm_mask.size()) != steps) {
        return Error::invalid_request("--scm-mask has " + std::to_string(o.scm_mask.size()) +
                                      " values but the job runs " + std::to_string(steps) + " steps");
    }
    return Status::Ok();
}

std::string describe_step_cache(const StepCacheOptions& o) {
    std::string out(cache_mode_name(o.mode));
    if (!o.enabled()) return out;
    auto add = [&out](const char* key, float v) { out += std::string(" ") + key + "=" + format_number(v); };
    switch (o.mode) {
        case CacheMode::UCache:
            add("threshold", o.threshold), add("start", o.start), add("end", o.end), add("decay", o.decay);
            add("relative", o.relative ? 1.0f : 0.0f), add("reset", o.reset ? 1.0f : 0.0f);
            break;
        case CacheMode::EasyCache: add("threshold", o.threshold), add("start", o.start), add("end", o.end); break;
        case CacheMode::DbCache:
        case CacheMode::CacheDit:
        case CacheMode::TaylorSeer:
            add("Fn", static_cast<float>(o.front_blocks)), add("Bn", static_cast<float>(o.back_blocks));
            if (o.mode != CacheMode::TaylorSeer) add("threshold", o.threshold);
            add("warmup", static_cast<float>(o.warmup));
            if (!o.scm_mask.empty()) out += o.scm_dynamic ? " scm=dynamic" : " scm=static";
            break;
        case CacheMode::Spectrum:
            add("w", o.w), add("m", static_cast<float>(o.m)), add("lam", o.lam),
                add("window", static_cast<float>(o.window));
            add("flex", o.flex), add("warmup", static_cast<float>(o.warmup)), add("stop", o.stop);
            break;
        case CacheMode::None: break;
    }
    return out;
}

}  // namespace kiln::pipeline
