#include "tokenizer_sources.h"

namespace kiln::cli {

const std::vector<TokenizerSource>& tokenizer_sources() {
    // CLIP-L and CLIP-G share one BPE vocabulary; each is fetched from its
    // own model's repository so the files are the ones that model shipped.
    static const std::vector<TokenizerSource> table = {
        {"clip-l", "openai/clip-vit-large-patch14", "main", {"vocab.json", "merges.txt"}, "SD1.x, SDXL, Flux (CLIP-L)"},
        {"clip-g",
         "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k",
         "main",
         {"vocab.json", "merges.txt"},
         "SDXL (CLIP-G; the same BPE as CLIP-L)"},
        {"t5xxl", "google/t5-v1_1-xxl", "main", {"spiece.model"}, "Flux, Chroma (T5-XXL)"},
        {"qwen3", "Qwen/Qwen3-4B", "main", {"tokenizer.json"}, "Z-Image (Qwen3-4B)"},
        // Named as the LLM encoder names its architecture, the cache folder
        // the loader looks in (pipeline/model.cpp).
        {"qwen2", "Qwen/Qwen2.5-VL-7B-Instruct", "main", {"tokenizer.json"}, "Qwen-Image (Qwen2.5-VL-7B)"},
        {"llama",
         "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
         "main",
         {"tekken.json"},
         "FLUX.2-dev (Mistral Small 3.2, a Llama)"},
        // umT5's own repository, whose name Wan's code and model folders use
        // for it (Wan-AI's repositories carry a copy under google/umt5-xxl/):
        // its sentencepiece model, with byte fallback.
        {"umt5", "google/umt5-xxl", "main", {"spiece.model"}, "Wan 2.1 (umT5-XXL)"},
    };
    return table;
}

const TokenizerSource* find_tokenizer_source(const std::string& name) {
    for (const TokenizerSource& s : tokenizer_sources()) {
        if (s.name == name) return &s;
    }
    return nullptr;
}

std::string tokenizer_source_names() {
    std::string out;
    for (const TokenizerSource& s : tokenizer_sources()) out += (out.empty() ? "" : ", ") + s.name;
    return out;
}

}  // namespace kiln::cli
