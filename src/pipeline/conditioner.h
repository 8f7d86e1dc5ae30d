// Prompt -> text-encoder conditioning, the way A1111 and stable-diffusion.cpp
// do it for CLIP: weighted fragments, 77-token chunks (75 + BOS + EOS), each
// chunk encoded separately, token weights applied with the mean restored,
// chunks concatenated along the token axis. T5 (Flux, Chroma) reads the
// prompt as plain text in one sequence of the family's fixed length, as BFL's
// reference does. An LLM (Z-Image's Qwen3) reads the whole prompt in its
// chat template as one sequence of the prompt's own length.
#pragma once

#include <string>
#include <vector>

#include "pipeline/model.h"
#include "pipeline/prompt_images.h"
#include "util/result.h"

namespace kiln::pipeline {

// The longest prompt an LLM encodes, template included: its attention is
// tokens^2 per head, and Z-Image's DiT attends over these tokens too.
constexpr int64_t kMaxLlmTokens = 4096;

struct Conditioning {
    // tokens rows of `width` floats: every text encoder of the family's
    // conditioning side by side (SDXL: 768 CLIP-L then 1280 CLIP-G), group
    // after group along the tokens (models::TextEncoderUse::token_group).
    std::vector<float> hidden;
    int64_t tokens = 0;
    int64_t width = 0;
    // The pooled outputs of the encoders the family pools, of the first
    // chunk, one after the other (SDXL: CLIP-G's; SD3: CLIP-L's then
    // CLIP-G's); empty when the family pools none.
    std::vector<float> pooled;
    // The UNet's vector input (SDXL's label_emb: pooled then the size
    // embeddings), set by generate(); empty when the UNet takes none.
    std::vector<float> y;
    // Which context tokens the DiT attends to (1) or not (0) when the family
    // masks T5's padding (Chroma); empty: all of them.
    std::vector<float> token_valid;
};

// An LLM's input for `prompt`: the family's chat template around it, the
// template's text at weight 1, the prompt's A1111 fragments each tokenized on
// its own (so the ids match sd-cli's where weights split the text). A BREAK
// has no meaning without chunks and is dropped.
// With TextEncoderUse::max_length, exactly that many ids: cut, or padded
// with pad_text's id, `real` saying which are the prompt's (1) and which
// padding (0).
struct LlmPrompt {
    std::vector<int32_t> ids;
    std::vector<float> weights;  // per token
    std::vector<float> real;     // per token with max_length; empty without
    // The leading tokens whose hidden states the context leaves out
    // (TextEncoderUse::drop_prefix: chat_prefix's); 0 without.
    int64_t dropped = 0;
};
LlmPrompt llm_prompt(const text::LlmTokenizer& tokenizer, const models::TextEncoderUse& use, const std::string& prompt);

// The diffusion network's context length for a job: an LLM's prompt length
// under its chat template (null `prompt`: the family's plan_tokens), less
// the dropped prefix, else single_chunk_tokens() (a prompt of one CLIP chunk,
// T5's fixed length).
int64_t context_length(const Model& model, const std::string* prompt);

// A job's T5 options. sd-cli's, for a family that masks T5's padding
// (Chroma): the mask over the padding in the DiT's attention
// (--chroma-disable-dit-mask turns it off), the same mask in T5's own
// attention (--chroma-enable-t5-mask), and how many pad tokens after EOS the
// DiT still sees (--chroma-t5-mask-pad; < 0: the family's, 1). And the
// tokens T5 encodes every prompt to (--max-sequence-length, diffusers'
// max_sequence_length; 0: the family's TextEncoderUse::max_length, which
// request validation keeps it within).
struct T5Options {
    bool dit_mask = true;
    bool t5_mask = false;
    int pad_tokens = -1;
    int length = 0;
};

// One encoder's hidden states: `tokens` rows of `width` floats, in its
// TextEncoderUse::token_group.
struct EncoderStates {
    std::vector<float> hidden;
    int64_t width = 0;
    int64_t tokens = 0;
    int group = 0;
};
// The context of several encoders in `c` (hidden, width, tokens): the
// encoders of a group side by side along the width (each the same token
// count), the groups one after the other along the tokens in group order,
// each row padded with zeros to `context_width` or the widest group (SD3:
// CLIP-L and CLIP-G, padded to 4096, then T5). Takes the states' data.
void join_encoder_states(std::vector<EncoderStates>& states, int64_t context_width, Conditioning& c);

// Encodes `prompt` with every text encoder of the model's family, each at
// layer `clip_skip` from the end (<= 0: the family's default), in as many
// 77-token chunks as the prompt takes (CLIP); T5 and LLM encoders ignore
// clip_skip.
// `images`: an edit job's reference images as its LLM sees them
// (pipeline/prompt_images.h), for a family whose LLM use shows them.
Result<Conditioning> encode_prompt(Model& model, const std::string& prompt, int clip_skip,
                                   const T5Options& t5_options = {}, const std::vector<PromptImage>& images = {});

}  // namespace kiln::pipeline
