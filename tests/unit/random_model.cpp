#include "random_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "ggml.h"
#include "gguf.h"
#include "test_files.h"

namespace kiln::test {
namespace {

struct Spec {
    std::string name, dtype;
    std::vector<int64_t> shape;
};

uint64_t fnv(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

size_t element_count(const Spec& t) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    return n;
}

// Standard normal values for large tensors: a fixed table indexed by a
// xorshift stream, about ten times faster than std::normal_distribution, so
// a full-size model (3.5 billion values) is written in seconds.
const std::vector<float>& normal_table() {
    static const std::vector<float> table = [] {
        std::vector<float> v(1 << 16);
        std::mt19937_64 gen(12345);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& x : v) x = normal(gen);
        return v;
    }();
    return table;
}

void init_values(const Spec& t, std::vector<float>& v) {
    const size_t n = element_count(t);
    float scale = 0.05f, offset = 0.0f;
    if (ends_with(t.name, "token_embedding.weight")) {
        scale = 1.0f;
    } else if (ends_with(t.name, "position_embedding.weight")) {
        scale = 0.5f;
    } else if (t.shape.size() >= 2) {
        size_t fan_in = 1;
        for (size_t d = 1; d < t.shape.size(); ++d) fan_in *= static_cast<size_t>(t.shape[d]);
        scale = 1.0f / std::sqrt(static_cast<float>(fan_in));
    } else if (ends_with(t.name, ".weight")) {  // GroupNorm / LayerNorm scale
        scale = 0.1f;
        offset = 1.0f;
    } else if (ends_with(t.name, "running_var")) {  // a batch norm's variance: positive (FLUX.2's ~3)
        scale = 0.1f;
        offset = 3.0f;
    }
    v.resize(n);
    if (n <= (size_t(1) << 20)) {
        std::mt19937_64 gen(fnv(t.name));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& x : v) x = offset + scale * normal(gen);
        return;
    }
    const std::vector<float>& table = normal_table();
    uint64_t state = fnv(t.name) | 1;
    for (float& x : v) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        x = offset + scale * table[state >> 48];
    }
}

std::string header_json(const std::vector<Spec>& specs, std::vector<size_t>& sizes) {
    std::string json = "{";
    size_t offset = 0;
    for (const Spec& t : specs) {
        const size_t bytes = element_count(t) * (t.dtype == "F16" || t.dtype == "BF16" ? 2 : t.dtype == "F32" ? 4 : 8);
        sizes.push_back(bytes);
        json += (json.size() > 1 ? ",\"" : "\"") + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
        for (size_t d = 0; d < t.shape.size(); ++d) json += (d ? "," : "") + std::to_string(t.shape[d]);
        json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
        offset += bytes;
    }
    json += "}";
    while (json.size() % 8 != 0) json += ' ';
    return json;
}

Result<std::vector<Spec>> read_spec(const std::string& spec_path, bool allow_bf16) {
    std::ifstream in(spec_path);
    if (!in) return Error{spec_path + ": cannot open"};
    std::vector<Spec> specs;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        Spec t;
        fields >> t.name >> t.dtype;
        for (int64_t d; fields >> d;) t.shape.push_back(d);
        const bool known =
            t.dtype == "F16" || t.dtype == "F32" || t.dtype == "I64" || (allow_bf16 && t.dtype == "BF16");
        if (t.name.empty() || !known) return Error{spec_path + ": bad line: " + line};
        specs.push_back(std::move(t));
    }
    return specs;
}

// The safetensors file's first bytes: the header's length, then the header.
bool write_header(std::FILE* f, const std::string& header) {
    const uint64_t header_size = header.size();
    uint8_t size_bytes[8];
    for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<uint8_t>(header_size >> (8 * i));
    return std::fwrite(size_bytes, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
}

}  // namespace

Status write_sparse_model(const std::string& spec_path, const std::string& out_path) {
    auto specs = read_spec(spec_path, /*allow_bf16=*/true);
    if (!specs.ok()) return specs.error();
    std::vector<size_t> sizes;
    const std::string header = header_json(*specs, sizes);
    std::FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f) return Error{out_path + ": cannot write"};
    bool ok = write_header(f, header);
    uint64_t total = 8 + header.size();
    for (size_t bytes : sizes) total += bytes;
    ok = ok && std::fflush(f) == 0 && ftruncate(fileno(f), static_cast<off_t>(total)) == 0;
    if (std::fclose(f) != 0 || !ok) return Error{out_path + ": write failed"};
    return Status::Ok();
}

// ---- sparse GGUF files ----

namespace {

constexpr uint64_t kGgufAlignment = 32;  // GGUF's default (no general.alignment key)

ggml_type spec_ggml_type(const std::string& dtype) {
    if (dtype == "F32") return GGML_TYPE_F32;
    if (dtype == "F16") return GGML_TYPE_F16;
    if (dtype == "BF16") return GGML_TYPE_BF16;
    return GGML_TYPE_I64;  // read_spec admits nothing else
}

// llama.cpp's per-tensor fallback (llama_tensor_get_type's end) for a type
// whose block does not divide the rows.
ggml_type fit_rows(ggml_type type, int64_t row) {
    if (row % ggml_blck_size(type) == 0) return type;
    ggml_type next = GGML_TYPE_F16;
    switch (type) {
        case GGML_TYPE_Q4_K: next = GGML_TYPE_Q5_0; break;
        case GGML_TYPE_Q5_K: next = GGML_TYPE_Q5_1; break;
        case GGML_TYPE_Q6_K: next = GGML_TYPE_Q8_0; break;
        default: break;
    }
    return row % ggml_blck_size(next) == 0 ? next : GGML_TYPE_F16;
}

// GGUF's little-endian encoding, appended to a byte string.
struct GgufBytes {
    std::string out;
    template <typename T>
    void put(T v) {
        char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));
        out.append(b, sizeof(T));
    }
    void str(const std::string& s) {
        put<uint64_t>(s.size());
        out += s;
    }
    void key(const std::string& k, gguf_type type) {
        str(k);
        put<uint32_t>(type);
    }
};

size_t gguf_scalar_size(gguf_type type) {
    switch (type) {
        case GGUF_TYPE_UINT8:
        case GGUF_TYPE_INT8:
        case GGUF_TYPE_BOOL: return 1;
        case GGUF_TYPE_UINT16:
        case GGUF_TYPE_INT16: return 2;
        case GGUF_TYPE_UINT32:
        case GGUF_TYPE_INT32:
        case GGUF_TYPE_FLOAT32: return 4;
        case GGUF_TYPE_UINT64:
        case GGUF_TYPE_INT64:
        case GGUF_TYPE_FLOAT64: return 8;
        default: return 0;
    }
}

// Key `id` of `src`, as it is stored there.
bool copy_kv(const gguf_context* src, int64_t id, GgufBytes& b) {
    const gguf_type type = gguf_get_kv_type(src, id);
    b.key(gguf_get_key(src, id), type);
    if (type == GGUF_TYPE_STRING) {
        b.str(gguf_get_val_str(src, id));
        return true;
    }
    if (type != GGUF_TYPE_ARRAY) {
        const size_t size = gguf_scalar_size(type);
        if (size == 0) return false;
        b.out.append(static_cast<const char*>(gguf_get_val_data(src, id)), size);
        return true;
    }
    const gguf_type element = gguf_get_arr_type(src, id);
    const size_t n = gguf_get_arr_n(src, id);
    b.put<uint32_t>(element);
    b.put<uint64_t>(n);
    if (element == GGUF_TYPE_STRING) {
        for (size_t i = 0; i < n; ++i) b.str(gguf_get_arr_str(src, id, i));
        return true;
    }
    const size_t size = gguf_scalar_size(element);
    if (size == 0) return false;  // arrays of arrays: no tokenizer has them
    b.out.append(static_cast<const char*>(gguf_get_arr_data(src, id)), n * size);
    return true;
}

void put_value(GgufBytes& b, const std::string& key, const GgufValue& value) {
    if (const auto* s = std::get_if<std::string>(&value)) {
        b.key(key, GGUF_TYPE_STRING);
        b.str(*s);
    } else if (const auto* u = std::get_if<uint32_t>(&value)) {
        b.key(key, GGUF_TYPE_UINT32);
        b.put<uint32_t>(*u);
    } else if (const auto* f = std::get_if<float>(&value)) {
        b.key(key, GGUF_TYPE_FLOAT32);
        b.put<float>(*f);
    } else {
        b.key(key, GGUF_TYPE_BOOL);
        b.put<uint8_t>(std::get<bool>(value) ? 1 : 0);
    }
}

int layer_of(const std::string& name) {
    static const std::regex layer("^blk\\.(\\d+)\\.");
    std::smatch m;
    return std::regex_search(name, m, layer) ? std::stoi(m[1]) : -1;
}

}  // namespace

Status write_sparse_gguf(const std::string& spec_path, const std::string& out_path, const SparseGgufOptions& options) {
    auto specs = read_spec(spec_path, /*allow_bf16=*/true);
    if (!specs.ok()) return specs.error();

    GgufBytes kv;
    uint64_t n_kv = 0;
    std::set<std::string> keys;
    for (const auto& [key, value] : options.metadata) {
        if (!keys.insert(key).second) return Error{"metadata key " + key + " given twice"};
        put_value(kv, key, value);
        ++n_kv;
    }
    if (!options.copy_metadata_from.empty()) {
        gguf_init_params params{/*no_alloc=*/true, /*ctx=*/nullptr};
        std::unique_ptr<gguf_context, void (*)(gguf_context*)> src(
            gguf_init_from_file(options.copy_metadata_from.c_str(), params), gguf_free);
        if (!src) return Error{options.copy_metadata_from + ": not a readable GGUF file"};
        for (int64_t id = 0; id < gguf_get_n_kv(src.get()); ++id) {
            const std::string key = gguf_get_key(src.get(), id);
            bool wanted = false;
            for (const std::string& prefix : options.copy_prefixes) wanted = wanted || key.rfind(prefix, 0) == 0;
            if (!wanted || !keys.insert(key).second) continue;  // `metadata` wins
            if (!copy_kv(src.get(), id, kv))
                return Error{options.copy_metadata_from + ": key " + key + " has a type this writer does not copy"};
            ++n_kv;
        }
    }

    GgufBytes info;
    std::set<std::string> names;
    uint64_t offset = 0;
    for (const Spec& t : *specs) {
        const std::string name = options.rename ? options.rename(t.name) : t.name;
        if (name.empty() || name.size() >= GGML_MAX_NAME) {
            return Error{t.name + ": GGUF name '" + name + "' is empty or longer than ggml's " +
                         std::to_string(GGML_MAX_NAME - 1) + " characters"};
        }
        if (!names.insert(name).second) return Error{t.name + ": GGUF name " + name + " given twice"};
        if (t.shape.empty() || t.shape.size() > GGML_MAX_DIMS)
            return Error{t.name + ": rank not 1.." + std::to_string(GGML_MAX_DIMS)};
        const ggml_type spec_type = spec_ggml_type(t.dtype);
        ggml_type type = options.type ? options.type(name, t.shape, spec_type) : spec_type;
        if (type < 0 || type >= GGML_TYPE_COUNT || ggml_type_size(type) == 0)
            return Error{name + ": no such ggml type"};
        type = fit_rows(type, t.shape.back());
        info.str(name);
        info.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
        for (size_t d = t.shape.size(); d-- > 0;) info.put<uint64_t>(static_cast<uint64_t>(t.shape[d]));  // ne[0] first
        info.put<uint32_t>(type);
        info.put<uint64_t>(offset);
        uint64_t bytes = ggml_row_size(type, t.shape.back());
        for (size_t d = 0; d + 1 < t.shape.size(); ++d) bytes *= static_cast<uint64_t>(t.shape[d]);
        offset += GGML_PAD(bytes, kGgufAlignment);
    }

    GgufBytes header;
    header.out = "GGUF";
    header.put<uint32_t>(3);
    header.put<uint64_t>(specs->size());
    header.put<uint64_t>(n_kv);
    header.out += kv.out;
    header.out += info.out;
    header.out.resize(GGML_PAD(header.out.size(), kGgufAlignment), '\0');

    std::FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f) return Error{out_path + ": cannot write"};
    bool ok = std::fwrite(header.out.data(), 1, header.out.size(), f) == header.out.size();
    ok = ok && std::fflush(f) == 0 && ftruncate(fileno(f), static_cast<off_t>(header.out.size() + offset)) == 0;
    if (std::fclose(f) != 0 || !ok) return Error{out_path + ": write failed"};
    return Status::Ok();
}

std::string qwen3_llama_cpp_name(const std::string& hf_name) {
    static const std::pair<const char*, const char*> kLayer[] = {
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"input_layernorm.weight", "attn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"post_attention_layernorm.weight", "ffn_norm.weight"},
    };
    if (hf_name == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf_name == "model.norm.weight") return "output_norm.weight";
    if (hf_name == "lm_head.weight") return "output.weight";
    static const std::regex layer("^model\\.layers\\.(\\d+)\\.(.+)$");
    std::smatch m;
    if (!std::regex_match(hf_name, m, layer)) return hf_name;
    for (const auto& [hf, cpp] : kLayer) {
        if (m[2] == hf) return "blk." + m[1].str() + "." + cpp;
    }
    return hf_name;
}

std::function<ggml_type(const std::string&, const std::vector<int64_t>&, ggml_type)> llama_cpp_q4_k_m(
    int layers, bool tied_embeddings) {
    return [layers, tied_embeddings](const std::string& name, const std::vector<int64_t>& shape, ggml_type) {
        // llama-quant.cpp's use_more_bits(i_layer, n_layers).
        auto more_bits = [layers](int i) { return i < layers / 8 || i >= 7 * layers / 8 || (i - layers / 8) % 3 == 2; };
        if (shape.size() == 1) return GGML_TYPE_F32;
        if (name == "output.weight" || (tied_embeddings && name == "token_embd.weight")) return GGML_TYPE_Q6_K;
        const int layer = layer_of(name);
        const bool v = name.find(".attn_v.weight") != std::string::npos;
        const bool down = name.find(".ffn_down.weight") != std::string::npos;
        if ((v || down) && layer >= 0 && more_bits(layer)) return GGML_TYPE_Q6_K;
        return GGML_TYPE_Q4_K;
    };
}

std::function<ggml_type(const std::string&, const std::vector<int64_t>&, ggml_type)> comfy_gguf_lumina2(
    ggml_type quantized) {
    return [quantized](const std::string& name, const std::vector<int64_t>& shape, ggml_type source) {
        int64_t values = 1;
        for (int64_t d : shape) values *= d;
        // convert.py: 1-D, small, and "high precision" (pad token) tensors F32.
        if (shape.size() == 1 || values <= 1024 || name.find("pad_token") != std::string::npos) {
            return GGML_TYPE_F32;
        }
        // The patched llama-quantize's LLM_ARCH_LUMINA2 rules: these stay as converted.
        for (const char* kept :
             {"t_embedder.", "x_embedder.", "final_layer.", "cap_embedder.", "context_refiner.", "noise_refiner."}) {
            if (name.find(kept) != std::string::npos) return source;
        }
        return shape.size() == 2 ? quantized : source;
    };
}

Status write_random_model(const std::string& spec_path, const std::string& out_path) {
    auto parsed = read_spec(spec_path, /*allow_bf16=*/false);
    if (!parsed.ok()) return parsed.error();
    const std::vector<Spec>& specs = *parsed;
    // Streamed tensor by tensor: a full-size model never sits in memory whole.
    std::vector<size_t> sizes;
    const std::string header = header_json(specs, sizes);
    std::FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f) return Error{out_path + ": cannot write"};
    bool ok = write_header(f, header);
    std::vector<float> values;
    std::vector<uint8_t> bytes;
    for (size_t i = 0; i < specs.size() && ok; ++i) {
        const Spec& t = specs[i];
        bytes.resize(sizes[i]);
        if (t.dtype == "I64") {
            // Index buffers (position_ids): 0, 1, ... along the last dimension.
            const size_t n = element_count(t), last = t.shape.empty() ? 1 : static_cast<size_t>(t.shape.back());
            for (size_t j = 0; j < n; ++j) {
                const int64_t v = static_cast<int64_t>(j % last);
                std::memcpy(&bytes[j * 8], &v, 8);
            }
        } else {
            init_values(t, values);
            if (t.dtype == "F32") {
                std::memcpy(bytes.data(), values.data(), bytes.size());
            } else {
                ggml_fp32_to_fp16_row(values.data(), reinterpret_cast<ggml_fp16_t*>(bytes.data()),
                                      static_cast<int64_t>(values.size()));
            }
        }
        ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    }
    if (std::fclose(f) != 0 || !ok) return Error{out_path + ": write failed"};
    return Status::Ok();
}

namespace {

// A Qwen3 of 36 layers (4B and 8B both) as llama.cpp's Q4_K_M writes it.
SparseGgufOptions qwen3_36_layer_q4_k_m(const std::string& name, const std::string& size_label, uint32_t width,
                                        uint32_t ffn, uint32_t context, float rope_base,
                                        const std::string& vocab_gguf) {
    SparseGgufOptions o;
    o.rename = qwen3_llama_cpp_name;
    o.type = llama_cpp_q4_k_m(36);
    o.metadata = {
        {"general.architecture", std::string("qwen3")},
        {"general.type", std::string("model")},
        {"general.name", name},
        {"general.size_label", size_label},
        {"general.file_type", uint32_t{15}},  // LLAMA_FTYPE_MOSTLY_Q4_K_M
        {"general.quantization_version", uint32_t{2}},
        {"qwen3.block_count", uint32_t{36}},
        {"qwen3.context_length", context},
        {"qwen3.embedding_length", width},
        {"qwen3.feed_forward_length", ffn},
        {"qwen3.attention.head_count", uint32_t{32}},
        {"qwen3.attention.head_count_kv", uint32_t{8}},
        {"qwen3.attention.key_length", uint32_t{128}},
        {"qwen3.attention.value_length", uint32_t{128}},
        {"qwen3.rope.freq_base", rope_base},
        {"qwen3.attention.layer_norm_rms_epsilon", 1e-6f},
    };
    o.copy_metadata_from = vocab_gguf;
    return o;
}

}  // namespace

SparseGgufOptions qwen3_4b_q4_k_m_gguf_options(const std::string& vocab_gguf) {
    return qwen3_36_layer_q4_k_m("Qwen3-4B-Instruct-2507", "4B", 2560, 9728, 262144, 5000000.0f, vocab_gguf);
}

SparseGgufOptions qwen3_8b_q4_k_m_gguf_options(const std::string& vocab_gguf) {
    return qwen3_36_layer_q4_k_m("Qwen3-8B", "8B", 4096, 12288, 40960, 1000000.0f, vocab_gguf);
}

}  // namespace kiln::test
