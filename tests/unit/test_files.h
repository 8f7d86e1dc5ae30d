// Helpers for tests that write their own model files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::test {

// A fresh directory under the system temp dir, removed with its contents on
// destruction.
class TempDir {
  public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::string& path() const { return path_; }
    // path()/name; creates parent folders of `name` as needed.
    std::string file(std::string_view name) const;
    // Writes bytes to path()/name and returns the full path.
    std::string write(std::string_view name, const std::vector<uint8_t>& bytes) const;
    std::string write(std::string_view name, std::string_view text) const;

  private:
    std::string path_;
};

std::vector<uint8_t> read_bytes(const std::string& path);

// Little-endian appenders for building binary files by hand.
void put_u8(std::vector<uint8_t>& out, uint8_t v);
void put_u16(std::vector<uint8_t>& out, uint16_t v);
void put_u32(std::vector<uint8_t>& out, uint32_t v);
void put_u64(std::vector<uint8_t>& out, uint64_t v);
void put_bytes(std::vector<uint8_t>& out, std::string_view bytes);

// One tensor for build_safetensors: `data` is written as given, so a test
// can make its size disagree with dtype x shape on purpose.
struct SafetensorsEntry {
    std::string name;
    std::string dtype;  // "F32", "F8_E4M3", ...
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
};
// A complete safetensors file: header length, JSON header (with
// __metadata__ when given), data in entry order.
std::vector<uint8_t> build_safetensors(const std::vector<SafetensorsEntry>& entries,
                                       const std::vector<std::pair<std::string, std::string>>& metadata = {});
// A safetensors file around a hand-written JSON header and raw data.
std::vector<uint8_t> raw_safetensors(std::string_view header_json, const std::vector<uint8_t>& data);
// `count` little-endian float32 values start, start+1, ...
std::vector<uint8_t> f32_bytes(size_t count, float start = 0.0f);

// Sets environment variable `name` to `value` for the object's lifetime,
// then restores what was there (kiln's cache folder, KILN_CACHE, in
// in-process tests).
class ScopedEnv {
  public:
    ScopedEnv(std::string name, const std::string& value);
    ~ScopedEnv();
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

  private:
    std::string name_;
    bool had_value_ = false;
    std::string old_value_;
};

// Process `pid`'s resident memory now (VmRSS in /proc/PID/status), 0 when it cannot be read.
uint64_t resident_bytes_of(int pid);

struct CommandResult {
    int exit_code = -1;
    std::string out;  // stdout
    std::string err;  // stderr
};
// Runs a shell command line, capturing stdout and stderr separately.
CommandResult run_command(const std::string& command_line);

// The segments `kiln plan` says `module` runs in ("  diffusion on RPC0: 5
// segments, ..." -> 5, "whole graph" -> 1; 0 when the line is missing).
int plan_segments(const std::string& plan, const std::string& module);

// Whether `kiln plan` says the job runs: "fits: yes", or "fits: only by
// streaming" where the machine's free RAM at that moment cannot keep the
// weights (auto-fit leaves them in the mapped file; tests running beside
// one another change that).
bool plan_runs(const std::string& plan);

}  // namespace kiln::test
