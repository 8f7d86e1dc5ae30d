#include "random_model.h"

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

std::vector<float> init_values(const Spec& t) {
    size_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    std::mt19937_64 gen(fnv(t.name));
    std::normal_distribution<float> normal(0.0f, 1.0f);
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
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * normal(gen);
    return v;
}

}  // namespace

Status write_random_model(const std::string& spec_path, const std::string& out_path) {
    std::ifstream in(spec_path);
    if (!in) return Error{spec_path + ": cannot open"};
    std::vector<SafetensorsEntry> entries;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream fields(line);
        Spec t;
        fields >> t.name >> t.dtype;
        for (int64_t d; fields >> d;) t.shape.push_back(d);
        if (t.name.empty() || (t.dtype != "F16" && t.dtype != "F32")) return Error{spec_path + ": bad line: " + line};
        const std::vector<float> values = init_values(t);
        SafetensorsEntry e{t.name, t.dtype, t.shape, {}};
        if (t.dtype == "F32") {
            e.data.resize(values.size() * 4);
            std::memcpy(e.data.data(), values.data(), e.data.size());
        } else {
            std::vector<ggml_fp16_t> half(values.size());
            ggml_fp32_to_fp16_row(values.data(), half.data(), static_cast<int64_t>(values.size()));
            e.data.resize(half.size() * 2);
            std::memcpy(e.data.data(), half.data(), e.data.size());
        }
        entries.push_back(std::move(e));
    }
    const std::vector<uint8_t> bytes = build_safetensors(entries);
    std::FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f) return Error{out_path + ": cannot write"};
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (std::fclose(f) != 0 || !ok) return Error{out_path + ": write failed"};
    return Status::Ok();
}

}  // namespace kiln::test
