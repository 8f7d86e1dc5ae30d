// Mistral's own tokenizer file, tekken.json (mistral_common's Tekkenizer;
// Mistral Small 3.x ships it beside the weights): a tiktoken vocabulary of
// raw bytes by rank, special tokens first in the id space, and the split
// pattern. Read into the byte-level BPE form LlmTokenizer runs, as
// transformers' converter writes the same tokenizer as tokenizer.json.
#pragma once

#include <string>

#include "text/llm_tokenizer.h"
#include "util/result.h"

namespace kiln::text {

// {"config": {"pattern", "default_vocab_size", "default_num_special_tokens"},
//  "vocab": [{"rank", "token_bytes" (base64)}, ...],
//  "special_tokens": [{"rank", "token_str"}, ...]}:
//   - ids below default_num_special_tokens are the special tokens (added
//     tokens; a rank without an entry is "<SPECIAL_N>", as mistral_common
//     fills them);
//   - id num_special + r is the vocabulary token of rank r, for the first
//     default_vocab_size - num_special ranks (the rest are unused, as
//     mistral_common cuts them);
//   - merges: for each token in rank order, every split into two tokens
//     (HF's converter's order: the merged token's rank, then the parts'), so
//     byte-pair merging reaches each token as tiktoken's does; ignore_merges.
// The pattern must be Tekken's. Errors name the file and the field.
Result<LlmBpeVocab> read_tekken_json(const std::string& path);

}  // namespace kiln::text
