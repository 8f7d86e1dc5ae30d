// Prompt -> text-encoder conditioning, the way A1111 and stable-diffusion.cpp
// do it for CLIP: weighted fragments, 77-token chunks (75 + BOS + EOS), each
// chunk encoded separately, token weights applied with the mean restored,
// chunks concatenated along the token axis. T5 (Flux, Chroma) reads the
// prompt as plain text in one sequence of the family's fixed length, as BFL's
// reference does.
#pragma once

#include <string>
#include <vector>

#include "pipeline/model.h"
#include "util/result.h"

namespace kiln::pipeline {

struct Conditioning {
    // tokens rows of `width` floats: every text encoder of the family's
    // conditioning side by side (SDXL: 768 CLIP-L then 1280 CLIP-G).
    std::vector<float> hidden;
    int64_t tokens = 0;
    int64_t width = 0;
    // The pooled, projected output of the encoder the family pools (SDXL's
    // CLIP-G), of the first chunk; empty when the family pools none.
    std::vector<float> pooled;
    // The UNet's vector input (SDXL's label_emb: pooled then the size
    // embeddings), set by generate(); empty when the UNet takes none.
    std::vector<float> y;
    // Which context tokens the DiT attends to (1) or not (0) when the family
    // masks T5's padding (Chroma); empty: all of them.
    std::vector<float> token_valid;
};

// Encodes `prompt` with every text encoder of the model's family, each at
// layer `clip_skip` from the end (<= 0: the family's default), in as many
// 77-token chunks as the prompt takes.
Result<Conditioning> encode_prompt(Model& model, const std::string& prompt, int clip_skip);

}  // namespace kiln::pipeline
