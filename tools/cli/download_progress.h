// How `kiln pull` shows a download: on a terminal, one bar per file redrawn
// in place with bytes, speed and ETA; otherwise (a log, a CI job) an info
// line when a file starts and one when it ends (so --log-level applies).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace kiln::cli {

class DownloadProgress {
  public:
    // `terminal`: redraw a bar (isatty(stdout)) on `out`; else log lines.
    explicit DownloadProgress(bool terminal, std::FILE* out = stdout);

    // A file starts: `name` as shown, `resumed_at` bytes already on disk,
    // `total` its size when known. Speed counts only what this run fetches.
    void begin(const std::string& name, uint64_t resumed_at, std::optional<uint64_t> total);
    // `bytes` more arrived.
    void advance(uint64_t bytes);
    // The file is complete and checked (`note`: "sha256 ok", "size ok").
    void finish(const std::string& note);
    // The transfer stopped early: ends the bar's line so the error that
    // follows starts on a line of its own.
    void abandon();

    // "12.3 MiB/s", "ETA 1:02:03": the parts of a bar, for tests.
    static std::string speed_text(double bytes_per_second);
    static std::string eta_text(double seconds);

  private:
    void draw(bool force);

    bool terminal_;
    std::FILE* out_;
    std::string name_;
    uint64_t done_ = 0;        // bytes of the file on disk, resumed ones included
    uint64_t resumed_at_ = 0;  // bytes that were there before this run
    std::optional<uint64_t> total_;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_;
    bool drawn_ = false;
};

}  // namespace kiln::cli
