// BPE merge lists as tokenizer files write them (merges.txt, open_clip's
// bpe_simple_vocab, GGUF's tokenizer.ggml.merges strings, tokenizer.json's
// "a b" merges): shared by the CLIP and LLM tokenizers.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/result.h"

namespace kiln::text {

using BpeMerge = std::pair<std::string, std::string>;

// "a b" -> (a, b): exactly two symbols separated by spaces or tabs (HF
// splits merge lines on whitespace); false for any other count.
bool split_merge(std::string_view line, BpeMerge& out);

// merges.txt text: an optional "#version" first line, blank lines ignored,
// \r\n accepted, rank = order. A line that is not two symbols is a BadFile
// error naming `label` and the line.
Result<std::vector<BpeMerge>> parse_merges_text(std::string_view text, const std::string& label);

}  // namespace kiln::text
