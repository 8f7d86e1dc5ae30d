// Textual-inversion embeddings (--embd-dir): every .pt, .bin or .safetensors
// file in a folder is one embedding, named by its file stem, whose vectors
// replace the name wherever it appears as a word in a prompt (A1111,
// stable-diffusion.cpp).
#pragma once

#include <string>
#include <vector>

#include "pipeline/clip_tokenizer.h"
#include "util/result.h"

namespace kiln::pipeline {

struct EmbeddingTable {
    int64_t width = 0;
    std::vector<float> vectors;  // rows of `width`, for ids vocab_size().. in order
    size_t rows() const { return width ? vectors.size() / static_cast<size_t>(width) : 0; }
};

// Reads one embedding file: the first 2-D tensor (or 1-D: one vector) whose
// last dimension is `width`, preferring A1111's "string_to_param.*" and the
// safetensors "emb_params"/"clip_l" keys. Errors name the file.
Result<std::vector<float>> read_embedding(const std::string& path, int64_t width);

// Loads every embedding file of `folder` into `tokenizer` (new ids) and
// returns the vectors for those ids. A file that cannot be read is an error.
Result<EmbeddingTable> load_embeddings(const std::string& folder, int64_t width, ClipTokenizer& tokenizer);

}  // namespace kiln::pipeline
