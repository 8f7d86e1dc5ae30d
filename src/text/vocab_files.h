// What the tokenizer loaders share in reading vocabulary files: the bound on
// a vocabulary, reading a tokenizer file and its JSON, tokenizer.json's BPE
// merges, and GGUF's tokenizer.ggml.* metadata. Errors are BadFile errors
// that start with the file's name (or the label given).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "io/tensor_info.h"
#include "text/bpe_merges.h"
#include "util/result.h"

namespace kiln::io {
class ModelFile;
}

namespace kiln::text {

// No vocabulary may have more entries (ids are below it): far above any real
// tokenizer (CLIP has 49408, T5 32k, UMT5 256k, Qwen 152k) and small enough
// that a hostile file cannot make kiln allocate without limit.
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;

// Error::bad_file(label + ": " + what).
Error bad_file(const std::string& label, const std::string& what);

// A tokenizer file's bytes (at most 1 GiB).
Result<std::string> read_tokenizer_file(const std::string& path);
// A tokenizer file parsed as JSON; "PATH: malformed JSON: ..." if it is not.
Result<nlohmann::json> read_tokenizer_json(const std::string& path);

// object[key], nullptr when absent or `object` is not an object; never a
// copy (copying recurses once per nesting level of the value).
const nlohmann::json* find_member(const nlohmann::json& object, const char* key);

// tokenizer.json's model.merges: "a b" strings or ["a", "b"] pairs, rank =
// order. `model` is the "model" object, `path` names the file in errors.
Result<std::vector<BpeMerge>> tokenizer_json_merges(const nlohmann::json& model, const std::string& path);

// GGUF metadata: the value of `key`, nullptr if absent.
const io::MetaValue* find_meta(const io::Metadata& metadata, const std::string& key);
// A signed or unsigned integer that fits int64_t.
bool meta_integer(const io::MetaValue& v, int64_t& out);
// An integer or a float, as double.
bool meta_number(const io::MetaValue& v, double& out);
// Checks tokenizer.ggml.model: it must be the string `model`; `kind` says
// what that is in the error ("a byte-level BPE tokenizer").
Status expect_gguf_tokenizer_model(const io::Metadata& metadata, std::string_view model, std::string_view kind,
                                   const std::string& label);
// The name of a model's first file, for errors about the tokenizer it carries.
std::string model_file_label(const io::ModelFile& file);

}  // namespace kiln::text
