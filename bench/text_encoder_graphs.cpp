#include "text_encoder_graphs.h"

#include "pipeline/conditioner.h"
#include "pipeline/prompt_weights.h"

namespace kiln::bench {

std::vector<std::string> encoded_prompts(const pipeline::Model& model, const std::string& prompt,
                                         const std::string& negative_prompt, float cfg_scale) {
    std::vector<std::string> prompts{prompt};
    // As generate(): CFG encodes the negative prompt unless the family uses
    // zeros for an empty one (SDXL).
    const bool zeroed = model.family().conditioning.zero_empty_negative && negative_prompt.empty();
    if (cfg_scale != 1.0f && !zeroed) prompts.push_back(negative_prompt);
    return prompts;
}

std::vector<TextEncoderJobGraph> build_text_encoder_graphs(const pipeline::Model& model,
                                                           const std::vector<std::string>& prompts) {
    std::vector<TextEncoderJobGraph> out;
    for (const std::string& prompt : prompts) {
        for (const pipeline::TextEncoder& encoder : model.text_encoders()) {
            const models::TextEncoderUse& use = *encoder.use;
            TextEncoderJobGraph g;
            g.encoder = &encoder;
            if (use.layout == models::PromptLayout::ChatTemplate) {
                const pipeline::LlmPrompt input = pipeline::llm_prompt(model.llm_tokenizer(), use, prompt);
                const auto length = static_cast<int64_t>(input.ids.size());
                g.graph = pipeline::build_text_encoder_graph(encoder, input.ids.data(), length, 1, use.default_layer,
                                                             input.real.empty() ? nullptr : input.real.data());
                g.label = use.module + ", " + std::to_string(length) + " tokens";
            } else if (use.layout == models::PromptLayout::FixedLength) {
                const text::PaddedTokens tokens =
                    model.t5_tokenizer().encode_padded(prompt, use.max_length, /*pad=*/true);
                const auto length = static_cast<int64_t>(tokens.ids.size());
                g.graph = pipeline::build_text_encoder_graph(encoder, tokens.ids.data(), length, 1, 0);
                g.label = use.module + ", " + std::to_string(length) + " tokens";
            } else {
                pipeline::ChunkOptions options;
                options.pad_id = use.pad_token;
                pipeline::TokenChunks chunks = pipeline::tokenize_with_weights(model.tokenizer(), prompt, options);
                if (!use.context) chunks.tokens.resize(1);  // its pooled vector only: the first chunk
                const auto length = static_cast<int64_t>(chunks.tokens.front().size());
                const auto batch = static_cast<int64_t>(chunks.tokens.size());
                std::vector<int32_t> ids;
                for (const auto& chunk : chunks.tokens) ids.insert(ids.end(), chunk.begin(), chunk.end());
                g.graph = pipeline::build_text_encoder_graph(encoder, ids.data(), length, batch, use.default_layer);
                g.label = use.module + ", " + std::to_string(length) + " tokens x " + std::to_string(batch) +
                          (batch == 1 ? " chunk" : " chunks");
            }
            if (!g.graph.session || !g.graph.out) continue;
            g.cgraph = g.graph.session->graph(g.graph.out);
            out.push_back(std::move(g));
        }
    }
    return out;
}

}  // namespace kiln::bench
