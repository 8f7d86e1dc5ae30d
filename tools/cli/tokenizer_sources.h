// Where `kiln pull --tokenizer NAME` takes each tokenizer from: a fixed hub
// repository and the few files of it that kiln's loaders read. The names
// are the folders under CACHE/tokenizers/ that model loading searches last
// (src/util/kiln_cache.h, src/pipeline/model.cpp); docs/pull.md lists them.
#pragma once

#include <string>
#include <vector>

namespace kiln::cli {

struct TokenizerSource {
    std::string name;      // "clip-l": the flag's value and the cache folder's name
    std::string repo;      // "openai/clip-vit-large-patch14"
    std::string revision;  // "main"
    std::vector<std::string> files;
    std::string used_by;  // for --help: "SD1.x, SDXL, Flux (CLIP-L)"
};

const std::vector<TokenizerSource>& tokenizer_sources();

// The source named `name`, or null.
const TokenizerSource* find_tokenizer_source(const std::string& name);

// "clip-l, clip-g, t5xxl, qwen3".
std::string tokenizer_source_names();

}  // namespace kiln::cli
