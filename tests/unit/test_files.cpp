#include "test_files.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace kiln::test {
namespace {

// The tests never see the user's own kiln cache (~/.cache/kiln, which `kiln
// pull` fills): a tokenizer there would change what a model without one
// finds. Every test and every kiln it runs share this empty one instead
// (empty but for hashes.json, where the hashes of image parameters' "Model
// hash" and "Lora hashes" are kept: io/file_hashes.h).
const bool kCacheIsolated = [] {
    static const std::string cache = (fs::temp_directory_path() / "kiln-test-cache-none").string();
    return setenv("KILN_CACHE", cache.c_str(), 1) == 0;
}();

}  // namespace

TempDir::TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

std::string TempDir::file(std::string_view name) const {
    fs::path p = fs::path(path_) / std::string(name);
    fs::create_directories(p.parent_path());
    return p.string();
}

std::string TempDir::write(std::string_view name, const std::vector<uint8_t>& bytes) const {
    std::string p = file(name);
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
}

std::string TempDir::write(std::string_view name, std::string_view text) const {
    return write(name, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void put_u8(std::vector<uint8_t>& out, uint8_t v) { out.push_back(v); }
void put_u16(std::vector<uint8_t>& out, uint16_t v) {
    for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& out, std::string_view bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); }

std::vector<uint8_t> raw_safetensors(std::string_view header_json, const std::vector<uint8_t>& data) {
    std::vector<uint8_t> out;
    put_u64(out, header_json.size());
    put_bytes(out, header_json);
    out.insert(out.end(), data.begin(), data.end());
    return out;
}

std::vector<uint8_t> build_safetensors(const std::vector<SafetensorsEntry>& entries,
                                       const std::vector<std::pair<std::string, std::string>>& metadata) {
    std::string header = "{";
    if (!metadata.empty()) {
        header += "\"__metadata__\":{";
        for (size_t i = 0; i < metadata.size(); ++i) {
            if (i) header += ",";
            header += "\"" + metadata[i].first + "\":\"" + metadata[i].second + "\"";
        }
        header += "}";
    }
    std::vector<uint8_t> data;
    for (const SafetensorsEntry& e : entries) {
        if (header.size() > 1) header += ",";
        header += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
        for (size_t i = 0; i < e.shape.size(); ++i) header += (i ? "," : "") + std::to_string(e.shape[i]);
        header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
                  std::to_string(data.size() + e.data.size()) + "]}";
        data.insert(data.end(), e.data.begin(), e.data.end());
    }
    header += "}";
    return raw_safetensors(header, data);
}

std::vector<uint8_t> f32_bytes(size_t count, float start) {
    std::vector<uint8_t> out(count * 4);
    for (size_t i = 0; i < count; ++i) {
        const float v = start + static_cast<float>(i);
        std::memcpy(out.data() + 4 * i, &v, 4);
    }
    return out;
}

ScopedEnv::ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) {
        had_value_ = true;
        old_value_ = old;
    }
    setenv(name_.c_str(), value.c_str(), 1);
}

ScopedEnv::~ScopedEnv() {
    if (had_value_) {
        setenv(name_.c_str(), old_value_.c_str(), 1);
    } else {
        unsetenv(name_.c_str());
    }
}

uint64_t resident_bytes_of(int pid) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);) {
        // "VmRSS:     123 kB"
        if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
    return 0;
}

CommandResult run_command(const std::string& command_line) {
    TempDir dir;
    const std::string out_path = dir.file("stdout"), err_path = dir.file("stderr");
    const std::string full = command_line + " >" + out_path + " 2>" + err_path;
    int status = std::system(full.c_str());
    CommandResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    auto slurp = [](const std::string& p) {
        auto b = read_bytes(p);
        return std::string(b.begin(), b.end());
    };
    r.out = slurp(out_path);
    r.err = slurp(err_path);
    return r;
}

int plan_segments(const std::string& plan, const std::string& module) {
    std::istringstream lines(plan);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("  " + module + " on ", 0) != 0) continue;
        std::smatch m;
        if (std::regex_search(line, m, std::regex(": (?:[^,]*, )*?(\\d+) segments"))) return std::stoi(m[1]);
        return line.find("whole graph") != std::string::npos ? 1 : 0;
    }
    return 0;
}

bool plan_runs(const std::string& plan) {
    return plan.find("\nfits: yes\n") != std::string::npos ||
           plan.find("\nfits: only by streaming") != std::string::npos;
}

}  // namespace kiln::test
