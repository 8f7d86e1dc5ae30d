#include "pipeline/conditioner.h"

#include <algorithm>

#include "pipeline/graphs.h"
#include "pipeline/prompt_weights.h"

namespace kiln::pipeline {
namespace {

ChunkOptions chunk_options(const models::TextEncoderUse& use) {
    ChunkOptions options;
    options.pad_id = use.pad_token;
    return options;
}

// One encoder's hidden states of every chunk, [width, length, chunks], with
// the token weights applied.
struct EncodedChunks {
    std::vector<float> hidden;  // [width, length, chunks]
    std::vector<float> pooled;  // of the first chunk, when the encoder pools
    int64_t length = 0;
    int64_t chunks = 0;
};

Result<EncodedChunks> encode_chunks(Model& model, const TextEncoder& encoder, const std::string& prompt,
                                    int clip_skip) {
    const models::TextEncoderUse& use = *encoder.use;
    TokenChunks chunks = tokenize_with_weights(model.tokenizer(), prompt, chunk_options(use));
    const size_t length = chunks.tokens.front().size();
    const int64_t width = encoder.width();
    // Only the first chunk's pooled vector is used: a CLIP used for nothing
    // else (Flux's CLIP-L) encodes that chunk alone.
    if (!use.context) {
        chunks.tokens.resize(1);
        chunks.weights.resize(1);
    }
    const int64_t context = encoder.network->max_length();
    if (static_cast<int64_t>(length) > context) {
        return Error::invalid_request("prompt chunks of " + std::to_string(length) +
                                      " tokens exceed the text encoder's context of " + std::to_string(context));
    }
    const int skip = clip_skip > 0 ? clip_skip : use.default_layer;

    // All chunks in one batch: one graph, one pass over the weights.
    const auto batch = static_cast<int64_t>(chunks.tokens.size());
    std::vector<int32_t> ids;
    for (const auto& chunk : chunks.tokens) ids.insert(ids.end(), chunk.begin(), chunk.end());
    TextEncoderGraph g = build_text_encoder_graph(encoder, ids.data(), static_cast<int64_t>(length), batch, skip);
    KILN_TRY(g.session->run(*encoder.executor, g.out));

    EncodedChunks out;
    out.hidden = runtime::GraphSession::read(g.out);
    // The first chunk's pooled vector, as A1111 and sd-cli take it.
    if (g.pooled_width > 0) {
        const size_t hidden_values = static_cast<size_t>(width * static_cast<int64_t>(length) * batch);
        out.pooled.assign(out.hidden.begin() + hidden_values, out.hidden.begin() + hidden_values + g.pooled_width);
        out.hidden.resize(hidden_values);
    }
    for (int64_t b = 0; b < batch; ++b) {
        apply_token_weights(out.hidden.data() + b * static_cast<int64_t>(length) * width, static_cast<int>(length),
                            static_cast<int>(width), chunks.weights[static_cast<size_t>(b)].data());
    }
    out.length = static_cast<int64_t>(length);
    out.chunks = batch;
    return out;
}

// T5's one sequence of use.max_length tokens, or options.length (EOS, then
// padding): its last hidden state, as BFL's HFEmbedder takes it (no
// attention mask in T5 itself unless options.t5_mask), and which tokens the
// DiT may attend to when the family masks the padding (Chroma: the real
// tokens, EOS and mask_pad_tokens pad tokens; none with options.dit_mask off).
Result<EncodedChunks> encode_t5(const TextEncoder& encoder, const text::T5Tokenizer& tokenizer,
                                const std::string& prompt, const T5Options& options, std::vector<float>* valid) {
    const models::TextEncoderUse& use = *encoder.use;
    const int max_length = options.length > 0 ? options.length : use.max_length;
    const text::PaddedTokens tokens = tokenizer.encode_padded(prompt, max_length, /*pad=*/true);
    const auto length = static_cast<int64_t>(tokens.ids.size());
    const std::vector<float> real(tokens.mask.begin(), tokens.mask.end());  // text and EOS
    const bool t5_mask = (use.mask_padding && options.t5_mask) || use.zero_padding;
    TextEncoderGraph g =
        build_text_encoder_graph(encoder, tokens.ids.data(), length, 1, 0, t5_mask ? real.data() : nullptr);
    KILN_TRY(g.session->run(*encoder.executor, g.out));
    EncodedChunks out;
    out.hidden = runtime::GraphSession::read(g.out);
    out.length = length;
    out.chunks = 1;
    if (use.zero_padding) {
        const auto width = static_cast<size_t>(encoder.width());
        for (size_t t = 0; t < real.size(); ++t) {
            if (real[t] == 0.0f) std::fill_n(out.hidden.begin() + t * width, width, 0.0f);
        }
    }
    if (use.mask_padding && options.dit_mask) {
        valid->assign(real.begin(), real.end());
        int extra = options.pad_tokens >= 0 ? options.pad_tokens : use.mask_pad_tokens;
        for (float& v : *valid) {
            if (v == 0.0f && extra > 0) {
                v = 1.0f;
                --extra;
            }
        }
    }
    return out;
}

// An LLM's hidden states of the whole prompt under the family's chat
// template, as sd-cli makes them: one sequence with a causal mask, then the
// token weights applied to the rows with the mean restored.
Result<EncodedChunks> encode_llm(const TextEncoder& encoder, const text::LlmTokenizer& tokenizer,
                                 const std::string& prompt, const std::vector<PromptImage>& images) {
    const models::TextEncoderUse& use = *encoder.use;
    LlmPrompt input;
    LlmImagePrompt with_images;
    if (!images.empty() && !use.vision_module.empty()) {  // an edit job: the images in the prompt
        with_images = llm_image_prompt(tokenizer, use, prompt, images);
        input.ids = with_images.ids;
        input.weights = with_images.weights;
        input.dropped = with_images.dropped;
    } else {
        input = llm_prompt(tokenizer, use, prompt);
    }
    const auto length = static_cast<int64_t>(input.ids.size());
    if (length > kMaxLlmTokens) {
        return Error::invalid_request("the prompt is " + std::to_string(length) + " tokens under the " + use.module +
                                      " chat template" + (with_images.grids.empty() ? "" : ", its images included") +
                                      "; at most " + std::to_string(kMaxLlmTokens) + " are encoded");
    }
    TextEncoderGraph g = build_text_encoder_graph(encoder, input.ids.data(), length, 1, use.default_layer,
                                                  input.real.empty() ? nullptr : input.real.data(), with_images.grids,
                                                  with_images.rows.empty() ? nullptr : with_images.rows.data());
    KILN_TRY(g.session->run(*encoder.executor, g.out));
    EncodedChunks out;
    out.hidden = runtime::GraphSession::read(g.out);
    out.length = length;
    out.chunks = 1;
    apply_token_weights(out.hidden.data(), static_cast<int>(length), static_cast<int>(encoder.width()),
                        input.weights.data());
    if (input.dropped > 0) {
        out.hidden.erase(out.hidden.begin(), out.hidden.begin() + input.dropped * encoder.width());
        out.length = length - input.dropped;
    }
    if (use.zero_pad_to > out.length) {
        out.hidden.resize(static_cast<size_t>(use.zero_pad_to) * static_cast<size_t>(encoder.width()), 0.0f);
        out.length = use.zero_pad_to;
    }
    return out;
}

}  // namespace

int64_t context_length(const Model& model, const std::string* prompt) {
    for (const TextEncoder& te : model.text_encoders()) {
        if (te.use->layout != models::PromptLayout::ChatTemplate) continue;
        // The prefix alone says how many tokens are dropped.
        const LlmPrompt input = llm_prompt(model.llm_tokenizer(), *te.use, prompt ? *prompt : std::string());
        const int64_t tokens = prompt ? static_cast<int64_t>(input.ids.size()) : te.use->plan_tokens;
        return std::max<int64_t>(tokens - input.dropped, te.use->zero_pad_to);
    }
    return single_chunk_tokens(model);
}

LlmPrompt llm_prompt(const text::LlmTokenizer& tokenizer, const models::TextEncoderUse& use,
                     const std::string& prompt) {
    LlmPrompt out;
    auto append = [&](const std::string& text, float weight) {
        const std::vector<int32_t> piece = tokenizer.encode(text);
        out.ids.insert(out.ids.end(), piece.begin(), piece.end());
        out.weights.insert(out.weights.end(), piece.size(), weight);
    };
    append(use.chat_prefix, 1.0f);
    if (use.drop_prefix) out.dropped = static_cast<int64_t>(out.ids.size());
    for (const auto& [text, weight] : parse_prompt_attention(prompt)) {
        if (weight == kBreakWeight && text == "BREAK") continue;
        append(text, weight);
    }
    append(use.chat_suffix, 1.0f);
    // A fixed length: cut, or padded, the padding to be masked (FLUX.2 klein).
    if (use.max_length > 0) {
        const auto n = static_cast<size_t>(use.max_length);
        out.real.assign(n, 0.0f);
        std::fill_n(out.real.begin(), std::min(n, out.ids.size()), 1.0f);
        out.ids.resize(n, tokenizer.token_id(use.pad_text));  // found when the model loaded
        out.weights.resize(n, 1.0f);
    }
    return out;
}

Result<Conditioning> encode_prompt(Model& model, const std::string& prompt, int clip_skip, const T5Options& t5_options,
                                   const std::vector<PromptImage>& images) {
    Conditioning c;
    std::vector<EncoderStates> states;
    for (const TextEncoder& encoder : model.text_encoders()) {
        Result<EncodedChunks> encoded = Error{"unreachable"};
        switch (encoder.use->layout) {
            case models::PromptLayout::ClipChunks: encoded = encode_chunks(model, encoder, prompt, clip_skip); break;
            case models::PromptLayout::FixedLength:
                encoded = encode_t5(encoder, model.t5_tokenizer(), prompt, t5_options, &c.token_valid);
                break;
            case models::PromptLayout::ChatTemplate:
                encoded = encode_llm(encoder, model.llm_tokenizer(), prompt, images);
                break;
        }
        if (!encoded.ok()) return encoded.error();
        c.pooled.insert(c.pooled.end(), encoded->pooled.begin(), encoded->pooled.end());
        if (!encoder.use->context) continue;  // Flux's CLIP-L: the pooled vector only
        states.push_back(
            {std::move(encoded->hidden), encoder.width(), encoded->length * encoded->chunks, encoder.use->token_group});
    }
    // An optional encoder no file held (SD3's T5): zero rows in its place.
    for (const models::TextEncoderUse* use : model.absent_text_encoders()) {
        const int64_t rows = t5_options.length > 0 ? t5_options.length : use->max_length;
        if (use->context) states.push_back({{}, 0, rows, use->token_group});
    }
    join_encoder_states(states, model.diffusion().capabilities().context_width, c);
    return c;
}

void join_encoder_states(std::vector<EncoderStates>& states, int64_t context_width, Conditioning& c) {
    std::stable_sort(states.begin(), states.end(),
                     [](const EncoderStates& a, const EncoderStates& b) { return a.group < b.group; });
    // Each group's width and rows (its longest member's: the others' rows
    // after theirs stay zero), and the first row of each group.
    std::vector<int64_t> group_width, group_tokens, group_row;
    for (size_t i = 0; i < states.size(); ++i) {
        if (i == 0 || states[i].group != states[i - 1].group) {
            group_width.push_back(0);
            group_tokens.push_back(0);
        }
        group_width.back() += states[i].width;
        group_tokens.back() = std::max(group_tokens.back(), states[i].tokens);
    }
    c.width = context_width;
    c.tokens = 0;
    for (size_t g = 0; g < group_width.size(); ++g) {
        group_row.push_back(c.tokens);
        c.tokens += group_tokens[g];
        c.width = std::max(c.width, group_width[g]);
    }
    c.hidden.assign(static_cast<size_t>(c.tokens * c.width), 0.0f);
    size_t group = 0;
    int64_t offset = 0;
    for (size_t i = 0; i < states.size(); ++i) {
        if (i > 0 && states[i].group != states[i - 1].group) {
            ++group;
            offset = 0;
        }
        const EncoderStates& e = states[i];
        for (int64_t t = 0; t < e.tokens && e.width > 0; ++t) {
            std::copy_n(e.hidden.begin() + t * e.width, e.width,
                        c.hidden.begin() + (group_row[group] + t) * c.width + offset);
        }
        offset += e.width;
    }
}

}  // namespace kiln::pipeline
