// LoRA, LoHa and LoKr for every family: A1111's and sd-cli's prompt syntax
// <lora:NAME:WEIGHT>, files found in --lora-model-dir, and the weights of a
// loaded model changed without touching its base weights
// (runtime/weight_patches.h), so the next job may name other LoRAs at no
// reload. docs/lora.md.
//
// Per weight, --lora-apply-mode decides:
//   immediately  W + delta merged once into a copy of W (requantized when W
//                is quantized); the graph reads the copy;
//   at_runtime   W untouched; a LoRA adds scale * up (down x) to W x, a LoHa,
//                LoKr or full diff its dense delta times x (DoRA layers and
//                bias changes are merged whatever the mode);
//   auto         immediately for float weights, at run time for quantized
//                ones (no precision lost to requantizing), as sd-cli.
// Every adapter tensor is a weight of the module it changes: placed,
// streamed and counted with it by the memory system.
#pragma once

#include <string>
#include <vector>

#include "pipeline/model.h"
#include "util/result.h"

namespace kiln::pipeline {

struct LoraRequest {
    std::string name;  // as in the tag: a file stem under --lora-model-dir
    float strength = 1.0f;
    // sd-cli's <lora:|high_noise|NAME:W>: for Wan 2.2 A14B's high-noise
    // expert alone (the lightx2v LoRAs come in a high- and a low-noise
    // file); a plain tag changes the other modules, never the expert.
    bool high_noise = false;
};

struct PromptLoras {
    std::string prompt;  // the prompt with every tag removed
    std::vector<LoraRequest> loras;
    // An opener with no '>' after it ("<lora:name:1"), kept as prompt text
    // as A1111 keeps it; "" when there is none. Worth a warning: it is
    // almost always a tag that lost its end.
    std::string unclosed;
};

// Removes every <lora:NAME> / <lora:NAME:WEIGHT> tag (A1111's syntax: the
// weight defaults to 1, may be negative; a later tag of the same name adds
// to it as A1111 does), and sd-cli's <lora:|high_noise|NAME:WEIGHT>. Errors
// (invalid request): a tag without a name, a
// weight that is not a finite number, or a name that is a path out of the
// folder ("..", an absolute path).
Result<PromptLoras> extract_lora_tags(const std::string& prompt);

// "auto", "immediately", "at_runtime".
Result<LoraApplyMode> parse_lora_apply_mode(const std::string& text);
const char* lora_apply_mode_name(LoraApplyMode mode);

// Makes `loras` the model's adapters, replacing those of the last call (an
// identical list costs nothing; an empty one restores the base weights).
// Zero-strength LoRAs are skipped, so they change nothing at all. Errors:
// no --lora-model-dir, a name with no file there (invalid request, naming
// both); a file that cannot be read or whose layers match no weight of the
// model (bad file); no room on the device for the adapter weights (out of
// memory); a high-noise LoRA for a model without the expert (invalid
// request). On an error the model is left with no LoRA.
Status apply_loras(Model& model, const std::vector<LoraRequest>& loras);

// The file a LoRA name means: NAME.safetensors, .sft, .ckpt, .pt or .gguf
// under `folder` (NAME may hold subfolders).
Result<std::string> find_lora_file(const std::string& folder, const std::string& name);

// A1111's "Lora hashes" value for the prompt's LoRAs ("name1: hash1, name2:
// hash2"; "" when there is none), as extensions-builtin/Lora's
// ExtraNetworkLora.activate writes it: every LoRA the tags name, zero
// strength included (A1111 loads those too), as "NAME: HASH" with NAME the
// tag's name less every ':' and ',' (a later name equal to an earlier one
// replaces its hash in place, as A1111's dict does) and HASH
// io::lora_short_hash of its file under `folder`. A LoRA whose file is
// missing or unreadable is left out: the hashes never fail a job.
std::string lora_hashes_text(const std::string& folder, const std::vector<LoraRequest>& loras);

}  // namespace kiln::pipeline
