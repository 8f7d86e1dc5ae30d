#include "pipeline/conditioner.h"

#include "pipeline/prompt_weights.h"
#include "runtime/graph_session.h"

namespace kiln::pipeline {
namespace {

ChunkOptions chunk_options(const StableDiffusionModel& model) {
    ChunkOptions options;
    options.pad_id = model.pad_token();
    return options;
}

}  // namespace

size_t prompt_chunk_count(const StableDiffusionModel& model, const std::string& prompt) {
    return tokenize_with_weights(model.tokenizer(), prompt, chunk_options(model)).tokens.size();
}

Result<Conditioning> encode_prompt(StableDiffusionModel& model, const std::string& prompt, int clip_skip,
                                   size_t min_chunks) {
    TokenChunks chunks = tokenize_with_weights(model.tokenizer(), prompt, chunk_options(model));
    const int32_t pad = model.pad_token() < 0 ? model.tokenizer().eos_id() : model.pad_token();
    const size_t length = chunks.tokens.front().size();
    while (chunks.tokens.size() < min_chunks) {
        // An empty chunk: BOS, EOS, padding.
        std::vector<int32_t> empty(length, pad);
        empty[0] = model.tokenizer().bos_id();
        empty[1] = model.tokenizer().eos_id();
        chunks.tokens.push_back(std::move(empty));
        chunks.weights.emplace_back(length, 1.0f);
    }
    const models::ClipTextEncoder& clip = model.text_encoder();
    const int64_t width = clip.config().width;
    if (static_cast<int64_t>(length) > clip.config().context) {
        return Error{"prompt chunks of " + std::to_string(length) + " tokens exceed the text encoder's context of " +
                     std::to_string(clip.config().context)};
    }
    const int skip = clip_skip > 0 ? clip_skip : model.default_clip_skip();

    // All chunks in one batch: one graph, one pass over the weights.
    const auto batch = static_cast<int64_t>(chunks.tokens.size());
    std::vector<int32_t> ids;
    for (const auto& chunk : chunks.tokens) ids.insert(ids.end(), chunk.begin(), chunk.end());
    runtime::GraphSession session;
    ggml_tensor* tokens = session.input(GGML_TYPE_I32, {static_cast<int64_t>(length), batch}, ids.data(), "tokens");
    const EmbeddingTable& extra = model.embeddings();
    ggml_tensor* extra_rows = nullptr;
    if (extra.rows() > 0) {
        extra_rows = session.input(GGML_TYPE_F32, {extra.width, static_cast<int64_t>(extra.rows())},
                                   extra.vectors.data(), "embeddings");
    }
    ggml_tensor* out = clip.build(session.ctx(), tokens, skip, extra_rows);
    KILN_TRY(session.run(model.text_encoder_compute(), out));

    Conditioning c;
    c.hidden = runtime::GraphSession::read(out);  // [width, length, batch] = batch x length rows
    c.tokens = static_cast<int64_t>(length) * batch;
    c.width = width;
    for (int64_t b = 0; b < batch; ++b) {
        apply_token_weights(c.hidden.data() + b * static_cast<int64_t>(length) * width, static_cast<int>(length),
                            static_cast<int>(width), chunks.weights[static_cast<size_t>(b)].data());
    }
    return c;
}

}  // namespace kiln::pipeline
