#include "pipeline/loras.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <string_view>

#include "ggml.h"
#include "io/file_hashes.h"
#include "io/tensor_convert.h"
#include "pipeline/lora_file.h"
#include "pipeline/lora_targets.h"
#include "util/files.h"
#include "util/format.h"
#include "util/log.h"

namespace kiln::pipeline {
namespace {

bool is_float(ggml_type type) { return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16; }

std::string trim(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\n");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t\n") - b + 1);
}

// The most a layer's change may be multiplied by (strength x alpha/rank,
// either sign): real adapters are used at a few units; past this the
// products overflow float or swamp the weight they change.
constexpr double kMaxLoraFactor = 1e4;

Result<float> tag_weight(const std::string& text, const std::string& tag) {
    const std::string t = trim(text);
    char* end = nullptr;
    const float w = std::strtof(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(w)) {
        return Error::invalid_request("prompt: in " + tag + ", '" + t + "' is not a weight (a number such as 0.8)");
    }
    return w;
}

// One weight's changes, in the order the files and their layers name them
// (a fixed order, so a job's numbers do not depend on a map's).
struct Change {
    const LayerAdapter* layer;
    const LoraTarget* target;
    float strength;
    bool bias = false;  // the layer's diff_b on the target's bias, not its weight change
};
struct WeightChanges {
    Module* module = nullptr;
    ggml_tensor* weight = nullptr;
    const io::TensorInfo* info = nullptr;
    std::vector<Change> changes;
};

template <class T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    return std::vector<uint8_t>(p, p + v.size() * sizeof(T));
}

// A matrix of the target's rows (each `row_length` long: a LoRA up's
// rank, or the weight's columns) placed in a zero matrix of all the
// weight's rows.
std::vector<float> in_weight_rows(const std::vector<float>& part, const LoraTarget& t, int64_t row_length,
                                  int64_t weight_rows) {
    if (t.first_row == 0 && t.rows == weight_rows) return part;
    std::vector<float> whole(static_cast<size_t>(weight_rows * row_length), 0.0f);
    std::copy(part.begin(), part.end(), whole.begin() + t.first_row * row_length);
    return whole;
}

// The part of `layer` that lands on `t`: a weight that another naming
// fuses with others into the layer (its rows of the change), or whose
// rows' halves that naming holds the other way round.
Result<LayerAdapter> part_for_target(const std::string& path, const LayerAdapter& layer, const LoraTarget& t) {
    const int64_t rows = t.layer_rows > 0 ? t.layer_rows : t.rows;
    if (layer.changes_weight() && (layer.out_rows() != rows || layer.in_columns() != t.columns)) {
        return Error::bad_file(path + ": adapter '" + layer.key + "' changes a " + std::to_string(layer.out_rows()) +
                               "x" + std::to_string(layer.in_columns()) + " weight; " + t.name + " is part of a " +
                               std::to_string(rows) + "x" + std::to_string(t.columns) +
                               " layer (a LoRA for another model?)");
    }
    auto cut = adapter_rows(layer, t.layer_first_row, t.rows, t.swap_halves);
    if (!cut.ok()) return cut.error().in_context(path + ": ");
    return cut;
}

// W + the changes, in W's compute type (requantized when it is quantized).
Result<std::vector<uint8_t>> merged_weight(const WeightChanges& w) {
    auto base = io::convert_tensor(*w.info, w.module->file->data(*w.info), GGML_TYPE_F32);
    if (!base.ok()) return base.error();
    std::vector<float> values(base->size() / sizeof(float));
    std::memcpy(values.data(), base->data(), base->size());
    for (const Change& c : w.changes) {
        if (c.bias) {
            const std::vector<float>& d = c.layer->diff_b->data;
            for (size_t i = 0; i < d.size(); ++i) values[size_t(c.target->first_row) + i] += c.strength * d[i];
            continue;
        }
        auto delta = c.layer->dense_delta(c.target->rows, c.target->columns);
        if (!delta.ok()) return delta.error();
        if (c.layer->dora_scale) {
            KILN_TRY(apply_dora(*c.layer, values, c.target->first_row, c.target->rows, c.target->columns, *delta,
                                c.strength));
            continue;
        }
        float* rows = values.data() + c.target->first_row * c.target->columns;
        for (size_t i = 0; i < delta->size(); ++i) rows[i] += c.strength * (*delta)[i];
    }
    const ggml_type type = w.weight->type;
    if (type == GGML_TYPE_F32) return bytes_of(values);
    const int64_t row_length = w.weight->ne[0];
    const int64_t rows = ggml_nelements(w.weight) / row_length;
    std::vector<uint8_t> out(ggml_nbytes(w.weight));
    ggml_quantize_init(type);
    ggml_quantize_chunk(type, values.data(), out.data(), 0, rows, row_length, nullptr);
    return out;
}

void clear_loras(Model& model) {
    // The stores' blocks hold the old adapters' tensors: they are dropped
    // before the adapters are freed (and their copies must not be found
    // again, as new tensors may reuse the old addresses).
    model.forget_weight_copies();
    for (auto& module : model.modules()) (void)module->weights().set_extras({}, nullptr);
    for (auto& [ledger, bytes] : model.lora_reservations()) ledger->release(bytes);
    model.lora_reservations().clear();
    model.applied_loras().clear();
}

Status install(Model& model, const std::vector<std::pair<std::string, LoraRequest>>& active,
               std::vector<AdapterFile>& files) {
    const LoraTargets targets(model, /*high_noise_expert=*/false);
    std::optional<LoraTargets> expert_targets;
    if (model.has_high_noise_expert()) expert_targets.emplace(model, /*high_noise_expert=*/true);
    std::vector<WeightChanges> weights;
    // The parts of layers cut for the weights they land on (Change points
    // at them until the patches are made).
    std::deque<LayerAdapter> parts;
    std::map<const ggml_tensor*, size_t> weight_index;
    std::map<const ggml_tensor*, const io::TensorInfo*> infos;
    for (auto& module : model.modules()) {
        for (const auto& [tensor, info] : module->weights().declared()) infos[tensor] = info;
    }
    files.reserve(active.size());
    for (const auto& [path, request] : active) {
        auto file = read_adapter_file(path);
        if (!file.ok()) return file.error();
        files.push_back(std::move(file).value());
        const AdapterFile& f = files.back();
        std::vector<std::string> unmatched = f.unused;
        int matched = 0;
        for (const LayerAdapter& whole_layer : f.layers) {
            const std::vector<const LoraTarget*> found =
                (request.high_noise ? *expert_targets : targets).find(whole_layer.key);
            if (found.empty()) {
                unmatched.push_back(whole_layer.key);
                continue;
            }
            // A fused layer's parts each take rows of its change: a kind
            // whose factors cannot be cut (LoHa, LoKr) is made dense once.
            const LayerAdapter* source = &whole_layer;
            if (found.size() > 1 && whole_layer.changes_weight() && whole_layer.kind != AdapterKind::LoRA &&
                whole_layer.kind != AdapterKind::Full) {
                auto dense = adapter_rows(whole_layer, 0, whole_layer.out_rows(), /*swap_halves=*/false);
                if (!dense.ok()) return dense.error().in_context(path + ": ");
                parts.push_back(std::move(dense).value());
                source = &parts.back();
            }
            for (const LoraTarget* t : found) {
                // A layer another naming fuses (or turns) lands on this weight
                // as its part of the change.
                const LayerAdapter* part = source;
                if (t->layer_rows > 0 || t->swap_halves) {
                    auto cut = part_for_target(path, *source, *t);
                    if (!cut.ok()) return cut.error();
                    parts.push_back(std::move(cut).value());
                    part = &parts.back();
                }
                const LayerAdapter& layer = *part;
                if (layer.diff_b) {
                    if (!t->bias) {
                        unmatched.push_back(layer.key + ".diff_b (" + t->name + " has no bias)");
                    } else if (layer.diff_b->rows() != t->rows) {
                        return Error::bad_file(path + ": adapter '" + layer.key + "' changes a bias of " +
                                               std::to_string(layer.diff_b->rows()) + " values; " + t->name + " has " +
                                               std::to_string(t->rows) + " rows (a LoRA for another model?)");
                    } else {
                        auto [it, added] = weight_index.emplace(t->bias, weights.size());
                        if (added) weights.push_back({t->module, t->bias, infos.at(t->bias), {}});
                        weights[it->second].changes.push_back({&layer, t, request.strength, /*bias=*/true});
                    }
                }
                // What the layer's change is multiplied by: a huge strength
                // (<lora:x:1e30>) or alpha (3e38) overflows float in the
                // products, found only once the job has run.
                const double factor = static_cast<double>(request.strength) * layer.scale();
                if (!(std::fabs(factor) <= kMaxLoraFactor)) {
                    const std::string message =
                        "LoRA " + request.name + " (" + path + "): strength " + format_number(request.strength) +
                        " times adapter '" + layer.key + "''s alpha/rank " + format_number(layer.scale()) +
                        " is beyond the limit of " + format_number(static_cast<float>(kMaxLoraFactor)) + " either way";
                    return std::fabs(request.strength) > kMaxLoraFactor ? Error::invalid_request(message)
                                                                        : Error::bad_file(message);
                }
                if (!layer.changes_weight()) continue;
                if (layer.out_rows() != t->rows || layer.in_columns() != t->columns) {
                    return Error::bad_file(path + ": adapter '" + layer.key + "' changes a " +
                                           std::to_string(layer.out_rows()) + "x" + std::to_string(layer.in_columns()) +
                                           " weight; " + t->name + " is " + std::to_string(t->rows) + "x" +
                                           std::to_string(t->columns) + " (a LoRA for another model?)");
                }
                auto [it, added] = weight_index.emplace(t->weight, weights.size());
                if (added) weights.push_back({t->module, t->weight, infos.at(t->weight), {}});
                weights[it->second].changes.push_back({&layer, t, request.strength});
            }
            ++matched;
        }
        if (matched == 0) {
            return Error::bad_file(path + ": none of its " + std::to_string(f.layers.size()) +
                                   " layers names a weight of this " + model.family_label() + " model (first: '" +
                                   f.layers.front().key + "'); is it a LoRA for another family?");
        }
        KILN_LOG_INFO("LoRA %s (strength %g): %d layers applied, %zu names matched nothing%s", request.name.c_str(),
                      static_cast<double>(request.strength), matched, unmatched.size(),
                      unmatched.empty() ? "" : " (-v lists them)");
        for (const std::string& name : unmatched) KILN_LOG_VERBOSE("LoRA %s: unused '%s'", request.name.c_str(), name.c_str());
    }

    // Each module's adapter weights, then the patches that use them.
    const LoraApplyMode mode = model.lora_apply_mode();
    int merged = 0, at_runtime = 0;
    for (auto& owned : model.modules()) {
        Module& module = *owned;
        std::vector<runtime::ModuleWeights::Extra> extras;
        // What each extra is for: the weight, and which term (-1: the replacement).
        struct Use {
            const ggml_tensor* weight;
            int kind;  // 0 replacement, 1 low-rank down, 2 low-rank up, 3 dense
            float scale;
        };
        std::vector<Use> uses;
        for (const WeightChanges& w : weights) {
            if (w.module != &module) continue;
            const int64_t weight_rows = w.info->shape[0];
            // A bias change, and DoRA (which rescales W itself), are always
            // merged: neither is a term beside the product.
            const bool must_merge = std::any_of(w.changes.begin(), w.changes.end(), [](const Change& c) {
                return c.bias || c.layer->dora_scale.has_value();
            });
            const bool merge = must_merge || mode == LoraApplyMode::Immediately ||
                               (mode == LoraApplyMode::Auto && is_float(w.weight->type));
            if (must_merge && ggml_quantize_requires_imatrix(w.weight->type)) {
                return Error::invalid_request("LoRA: " + std::string(w.info->name) + " is " +
                                              ggml_type_name(w.weight->type) +
                                              ", which kiln cannot requantize; a DoRA layer on it must be merged");
            }
            if (merge && !ggml_quantize_requires_imatrix(w.weight->type)) {
                auto data = merged_weight(w);
                if (!data.ok()) return data.error();
                std::vector<int64_t> ne(w.weight->ne, w.weight->ne + GGML_MAX_DIMS);
                extras.push_back({"lora merged " + std::to_string(uses.size()), ne, w.weight->type, std::move(*data)});
                uses.push_back({w.weight, 0, 1.0f});
                ++merged;
                continue;
            }
            ++at_runtime;
            for (const Change& c : w.changes) {
                const LayerAdapter& l = *c.layer;
                const std::string n = "lora " + std::to_string(uses.size());
                if (l.kind == AdapterKind::LoRA) {
                    // down [rank, columns] is ggml's ne [columns, rank]; up
                    // [rows, rank] is ne [rank, rows].
                    extras.push_back({n + " down", {c.target->columns, l.rank()}, GGML_TYPE_F32, bytes_of(l.down->data)});
                    uses.push_back({w.weight, 1, 1.0f});
                    extras.push_back({n + " up",
                                      {l.rank(), weight_rows},
                                      GGML_TYPE_F32,
                                      bytes_of(in_weight_rows(l.up->data, *c.target, l.rank(), weight_rows))});
                    uses.push_back({w.weight, 2, c.strength * l.scale()});
                } else {
                    auto delta = l.dense_delta(c.target->rows, c.target->columns);
                    if (!delta.ok()) return delta.error();
                    for (float& v : *delta) v *= c.strength;
                    extras.push_back({n + " delta",
                                      {c.target->columns, weight_rows},
                                      GGML_TYPE_F32,
                                      bytes_of(in_weight_rows(*delta, *c.target, c.target->columns, weight_rows))});
                    uses.push_back({w.weight, 3, 1.0f});
                }
            }
        }
        if (extras.empty()) continue;
        uint64_t bytes = 0;
        for (const auto& e : extras) bytes += e.data.size();
        const bool on_device = module.target == nn::ComputeTarget::Device &&
                               module.weights().params_location() == runtime::ParamsLocation::ComputeDevice;
        if (on_device) {
            runtime::DeviceLedger& ledger = module.executor->store().ledger();
            if (ledger.managed() + bytes > ledger.limit()) {
                return Error::out_of_memory("out of memory: the LoRA weights of the " + std::string(module.role()) +
                                            " need " + human_bytes(bytes) + " on " + ledger.device_name() +
                                            ", the budget leaves " +
                                            human_bytes(ledger.limit() > ledger.managed()
                                                            ? ledger.limit() - ledger.managed()
                                                            : 0));
            }
            ledger.add(bytes);
            model.lora_reservations().emplace_back(&ledger, bytes);
        }
        auto tensors = module.weights().set_extras(std::move(extras), module.executor->compute().weights_backend());
        if (!tensors.ok()) return tensors.error();
        runtime::WeightPatches patches;
        for (size_t i = 0; i < uses.size(); ++i) {
            runtime::WeightPatch& p = patches[uses[i].weight];
            ggml_tensor* t = (*tensors)[i];
            switch (uses[i].kind) {
                case 0: p.replacement = t; break;
                case 1: p.low_rank.push_back({t, nullptr, 1.0f}); break;
                case 2: p.low_rank.back().up = t, p.low_rank.back().scale = uses[i].scale; break;
                default: p.dense.push_back(t); break;
            }
        }
        module.weights().set_patches(std::move(patches));
    }
    KILN_LOG_VERBOSE("LoRA: %d weights merged, %d changed at run time", merged, at_runtime);
    return Status::Ok();
}

}  // namespace

Result<PromptLoras> extract_lora_tags(const std::string& prompt) {
    PromptLoras out;
    size_t pos = 0;
    while (true) {
        size_t open = std::string::npos;
        for (const char* opener : {"<lora:", "<lyco:"}) {
            const size_t at = prompt.find(opener, pos);
            if (at < open) open = at;
        }
        if (open == std::string::npos) {
            out.prompt += prompt.substr(pos);
            break;
        }
        const size_t close = prompt.find('>', open);
        if (close == std::string::npos) {
            out.prompt += prompt.substr(pos);
            out.unclosed = prompt.substr(open, 64);
            break;  // not a tag: A1111 leaves an unclosed "<lora:" as text
        }
        out.prompt += prompt.substr(pos, open - pos);
        const std::string tag = prompt.substr(open, close - open + 1);
        const std::string body = prompt.substr(open + 6, close - open - 6);
        std::vector<std::string> fields;
        size_t start = 0;
        while (true) {
            const size_t colon = body.find(':', start);
            fields.push_back(body.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
            if (colon == std::string::npos) break;
            start = colon + 1;
        }
        LoraRequest request;
        request.name = trim(fields[0]);
        static constexpr std::string_view kHighNoise = "|high_noise|";
        if (request.name.compare(0, kHighNoise.size(), kHighNoise) == 0) {
            request.high_noise = true;
            request.name = trim(request.name.substr(kHighNoise.size()));
        }
        if (request.name.empty()) return Error::invalid_request("prompt: " + tag + " names no LoRA");
        if (request.name.front() == '/' || request.name.find("..") != std::string::npos) {
            return Error::invalid_request("prompt: " + tag + ": a LoRA name is a file under --lora-model-dir, not a path out of it");
        }
        if (fields.size() > 2) {
            return Error::invalid_request("prompt: " + tag + ": expected <lora:NAME> or <lora:NAME:WEIGHT>");
        }
        if (fields.size() == 2) {
            auto w = tag_weight(fields[1], tag);
            if (!w.ok()) return w.error();
            request.strength = *w;
        }
        auto same = std::find_if(out.loras.begin(), out.loras.end(), [&](const LoraRequest& r) {
            return r.name == request.name && r.high_noise == request.high_noise;
        });
        if (same != out.loras.end()) {
            same->strength += request.strength;
        } else {
            out.loras.push_back(request);
        }
        pos = close + 1;
    }
    return out;
}

Result<LoraApplyMode> parse_lora_apply_mode(const std::string& text) {
    for (LoraApplyMode m : {LoraApplyMode::Auto, LoraApplyMode::Immediately, LoraApplyMode::AtRuntime}) {
        if (text == lora_apply_mode_name(m)) return m;
    }
    return Error::invalid_request("'" + text + "' is not a LoRA apply mode (auto, immediately, at_runtime)");
}

const char* lora_apply_mode_name(LoraApplyMode mode) {
    switch (mode) {
        case LoraApplyMode::Auto: return "auto";
        case LoraApplyMode::Immediately: return "immediately";
        case LoraApplyMode::AtRuntime: return "at_runtime";
    }
    return "?";
}

Result<std::string> find_lora_file(const std::string& folder, const std::string& name) {
    if (folder.empty()) {
        return Error::invalid_request("the prompt names LoRA '" + name + "' but no --lora-model-dir was given");
    }
    for (const char* ext : {"", ".safetensors", ".sft", ".ckpt", ".pt", ".gguf"}) {
        const std::string path = folder + "/" + name + ext;
        const PathStatus status = path_status(path);
        if (status.kind == PathKind::File) {
            // Inside the folder's real path, as kiln serve's --model-dir
            // keeps its models: a symlink in the folder may not lead out.
            const std::string outside = real_path_outside(folder, path);
            if (!outside.empty()) {
                return Error::invalid_request("LoRA '" + name + "': " + path + " leads out of --lora-model-dir " +
                                              folder + " (to " + outside + ") through a symbolic link");
            }
            return path;
        }
        if (status.kind == PathKind::SymlinkLoop || status.kind == PathKind::Special) {
            return path_error(path, status).as(ErrorKind::BadFile);
        }
    }
    return Error::invalid_request("LoRA '" + name + "': no " + name +
                                  ".safetensors (.sft, .ckpt, .pt, .gguf) in --lora-model-dir " + folder);
}

Status apply_loras(Model& model, const std::vector<LoraRequest>& loras) {
    std::vector<std::pair<std::string, LoraRequest>> active;
    std::string key;
    for (const LoraRequest& r : loras) {
        if (r.strength == 0.0f) continue;
        if (r.high_noise && !model.has_high_noise_expert()) {
            return Error::invalid_request("<lora:|high_noise|" + r.name +
                                          "> is for Wan 2.2 A14B's high-noise expert, and this " +
                                          model.family_label() + " model has none (--high-noise-diffusion-model)");
        }
        auto path = find_lora_file(model.lora_dir(), r.name);
        if (!path.ok()) return path.error();
        char strength[32];
        std::snprintf(strength, sizeof(strength), "%a", static_cast<double>(r.strength));
        key += std::string(r.high_noise ? "high_noise\t" : "") + *path + "\t" + strength + "\n";
        active.emplace_back(*path, r);
    }
    if (key == model.applied_loras()) return Status::Ok();
    clear_loras(model);
    if (active.empty()) return Status::Ok();
    std::vector<AdapterFile> files;
    Status installed = install(model, active, files);
    if (!installed.ok()) {
        clear_loras(model);
        return installed;
    }
    model.applied_loras() = key;
    return Status::Ok();
}

std::string lora_hashes_text(const std::string& folder, const std::vector<LoraRequest>& loras) {
    std::vector<std::pair<std::string, std::string>> hashes;  // A1111's p.lora_hashes, in insertion order
    for (const LoraRequest& r : loras) {
        if (r.name.empty()) continue;  // "if ... and item.mentioned_name"
        std::string name;              // item.mentioned_name.translate(remove_symbols): ':' and ',' removed
        for (char c : r.name) {
            if (c != ':' && c != ',') name += c;
        }
        auto path = find_lora_file(folder, r.name);
        if (!path.ok()) continue;
        auto hash = io::lora_short_hash(*path);
        if (!hash.ok()) {
            KILN_LOG_WARN("LoRA '%s': no hash for the image's parameters: %s", r.name.c_str(),
                          hash.error().message.c_str());
            continue;
        }
        auto same = std::find_if(hashes.begin(), hashes.end(), [&](const auto& h) { return h.first == name; });
        if (same != hashes.end()) {
            same->second = *hash;
        } else {
            hashes.emplace_back(name, *hash);
        }
    }
    std::string text;
    for (const auto& [name, hash] : hashes) text += (text.empty() ? "" : ", ") + name + ": " + hash;
    return text;
}

}  // namespace kiln::pipeline
