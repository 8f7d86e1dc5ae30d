// A1111 / stable-diffusion.cpp prompt syntax: attention weights, BREAK,
// 77-token chunks, and the weighting of text-encoder output.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/clip_tokenizer.h"
#include "util/result.h"

namespace kiln::pipeline {

// The weight A1111 gives a BREAK marker: parse_prompt_attention yields
// ("BREAK", kBreakWeight) where the prompt says BREAK.
constexpr float kBreakWeight = -1.0f;

// A1111's parse_prompt_attention, rule for rule:
//   (text)        weight x 1.1          [text]   weight / 1.1
//   (text:1.5)    weight x 1.5 (the number is [+-]?[.0-9]+, spaces allowed around it)
//   nesting multiplies; \( \) \[ \] \\ are literal characters; any other
//   backslash is dropped; a ')' or ']' with nothing open is literal text; a
//   '(' or '[' left open applies its factor to everything after it; a ':'
//   that does not end a weight is literal.
//   BREAK (uppercase, a whole word) yields ("BREAK", -1) and swallows the
//   whitespace around it. As in A1111, brackets around BREAK multiply the
//   marker's weight too, after which it is no longer a marker.
//   Adjacent fragments of exactly equal weight are merged; an empty prompt
//   gives {("", 1.0)}.
// Weights are computed in double, as Python does, so merging decisions
// match A1111 exactly; they are returned as float. A weight that parses as
// no number at all (e.g. "(a:.)") counts as 1.0 where A1111 would raise.
std::vector<std::pair<std::string, float>> parse_prompt_attention(std::string_view text);

// 77-token text-encoder inputs: BOS, up to chunk_length tokens, EOS, then
// padding to chunk_length + 2.
struct TokenChunks {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<float>> weights;  // aligned with tokens; 1.0 for BOS, EOS and padding
};

// The most chunks a prompt may make, and the longest prompt: enough for any
// real prompt (64 chunks are 4,800 tokens), and a bound on the text encoder's
// work and memory, which grow with the chunk count (5,000 BREAKs took 108 s
// and 4.2 GB).
constexpr int kMaxPromptChunks = 64;
constexpr size_t kMaxPromptBytes = 64 * 1024;
// The largest emphasis a fragment may have (either sign). A weight
// multiplies the text encoder's hidden states and, through them, the
// cross-attention's keys and values: 1.1^1000 (a thousand nested
// parentheses) is no float at all, and the job ran to its end only to fail
// with "non-finite values". 1e6 is 145 nested parentheses, far past any
// emphasis that means something.
constexpr double kMaxPromptWeight = 1e6;

// Whether `prompt` stays within those limits, from the parse alone (no
// tokenizer needed, so callers check before loading a model); the error
// starts with `what` ("--prompt") and names a fragment whose weight is
// over kMaxPromptWeight.
Status check_prompt_size(std::string_view prompt, const std::string& what);

struct ChunkOptions {
    int chunk_length = 75;  // tokens between BOS and EOS
    // Chunks past this many are dropped, with a warning: the parse itself
    // bounds the text encoder's work, whoever calls it.
    int max_chunks = kMaxPromptChunks;
    // Padding after EOS. -1: the tokenizer's EOS (SD1, SDXL's CLIP-L);
    // SD2's OpenCLIP pads with 0.
    int32_t pad_id = -1;
    // A1111's comma_padding_backtrack: when a chunk is full and its last
    // ",</w>" is at most this many tokens back, the tokens after the comma
    // move to the next chunk. 0 disables.
    int comma_backtrack = 20;
    // false: the prompt is one fragment of weight 1.0 (A1111's emphasis
    // "None"; no brackets, no BREAK).
    bool parse_weights = true;
};

// A1111's tokenize_line: parses the prompt (parse_prompt_attention), encodes
// each fragment separately, and fills chunks. BREAK closes the current chunk
// (an empty one too); a full chunk closes when the next token arrives; an
// embedding's ids never straddle a chunk (one longer than a chunk does, it
// is split). There is always at least one chunk.
TokenChunks tokenize_with_weights(const text::ClipTokenizer& tokenizer, std::string_view prompt,
                                  const ChunkOptions& options = {});

// The same for already-parsed fragments (a fragment ("BREAK", -1) is a
// break).
TokenChunks tokenize_fragments(const text::ClipTokenizer& tokenizer,
                               const std::vector<std::pair<std::string, float>>& fragments,
                               const ChunkOptions& options = {});

// A1111 / sd.cpp emphasis on one chunk's encoder output `hidden`
// (n_tokens rows of `width` floats, row-major): every row is multiplied by
// its token's weight, then everything is scaled by old_mean / new_mean so
// the mean of all values is unchanged. Means are accumulated in double. If
// the weighted mean is 0 the rescale is skipped (A1111 would produce NaN).
void apply_token_weights(float* hidden, int n_tokens, int width, const float* weights);

}  // namespace kiln::pipeline
