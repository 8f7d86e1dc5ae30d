#include "io/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/ckpt.h"
#include "io/diffusers_names.h"
#include "io/gguf_file.h"
#include "io/safetensors.h"
#include "io/tensor_convert.h"
#include "util/files.h"

namespace fs = std::filesystem;

namespace kiln::io {
namespace {

bool has_suffix(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_weight_file_name(const std::string& name) {
    for (const char* ext : {".safetensors", ".gguf", ".ckpt", ".pt", ".pth", ".bin"}) {
        if (has_suffix(name, ext)) return true;
    }
    return false;
}

Result<nlohmann::json> read_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Error{path + ": cannot open"};
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Error{path + ": malformed JSON"};
    return j;
}

// Which weight files of a diffusers component folder make up the component:
// an index file's shards, else the single best weight file (safetensors over
// .bin, full precision over variants such as .fp16).
Result<std::vector<std::string>> component_weight_files(const std::string& folder) {
    auto entries = list_folder(folder);
    if (!entries) return entries.error();
    std::vector<std::string> names;  // sorted, as list_folder returns them
    for (const FolderEntry& entry : *entries) {
        if (entry.status.kind == PathKind::File) {
            names.push_back(entry.name);
        } else if (entry.status.kind == PathKind::SymlinkLoop && is_weight_file_name(entry.name)) {
            return path_error(entry.path, entry.status);
        }
    }

    for (const std::string& name : names) {
        if (!has_suffix(name, ".safetensors.index.json") && !has_suffix(name, ".bin.index.json")) continue;
        const std::string index_path = folder + "/" + name;
        auto index = read_json_file(index_path);
        if (!index.ok()) return index.error();
        auto map_it = index->find("weight_map");
        if (map_it == index->end() || !map_it->is_object()) return Error{index_path + ": no \"weight_map\" object"};
        std::set<std::string> shards;
        for (auto it = map_it->begin(); it != map_it->end(); ++it) {
            if (!it->is_string())
                return Error{index_path + ": weight_map value for '" + it.key() + "' is not a string"};
            const std::string shard = it->get<std::string>();
            if (shard.find('/') != std::string::npos || shard == "..") {
                return Error{index_path + ": shard name '" + shard + "' must be a file in the same folder"};
            }
            shards.insert(shard);
        }
        std::vector<std::string> files;
        for (const std::string& shard : shards) files.push_back(folder + "/" + shard);
        return files;
    }

    auto rank = [](const std::string& name) {
        int r = has_suffix(name, ".safetensors") ? 0 : 10;
        if (name.find(".fp16.") != std::string::npos || name.find(".bf16.") != std::string::npos) r += 1;
        return r;
    };
    std::vector<std::string> candidates;
    for (const std::string& name : names) {
        if (is_weight_file_name(name)) candidates.push_back(name);
    }
    if (candidates.empty()) return Error{folder + ": no weight file (.safetensors, .bin, ...) in the folder"};
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    // A file split into parts is one component; the parts come in together.
    return expand_split_parts(folder + "/" + candidates.front());
}

// A safetensors file starts with its header's length (8 bytes, little
// endian) and the header, a JSON object. Checked before the pickle magic: a
// header of 384 bytes starts 0x80 0x01, which is also how a pickle starts.
bool looks_like_safetensors(const uint8_t* data, size_t size) {
    if (size < 9 || data[8] != '{') return false;
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
    return header <= size - 8;
}

}  // namespace

Result<ParsedFile> parse_model_bytes(const uint8_t* data, size_t size, const std::string& label) {
    if (looks_like_gguf(data, size)) return parse_gguf(data, size, label);
    if (looks_like_safetensors(data, size)) return parse_safetensors(data, size, label);
    if (size >= 4 && std::memcmp(data, "PK\x03\x04", 4) == 0) return parse_ckpt(data, size, label);
    if (size >= 2 && data[0] == 0x80 && data[1] <= 5) return parse_ckpt(data, size, label);  // legacy torch pickle
    if (has_suffix(label, ".gguf")) return parse_gguf(data, size, label);
    for (const char* ext : {".ckpt", ".pt", ".pth", ".bin"}) {
        if (has_suffix(label, ext)) return parse_ckpt(data, size, label);
    }
    if (has_suffix(label, ".safetensors") || (size >= 9 && data[8] == '{')) return parse_safetensors(data, size, label);
    return Error{label + ": unrecognised model format (expected safetensors, GGUF or a PyTorch checkpoint)"};
}

Result<std::vector<std::string>> expand_split_parts(const std::string& path) {
    static const std::regex kSplit(R"((.*)-(\d{5})-of-(\d{5})(\.[A-Za-z0-9]+)$)");
    std::smatch m;
    if (!std::regex_match(path, m, kSplit)) return std::vector<std::string>{path};
    const int count = std::stoi(m[3].str());
    if (count < 1) return Error{path + ": split file claims 0 parts"};
    std::vector<std::string> parts;
    for (int i = 1; i <= count; ++i) {
        char part[32];
        std::snprintf(part, sizeof part, "-%05d-of-%05d", i, count);
        std::string p = m[1].str() + part + m[4].str();
        const PathStatus status = path_status(p);
        if (status.kind == PathKind::Missing) {
            return Error{p + ": missing part " + std::to_string(i) + " of " + std::to_string(count) + " of " + path};
        }
        if (status.kind != PathKind::File) return path_error(p, status);
        parts.push_back(std::move(p));
    }
    return parts;
}

Status ModelFile::add_file(const std::string& path, const std::string& component) {
    for (const SourceFile& s : sources_) {
        std::error_code ec;                                         // the overload that cannot throw
        if (fs::equivalent(s.path, path, ec)) return Status::Ok();  // a part named twice is read once
    }
    auto map = MappedFile::open(path);
    if (!map.ok()) return map.error();
    auto parsed = parse_model_bytes((*map)->data(), (*map)->size(), path);
    if (!parsed.ok()) return parsed.error();
    return add_parsed(std::move(parsed).value(), path, *map, component);
}

Result<ModelFile> ModelFile::from_header(ParsedFile parsed, const std::string& label) {
    ModelFile model;
    KILN_TRY(model.add_parsed(std::move(parsed), label, nullptr, ""));
    return model;
}

Status ModelFile::add_parsed(ParsedFile parsed, const std::string& path, std::shared_ptr<MappedFile> map,
                             const std::string& component) {
    const size_t source = sources_.size();
    sources_.push_back(SourceFile{path, parsed.format, std::move(map), component});
    for (auto& [key, value] : parsed.metadata) metadata_.emplace(key, value);
    for (TensorInfo& t : parsed.tensors) {
        t.source = source;
        if (!component.empty()) t.name = component + "/" + t.name;
        auto [it, inserted] = by_name_.emplace(t.name, tensors_.size());
        if (!inserted) {
            return Error{path + ": tensor '" + t.name + "' is also defined in " +
                         sources_[tensors_[it->second].source].path};
        }
        tensors_.push_back(std::move(t));
    }
    return read_fp8_scales(source);
}

Status ModelFile::read_fp8_scales(size_t source) {
    if (!sources_[source].map) return Status::Ok();  // a header alone: no values to read
    for (TensorInfo& t : tensors_) {
        if (t.source != source || (t.dtype != DType::F8_E4M3 && t.dtype != DType::F8_E5M2)) continue;
        const std::string suffix = ".weight";
        if (t.name.size() <= suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        const TensorInfo* scale = find(t.name.substr(0, t.name.size() - suffix.size()) + ".scale_weight");
        if (!scale) continue;
        float value = 0.0f;
        auto decoded = scale->element_count() == 1 ? convert_tensor(*scale, data(*scale), GGML_TYPE_F32)
                                                   : Result<std::vector<uint8_t>>(Error{"not one value"});
        if (decoded.ok()) std::memcpy(&value, decoded->data(), sizeof value);
        if (!decoded.ok() || !std::isfinite(value)) {
            return Error{sources_[source].path + ": " + scale->name + " (" + scale->shape_string() + " " +
                         dtype_name(scale->dtype) +
                         ") is not one finite number, as a scaled FP8 weight's scale must be"};
        }
        t.scale = value;
    }
    return Status::Ok();
}

Status ModelFile::add_component_folder(const std::string& folder, const std::string& component) {
    auto files = component_weight_files(folder);
    if (!files.ok()) return files.error();
    for (const std::string& f : *files) KILN_TRY(add_file(f, component));
    return Status::Ok();
}

Status ModelFile::add_folder(const std::string& path) {
    const std::string index_path = path + "/model_index.json";
    const PathStatus index_status = path_status(index_path);
    if (index_status.kind == PathKind::Missing) {
        // A bare component folder (e.g. a diffusers `vae/` given on its own).
        return add_component_folder(path, "");
    }
    if (index_status.kind != PathKind::File) return path_error(index_path, index_status);
    auto index = read_json_file(index_path);
    if (!index.ok()) return index.error();
    if (!index->is_object()) return Error{index_path + ": not a JSON object"};
    diffusers_ = true;
    if (auto cls = index->find("_class_name"); cls != index->end() && cls->is_string()) {
        metadata_.emplace("diffusers.pipeline", MetaValue::of_string(cls->get<std::string>()));
    }
    size_t components = 0;
    for (auto it = index->begin(); it != index->end(); ++it) {
        // Components are entries ["library", "ClassName"]; tokenizers and
        // schedulers have no weights.
        if (it.key().empty() || it.key()[0] == '_' || !it->is_array() || it->size() != 2) continue;
        if (!(*it)[0].is_string() || (*it)[0].get<std::string>() == "null") continue;
        const std::string sub = path + "/" + it.key();
        if (it.key().find('/') != std::string::npos || path_status(sub).kind != PathKind::Folder) continue;
        // Nor do processors (Qwen-Image-Edit's processor/: Qwen2VLProcessor's configs).
        if (it.key().rfind("tokenizer", 0) == 0 || it.key() == "scheduler" || it.key() == "feature_extractor" ||
            it.key() == "processor" || it.key() == "image_processor")
            continue;
        KILN_TRY(add_component_folder(sub, it.key()));
        ++components;
    }
    if (components == 0) return Error{index_path + ": lists no component folder with weights"};
    const auto family = detect_diffusers_family(tensors_);
    if (family == ModelFamily::Wan && std::any_of(tensors_.begin(), tensors_.end(), [](const TensorInfo& t) {
            return t.name.rfind("transformer_2/", 0) == 0;
        })) {
        // Wan 2.2 A14B's two experts share the DiT's names; kiln takes each
        // from its own flag.
        return Error{path +
                     ": a Wan 2.2 A14B folder holds two experts (transformer/ samples the high-noise steps, "
                     "transformer_2/ the rest): pass --diffusion-model " +
                     path +
                     "/transformer_2 "
                     "--high-noise-diffusion-model " +
                     path + "/transformer --vae " + path + "/vae --t5xxl " + path +
                     "/text_encoder instead of the folder"};
    }
    if (family) {
        rename_diffusers_tensors(*family, tensors_);
        by_name_.clear();
        for (size_t i = 0; i < tensors_.size(); ++i) {
            if (!by_name_.emplace(tensors_[i].name, i).second) {
                return Error{path + ": two tensors map to the internal name '" + tensors_[i].name + "'"};
            }
        }
    }
    return Status::Ok();
}

void ModelFile::rename_as_diffusers_component(ModelFamily family, ModelComponent component) {
    const std::string folder = std::string(diffusers_folder(component)) + "/";
    for (TensorInfo& t : tensors_) t.name = folder + t.name;
    rename_diffusers_tensors(family, tensors_);
    by_name_.clear();
    for (size_t i = 0; i < tensors_.size(); ++i) {
        if (tensors_[i].name.rfind(folder, 0) == 0) tensors_[i].name.erase(0, folder.size());
        by_name_.emplace(tensors_[i].name, i);
    }
}

Status ModelFile::rename_as_diffusers_controlnet() {
    rename_diffusers_controlnet(tensors_);
    by_name_.clear();
    for (size_t i = 0; i < tensors_.size(); ++i) {
        if (!by_name_.emplace(tensors_[i].name, i).second) {
            return Error{"two tensors map to the ControlNet name '" + tensors_[i].name + "'"};
        }
    }
    return Status::Ok();
}

Result<ModelFile> ModelFile::open(const std::vector<std::string>& paths) {
    if (paths.empty()) return Error{"no model file given"};
    ModelFile model;
    for (const std::string& path : paths) {
        const PathStatus status = path_status(path);
        if (status.kind == PathKind::Folder) {
            KILN_TRY(model.add_folder(path));
            continue;
        }
        if (status.kind != PathKind::File) return path_error(path, status);
        auto parts = expand_split_parts(path);
        if (!parts.ok()) return parts.error();
        for (const std::string& part : *parts) KILN_TRY(model.add_file(part, ""));
    }
    return model;
}

double ModelFile::metadata_number(const std::string& key, double fallback) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) return fallback;
    const MetaValue& v = it->second;
    switch (v.kind) {
        case MetaValue::Kind::Int: return static_cast<double>(v.i);
        case MetaValue::Kind::UInt: return static_cast<double>(v.u);
        case MetaValue::Kind::Float: return v.f;
        case MetaValue::Kind::String: {
            char* end = nullptr;
            const double d = std::strtod(v.str.c_str(), &end);
            return end != v.str.c_str() && *end == '\0' ? d : fallback;
        }
        default: return fallback;
    }
}

Result<std::optional<int64_t>> ModelFile::metadata_integer(const std::string& key, int64_t min, int64_t max) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) return std::optional<int64_t>();
    const double v = metadata_number(key, std::nan(""));
    // Compared as doubles before any cast: a cast of NaN or 1e30 to an integer is undefined.
    if (!(v >= static_cast<double>(min) && v <= static_cast<double>(max)) || v != std::floor(v)) {
        return Error{"metadata " + key + " is " + it->second.to_string() + ", expected an integer in [" +
                     std::to_string(min) + ", " + std::to_string(max) + "]"};
    }
    return std::optional<int64_t>(static_cast<int64_t>(v));
}

std::string ModelFile::metadata_string(const std::string& key, const std::string& fallback) const {
    auto it = metadata_.find(key);
    return it == metadata_.end() ? fallback : it->second.to_string();
}

const TensorInfo* ModelFile::find(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* ModelFile::data(const TensorInfo& tensor) const {
    return sources_[tensor.source].map->data() + tensor.offset;
}

}  // namespace kiln::io
