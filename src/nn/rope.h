// Rotary position embedding from a table the caller computes on the host
// (the DiTs' multi-axis positions: models/nets/flux_dit, models/nets/z_image_dit), for
// heads whose features rotate in consecutive pairs (BFL's and Tongyi's
// complex-number RoPE). ggml_rope_ext serves the one-axis NeoX layout
// (models/nets/llm_encoder) and needs no table.
#pragma once

#include <cstdint>
#include <vector>

#include <string>

#include "ggml.h"
#include "util/result.h"

namespace kiln::nn {

// x ne [head_dim, heads, L, B] (contiguous) rotated by the table's planes
// `cos` and `sin` (each ne [head_dim, 1, L, 1 or B]; per pair j, cos holds
// (cos a_j, cos a_j) and sin the signed (-sin a_j, sin a_j)):
// x * cos + swap_pairs(x) * sin. Returns ne [heads * head_dim, L, B].
ggml_tensor* rope_pairs(ggml_context* ctx, ggml_tensor* x, ggml_tensor* cos, ggml_tensor* sin);

// The table rope_pairs reads, for tokens with one position per axis
// (`positions`: tokens x axes values, token after token): ne [head_dim,
// tokens, 2], F32, head_dim = sum(axes_dim). Plane 0 holds each pair's
// cosine twice (cos a_j, cos a_j), plane 1 the signed sines (-sin a_j,
// sin a_j). Axis a owns its consecutive block of axes_dim[a] features; the
// angle of its pair j is pos_a * theta^(-2j / axes_dim[a]), in double
// precision (Flux's three axes, FLUX.2's four).
// RoPE axes from a file's metadata `key` ("8,12,12" for small test models):
// even positive sizes; an error (BadFile) naming the key and `example`
// otherwise.
Result<std::vector<int>> parse_rope_axes(const std::string& key, const std::string& text, const std::string& example);

//
// `periods` (empty, or one per position): a token's axis with a period P > 0
// repeats every P positions (an image's seam, nn/seams.h): each frequency
// is rounded to the nearest whole number of turns over P, so positions p
// and p + P rotate alike and attention sees the grid as a torus (sd-cli's
// circular RoPE).
std::vector<float> rope_axes_table(const std::vector<int64_t>& positions, const std::vector<int>& axes_dim,
                                   float theta, const std::vector<int64_t>& periods = {});

// The frequency `omega` (radians per position) rounded to the nearest whole
// number of turns over `period` positions (rope_axes_table's periods);
// `omega` itself for a period of 0.
double periodic_frequency(double omega, int64_t period);

}  // namespace kiln::nn
