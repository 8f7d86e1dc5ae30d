// Textual-inversion embeddings (--embd-dir): every .pt, .bin or .safetensors
// file in a folder is one embedding, named by its file stem, whose vectors
// replace the name wherever it appears as a word in a prompt (A1111,
// stable-diffusion.cpp).
#pragma once

#include <string>
#include <vector>

#include "text/clip_tokenizer.h"
#include "util/result.h"

namespace kiln::pipeline {

struct EmbeddingTable {
    int64_t width = 0;
    std::vector<float> vectors;  // rows of `width`, for ids vocab_size().. in order
    int32_t eos_id = -1;         // the tokenizer's EOS, where a pooling encoder pools
    size_t rows() const { return width ? vectors.size() / static_cast<size_t>(width) : 0; }
};

// A CLIP text encoder that takes embeddings: its module name, which is also
// the key SDXL embedding files use for its vectors ("clip_l", "clip_g"), and
// its width.
struct EmbeddingTarget {
    std::string name;
    int64_t width = 0;
};

// Reads one embedding file's vectors for `target`: the first 2-D tensor (or
// 1-D: one vector) whose last dimension is the target's width, preferring the
// target's own key, then A1111's "string_to_param.*" and "emb_params". Errors
// name the file.
Result<std::vector<float>> read_embedding(const std::string& path, const EmbeddingTarget& target);

// Loads every embedding file of `folder` into `tokenizer` (new ids) and
// returns the vectors for those ids, one table per target in order. Each
// file must give every target the same number of vectors (an SDXL file
// carries clip_l and clip_g rows); a file that cannot be read is an error. A
// file with no vectors of some target's width was made for another model: it
// is skipped with a warning (A1111 lists it as skipped), and its word stays
// plain text.
Result<std::vector<EmbeddingTable>> load_embeddings(const std::string& folder,
                                                    const std::vector<EmbeddingTarget>& targets,
                                                    text::ClipTokenizer& tokenizer);

}  // namespace kiln::pipeline
