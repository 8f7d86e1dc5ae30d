#include "text/vocab_files.h"

#include <cstdint>
#include <exception>

#include "io/model_file.h"
#include "util/files.h"
#include "util/message_text.h"

namespace kiln::text {

using json = nlohmann::json;

Error bad_file(const std::string& label, const std::string& what) { return Error::bad_file(label + ": " + what); }

Result<std::string> read_tokenizer_file(const std::string& path) {
    return read_whole_file(path, size_t{1} << 30, "tokenizer");
}

Result<json> read_tokenizer_json(const std::string& path) {
    auto text = read_tokenizer_file(path);
    if (!text.ok()) return text.error();
    try {
        return json::parse(text.value());
    } catch (const json::exception& e) {
        return bad_file(path, std::string("malformed JSON: ") + e.what());
    } catch (const std::exception& e) {
        return bad_file(path, std::string("cannot parse: ") + e.what());
    }
}

const json* find_member(const json& object, const char* key) {
    if (!object.is_object()) return nullptr;
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
}

Result<std::vector<BpeMerge>> tokenizer_json_merges(const json& model, const std::string& path) {
    const json* list = find_member(model, "merges");
    if (!list || !list->is_array()) return bad_file(path, "no model.merges array");
    std::vector<BpeMerge> merges;
    merges.reserve(list->size());
    for (const json& m : *list) {
        BpeMerge merge;
        if (m.is_string()) {
            if (!split_merge(m.get_ref<const std::string&>(), merge)) {
                return bad_file(path, "merge " + std::to_string(merges.size()) + " " + json_text(m) +
                                          " is not two space-separated symbols");
            }
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
            merge = {m[0].get<std::string>(), m[1].get<std::string>()};
        } else {
            return bad_file(path, "merge " + std::to_string(merges.size()) + " " + json_text(m) +
                                      " is neither \"a b\" nor [\"a\", \"b\"]");
        }
        merges.push_back(std::move(merge));
    }
    return merges;
}

const io::MetaValue* find_meta(const io::Metadata& metadata, const std::string& key) {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
}

bool meta_integer(const io::MetaValue& v, int64_t& out) {
    if (v.kind == io::MetaValue::Kind::Int) {
        out = v.i;
        return true;
    }
    if (v.kind == io::MetaValue::Kind::UInt && v.u <= static_cast<uint64_t>(INT64_MAX)) {
        out = static_cast<int64_t>(v.u);
        return true;
    }
    return false;
}

bool meta_number(const io::MetaValue& v, double& out) {
    switch (v.kind) {
        case io::MetaValue::Kind::Float: out = v.f; return true;
        case io::MetaValue::Kind::Int: out = static_cast<double>(v.i); return true;
        case io::MetaValue::Kind::UInt: out = static_cast<double>(v.u); return true;
        default: return false;
    }
}

Status expect_gguf_tokenizer_model(const io::Metadata& metadata, std::string_view model, std::string_view kind,
                                   const std::string& label) {
    const io::MetaValue* v = find_meta(metadata, "tokenizer.ggml.model");
    if (!v) return bad_file(label, "no tokenizer.ggml.model: the file carries no tokenizer");
    if (v->kind != io::MetaValue::Kind::String || v->str != model) {
        return bad_file(label, "tokenizer.ggml.model is " + quoted_text(v->to_string()) + ", not \"" +
                                   std::string(model) + "\" (" + std::string(kind) + ")");
    }
    return Status::Ok();
}

std::string model_file_label(const io::ModelFile& file) {
    return file.sources().empty() ? std::string("model") : file.sources().front().path;
}

}  // namespace kiln::text
