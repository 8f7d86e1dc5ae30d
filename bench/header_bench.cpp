// kiln-header-bench: time to read the header of a model file as its tensor
// count grows (safetensors and GGUF, 10k to 300k tiny tensors), written to a
// temporary folder by this program. A linear parser doubles its time when
// the count doubles; the last column says how close each step is to that.
// Not a test: it prints measurements (bench/README.md).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/model_file.h"

namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put_u64(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

std::string tensor_name(size_t i) { return "model.layers." + std::to_string(i) + ".weight"; }

// `count` F32 tensors of one element each.
std::vector<uint8_t> safetensors_file(size_t count) {
    std::string header = "{";
    for (size_t i = 0; i < count; ++i) {
        if (i) header += ",";
        header += "\"" + tensor_name(i) + "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" +
                  std::to_string(4 * i) + "," + std::to_string(4 * i + 4) + "]}";
    }
    header += "}";
    std::vector<uint8_t> out;
    put_u64(out, header.size());
    out.insert(out.end(), header.begin(), header.end());
    out.resize(out.size() + 4 * count, 0);
    return out;
}

// The same as GGUF v3, written by hand (ggml's writer checks names pairwise too).
std::vector<uint8_t> gguf_file(size_t count) {
    const uint64_t alignment = 32;
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    put_u32(out, 3);
    put_u64(out, count);
    put_u64(out, 0);
    for (size_t i = 0; i < count; ++i) {
        put_string(out, tensor_name(i));
        put_u32(out, 1);              // dims
        put_u64(out, 1);              // ne[0]
        put_u32(out, 0);              // GGML_TYPE_F32
        put_u64(out, alignment * i);  // offset, aligned
    }
    out.resize((out.size() + alignment - 1) / alignment * alignment, 0);
    out.resize(out.size() + alignment * count, 0);
    return out;
}

double seconds_to_open(const std::string& path) {
    const auto start = std::chrono::steady_clock::now();
    auto model = kiln::io::ModelFile::open({path});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!model.ok()) {
        std::fprintf(stderr, "%s\n", model.error().message.c_str());
        std::exit(1);
    }
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<size_t> counts = {10000, 20000, 40000, 80000, 150000, 300000};
    if (argc > 1) {
        counts.clear();
        for (int i = 1; i < argc; ++i) counts.push_back(std::strtoull(argv[i], nullptr, 10));
    }
    char dir_template[] = "/tmp/kiln-header-bench-XXXXXX";
    const char* dir = mkdtemp(dir_template);
    if (!dir) return 1;
    std::printf("| format | tensors | header bytes | open (s) | us per tensor | time ratio / count ratio |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    for (const char* format : {"safetensors", "gguf"}) {
        double previous_time = 0;
        size_t previous_count = 0;
        for (size_t count : counts) {
            const std::string path = std::string(dir) + "/m." + format;
            const std::vector<uint8_t> bytes =
                std::strcmp(format, "gguf") == 0 ? gguf_file(count) : safetensors_file(count);
            std::FILE* f = std::fopen(path.c_str(), "wb");
            if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) return 1;
            std::fclose(f);
            const double t = seconds_to_open(path);
            std::remove(path.c_str());
            char ratio[32] = "";
            if (previous_count) {
                std::snprintf(ratio, sizeof ratio, "%.2f",
                              (t / previous_time) / (double(count) / double(previous_count)));
            }
            std::printf("| %s | %zu | %zu | %.3f | %.2f | %s |\n", format, count, bytes.size(), t,
                        1e6 * t / double(count), ratio);
            std::fflush(stdout);
            previous_time = t;
            previous_count = count;
        }
    }
    rmdir(dir);
    return 0;
}
