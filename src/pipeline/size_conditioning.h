// SDXL's micro-conditioning: the vector `y` its UNet's label_emb takes. sgm's
// GeneralConditioner concatenates, in embedder order, the pooled output of the
// second text encoder (OpenCLIP bigG through text_projection, 1280 wide) and
// one ConcatTimestepEmbedderND(256) per size pair: original size (h, w), crop
// top-left (top, left), target size (h, w); 1280 + 6 * 256 = 2816.
//
// Each number v becomes sgm's Timestep embedding (diffusionmodules/util.py
// timestep_embedding): cat(cos(v f_0..f_{half-1}), sin(v f_0..f_{half-1})),
// f_i = exp(-ln(10000) i / half), half = dim / 2, a zero appended when dim is
// odd; a pair's two embeddings follow each other. Computed in double and
// rounded to float once (sgm computes in float32; the two differ by float32's
// rounding of v * f_i, at most about 1e-4 for sizes near 1024).
#pragma once

#include <cstdint>
#include <vector>

namespace kiln::pipeline {

struct SizeConditioning {
    double original_height = 1024, original_width = 1024;
    double crop_top = 0, crop_left = 0;
    double target_height = 1024, target_width = 1024;
};

// The sinusoidal embedding of one number, `dim` values, appended to `out`.
void append_sinusoidal_embedding(double value, int dim, std::vector<float>& out);

// pooled (any width, one prompt) followed by the six numbers' embeddings of
// `dim` values each (SDXL: 256): pooled.size() + 6 * dim values.
std::vector<float> sdxl_conditioning_vector(const std::vector<float>& pooled, const SizeConditioning& size,
                                            int dim = 256);

}  // namespace kiln::pipeline
