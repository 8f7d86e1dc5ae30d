#include "random_model.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "ggml.h"
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

}  // namespace kiln::test
