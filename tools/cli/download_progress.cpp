#include "download_progress.h"

#include <algorithm>
#include <cmath>

#include "util/format.h"
#include "util/log.h"

namespace kiln::cli {
namespace {

constexpr int kBarWidth = 24;
// Redraws at most this often: a fast download calls advance() thousands of
// times a second.
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

}  // namespace

DownloadProgress::DownloadProgress(bool terminal, std::FILE* out) : terminal_(terminal), out_(out) {}

std::string DownloadProgress::speed_text(double bytes_per_second) {
    if (!(bytes_per_second > 0)) return "-- B/s";
    return human_bytes(static_cast<uint64_t>(bytes_per_second)) + "/s";
}

std::string DownloadProgress::eta_text(double seconds) {
    if (!(seconds >= 0) || !std::isfinite(seconds)) return "ETA --";
    const long long s = std::llround(seconds);
    char text[64];
    if (s >= 3600) {
        std::snprintf(text, sizeof text, "ETA %lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
    } else {
        std::snprintf(text, sizeof text, "ETA %lld:%02lld", s / 60, s % 60);
    }
    return text;
}

void DownloadProgress::begin(const std::string& name, uint64_t resumed_at, std::optional<uint64_t> total) {
    name_ = name;
    done_ = resumed_at;
    resumed_at_ = resumed_at;
    total_ = total;
    start_ = std::chrono::steady_clock::now();
    drawn_ = false;
    if (!terminal_) {
        std::string line = name_ + ": downloading";
        if (total_) line += " " + human_bytes(*total_);
        if (resumed_at_ > 0) line += ", resuming at " + human_bytes(resumed_at_);
        KILN_LOG_INFO("%s", line.c_str());
        return;
    }
    draw(true);
}

void DownloadProgress::advance(uint64_t bytes) {
    done_ += bytes;
    if (terminal_) draw(false);
}

void DownloadProgress::draw(bool force) {
    const auto now = std::chrono::steady_clock::now();
    if (!force && drawn_ && now - last_draw_ < kRedrawInterval) return;
    last_draw_ = now;
    drawn_ = true;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double speed = elapsed > 0.2 ? static_cast<double>(done_ - resumed_at_) / elapsed : 0.0;
    std::string line = "\r  " + name_ + "  ";
    if (total_ && *total_ > 0) {
        const double share = std::min(1.0, static_cast<double>(done_) / static_cast<double>(*total_));
        const int filled = static_cast<int>(share * kBarWidth);
        line += "[" + std::string(static_cast<size_t>(filled), '#') + std::string(kBarWidth - filled, '.') + "] ";
        char percent[16];
        std::snprintf(percent, sizeof percent, "%3d%%", static_cast<int>(share * 100));
        line += std::string(percent) + "  " + human_bytes(done_) + " / " + human_bytes(*total_) + "  " +
                speed_text(speed) + "  " +
                eta_text(speed > 0 ? static_cast<double>(*total_ - std::min(done_, *total_)) / speed : -1);
    } else {
        line += human_bytes(done_) + "  " + speed_text(speed);
    }
    std::fprintf(out_, "%s   ", line.c_str());
    std::fflush(out_);
}

void DownloadProgress::finish(const std::string& note) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double speed = elapsed > 0 ? static_cast<double>(done_ - resumed_at_) / elapsed : 0.0;
    if (!terminal_) {
        KILN_LOG_INFO("%s: %s in %.1f s (%s), %s", name_.c_str(), human_bytes(done_ - resumed_at_).c_str(), elapsed,
                      speed_text(speed).c_str(), note.c_str());
        return;
    }
    draw(true);
    std::fprintf(out_, " %s\n", note.c_str());
    std::fflush(out_);
}

void DownloadProgress::abandon() {
    if (terminal_ && drawn_) {
        std::fprintf(out_, "\n");
        std::fflush(out_);
    }
}

}  // namespace kiln::cli
