#include "pipeline/conditioner.h"

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

Result<EncodedChunks> encode_chunks(Model& model, const TextEncoder& encoder, const std::string& prompt, int clip_skip,
                                    size_t min_chunks) {
    const models::TextEncoderUse& use = *encoder.use;
    TokenChunks chunks = tokenize_with_weights(model.tokenizer(), prompt, chunk_options(use));
    const int32_t pad = use.pad_token < 0 ? model.tokenizer().eos_id() : use.pad_token;
    const size_t length = chunks.tokens.front().size();
    while (chunks.tokens.size() < min_chunks) {
        // An empty chunk: BOS, EOS, padding.
        std::vector<int32_t> empty(length, pad);
        empty[0] = model.tokenizer().bos_id();
        empty[1] = model.tokenizer().eos_id();
        chunks.tokens.push_back(std::move(empty));
        chunks.weights.emplace_back(length, 1.0f);
    }
    const models::ClipTextEncoder& clip = *encoder.network;
    const int64_t width = clip.config().width;
    if (static_cast<int64_t>(length) > clip.config().context) {
        return Error::invalid_request("prompt chunks of " + std::to_string(length) +
                                      " tokens exceed the text encoder's context of " +
                                      std::to_string(clip.config().context));
    }
    const int skip = clip_skip > 0 ? clip_skip : use.default_layer;

    // All chunks in one batch: one graph, one pass over the weights.
    const auto batch = static_cast<int64_t>(chunks.tokens.size());
    std::vector<int32_t> ids;
    for (const auto& chunk : chunks.tokens) ids.insert(ids.end(), chunk.begin(), chunk.end());
    // Textual-inversion vectors are as wide as the encoder they were made for.
    const EmbeddingTable& extra = model.embeddings();
    TextEncoderGraph g = build_text_encoder_graph(encoder, ids.data(), static_cast<int64_t>(length), batch, skip,
                                                  extra.width == width ? &extra : nullptr);
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

}  // namespace

size_t prompt_chunk_count(const Model& model, const std::string& prompt) {
    return tokenize_with_weights(model.tokenizer(), prompt, chunk_options(*model.text_encoders().front().use))
        .tokens.size();
}

Result<Conditioning> encode_prompt(Model& model, const std::string& prompt, int clip_skip, size_t min_chunks) {
    Conditioning c;
    std::vector<std::vector<float>> parts;
    std::vector<int64_t> widths;
    for (const TextEncoder& encoder : model.text_encoders()) {
        auto encoded = encode_chunks(model, encoder, prompt, clip_skip, min_chunks);
        if (!encoded.ok()) return encoded.error();
        c.tokens = encoded->length * encoded->chunks;
        widths.push_back(encoder.network->config().width);
        c.width += widths.back();
        if (!encoded->pooled.empty()) c.pooled = std::move(encoded->pooled);
        parts.push_back(std::move(encoded->hidden));
    }
    if (parts.size() == 1) {
        c.hidden = std::move(parts.front());
        return c;
    }
    // Side by side: each token's row is every encoder's row in turn.
    c.hidden.resize(static_cast<size_t>(c.tokens * c.width));
    int64_t offset = 0;
    for (size_t e = 0; e < parts.size(); ++e) {
        for (int64_t t = 0; t < c.tokens; ++t) {
            std::copy_n(parts[e].begin() + t * widths[e], widths[e], c.hidden.begin() + t * c.width + offset);
        }
        offset += widths[e];
    }
    return c;
}

}  // namespace kiln::pipeline
