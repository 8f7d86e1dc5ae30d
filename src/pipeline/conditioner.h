// Prompt -> text-encoder conditioning, the way A1111 and stable-diffusion.cpp
// do it: weighted fragments, 77-token chunks (75 + BOS + EOS), each chunk
// encoded separately, token weights applied with the mean restored, chunks
// concatenated along the token axis.
#pragma once

#include <string>
#include <vector>

#include "pipeline/sd_model.h"
#include "util/result.h"

namespace kiln::pipeline {

struct Conditioning {
    std::vector<float> hidden;  // tokens rows of `width` floats
    int64_t tokens = 0;
    int64_t width = 0;
};

// Encodes `prompt` with `clip_skip` (<= 0: the model's default). With
// min_chunks, pads with empty chunks so that a negative prompt has as many
// tokens as its positive (CFG needs both the same length).
Result<Conditioning> encode_prompt(StableDiffusionModel& model, const std::string& prompt, int clip_skip,
                                   size_t min_chunks = 1);

// How many 77-token chunks `prompt` takes.
size_t prompt_chunk_count(const StableDiffusionModel& model, const std::string& prompt);

}  // namespace kiln::pipeline
