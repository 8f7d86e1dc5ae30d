// Random-weight model files written at test time from a committed spec
// (tests/fixtures/*.spec: "name dtype dim..." per line, outermost first),
// so tests can use a model larger than the fixtures worth committing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ggml.h"
#include "util/result.h"

namespace kiln::test {

// Writes a safetensors file with the spec's tensors (F16 or F32; I64 index
// buffers such as position_ids count 0, 1, ... along their last dimension), each
// filled deterministically from its name: linear and conv weights
// ~N(0, 1/fan_in), norm scales ~1, biases small, embeddings ~N(0, 1) (the
// initialisation training/make_model_fixtures.py uses).
Status write_random_model(const std::string& spec_path, const std::string& out_path);

// Writes the spec's header only and extends the file to its full size
// without writing data (a sparse file: no disk blocks, zeros when read), for
// tests that read names and shapes alone (kiln info, kiln plan). Also takes
// BF16 tensors.
Status write_sparse_model(const std::string& spec_path, const std::string& out_path);

// A GGUF metadata value: a string, a uint32 (counts, lengths, ids, file
// types), a float32 (rope bases, epsilons) or a bool.
using GgufValue = std::variant<std::string, uint32_t, float, bool>;

struct SparseGgufOptions {
    // The GGUF name of each spec tensor (a name map such as
    // qwen3_llama_cpp_name); empty keeps the spec's names. Names must be
    // unique and shorter than GGML_MAX_NAME.
    std::function<std::string(const std::string& spec_name)> rename;
    // The GGUF type of each tensor, from its GGUF name, its shape (outermost
    // first, as in the spec) and the spec's type (F32, F16, BF16, I64); empty
    // keeps the spec's type. A block-quantized type whose block does not
    // divide the innermost dimension falls back per tensor as llama.cpp's
    // quantizer does: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (when that
    // block divides it), otherwise F16.
    std::function<ggml_type(const std::string& name, const std::vector<int64_t>& shape, ggml_type spec_type)> type;
    // Written first, in this order (general.architecture, <arch>.block_count ...).
    std::vector<std::pair<std::string, GgufValue>> metadata;
    // A GGUF file (a llama.cpp vocab-only one: third_party/llama-vocab/) whose
    // keys that start with one of copy_prefixes are copied with their types,
    // arrays included, after `metadata`: the tokenizer a real file carries.
    std::string copy_metadata_from;
    std::vector<std::string> copy_prefixes = {"tokenizer.ggml."};
};

// Writes a GGUF file of the spec's tensors (F32, F16, BF16, I64): the header
// (version 3, alignment 32, tensors in spec order with the spec's rank, each
// at its aligned offset) and then the file extended to its full size without
// writing data (sparse, like write_sparse_model), for kiln info and kiln
// plan on community GGUF files that are gigabytes. Errors: an unreadable
// spec or copy_metadata_from file, an unknown type, a name too long or
// given twice, a failed write.
Status write_sparse_gguf(const std::string& spec_path, const std::string& out_path, const SparseGgufOptions& options);

// The name maps and type rules of two kinds of community GGUF files:
//
// llama.cpp's (convert_hf_to_gguf.py + llama-quantize Q4_K_M) for a Qwen3
// from HF names: model.embed_tokens -> token_embd, model.layers.N.self_attn.
// {q,k,v,o}_proj -> blk.N.attn_{q,k,v,output}, {q,k}_norm -> attn_{q,k}_norm,
// input_layernorm -> attn_norm, mlp.{gate,up,down}_proj -> ffn_{gate,up,down},
// post_attention_layernorm -> ffn_norm, model.norm -> output_norm, lm_head ->
// output. A name it does not know is returned unchanged.
std::string qwen3_llama_cpp_name(const std::string& hf_name);
// llama.cpp's Q4_K_M choice (llama_tensor_get_type) for a model of `layers`
// layers: 1-D tensors F32; the output matrix, or token_embd when the model
// ties its embeddings (no output.weight: Qwen3-4B), Q6_K; attn_v and
// ffn_down Q6_K in the layers use_more_bits() picks (the first and last
// eighth, and every third between), Q4_K otherwise; every other matrix Q4_K.
std::function<ggml_type(const std::string&, const std::vector<int64_t>&, ggml_type)> llama_cpp_q4_k_m(
    int layers, bool tied_embeddings = true);
// ComfyUI-GGUF's (city96's convert.py + patched llama-quantize) for a
// Z-Image / Lumina-2 DiT, arch "lumina2", names kept: 1-D tensors, tensors
// of at most 1024 values and the pad tokens F32; the skipped parts
// (t_embedder, x_embedder, final_layer, cap_embedder, context_refiner,
// noise_refiner) and anything not 2-D keep the source type (BF16); the 2-D
// weights of the main layers (layers.N) `quantized`, uniformly (the tool's
// Q4_K_S makes feed_forward.w2 Q5_K, its Q4_K_M also attention.qkv Q5_K and
// feed_forward.w2 Q6_K).
std::function<ggml_type(const std::string&, const std::vector<int64_t>&, ggml_type)> comfy_gguf_lumina2(
    ggml_type quantized);

// Qwen3-4B-Instruct-2507-Q4_K_M.gguf as llama.cpp writes it (unsloth's
// upload: these keys and values; the 2507 release's rope base is 5e6 and its
// context 262144, where the original Qwen3-4B has 1e6 and 40960), the
// tokenizer copied from `vocab_gguf` (llama.cpp's ggml-vocab-qwen2.gguf).
SparseGgufOptions qwen3_4b_q4_k_m_gguf_options(const std::string& vocab_gguf);
// Qwen3-8B-Q4_K_M.gguf as llama.cpp writes it (Qwen's own upload: 36 layers
// 4096 wide, rope base 1e6, context 40960), the tokenizer as above.
SparseGgufOptions qwen3_8b_q4_k_m_gguf_options(const std::string& vocab_gguf);

}  // namespace kiln::test
