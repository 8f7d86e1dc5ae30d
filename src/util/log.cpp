#include "util/log.h"

#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#include "ggml.h"

namespace kiln {
namespace {

std::atomic<LogLevel> g_level{LogLevel::Info};
std::atomic<bool> g_color{false};
std::mutex g_mutex;                // keeps lines from different threads whole
LogCallback g_callback = nullptr;  // guarded by g_mutex
void* g_callback_user_data = nullptr;

const char* level_tag(LogLevel level) {
    switch (level) {
        case LogLevel::Debug: return "debug";
        case LogLevel::Verbose: return "verbose";
        case LogLevel::Info: return "info";
        case LogLevel::Warn: return "warn";
        case LogLevel::Error: return "error";
    }
    return "?";
}

const char* level_color(LogLevel level) {
    switch (level) {
        case LogLevel::Debug: return "\033[90m";
        case LogLevel::Verbose: return "\033[36m";
        case LogLevel::Info: return "\033[32m";
        case LogLevel::Warn: return "\033[33m";
        case LogLevel::Error: return "\033[31m";
    }
    return "";
}

void write_line(LogLevel level, const std::string& text) {
    std::FILE* stream = level == LogLevel::Error ? stderr : stdout;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_callback) {
        g_callback(level, text.c_str(), g_callback_user_data);
        return;
    }
    // Info lines are the program's normal output and carry no tag.
    if (level == LogLevel::Info) {
        std::fprintf(stream, "%s\n", text.c_str());
    } else if (g_color.load()) {
        std::fprintf(stream, "%s%s:\033[0m %s\n", level_color(level), level_tag(level), text.c_str());
    } else {
        std::fprintf(stream, "%s: %s\n", level_tag(level), text.c_str());
    }
    std::fflush(stream);
}

}  // namespace

void log_set_level(LogLevel level) { g_level.store(level); }

void log_set_callback(LogCallback callback, void* user_data) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_callback = callback;
    g_callback_user_data = user_data;
}
LogLevel log_level() { return g_level.load(); }
void log_set_color(bool enabled) { g_color.store(enabled); }
const char* log_level_name(LogLevel level) { return level_tag(level); }

std::optional<LogLevel> parse_log_level(std::string_view name) {
    std::string lower(name);
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "debug") return LogLevel::Debug;
    if (lower == "verbose") return LogLevel::Verbose;
    if (lower == "info") return LogLevel::Info;
    if (lower == "warn" || lower == "warning") return LogLevel::Warn;
    if (lower == "error") return LogLevel::Error;
    return std::nullopt;
}

void log_message(LogLevel level, const char* format, ...) {
    if (level < g_level.load()) return;
    va_list args;
    va_start(args, format);
    va_list copy;
    va_copy(copy, args);
    const int n = std::vsnprintf(nullptr, 0, format, copy);
    va_end(copy);
    std::string text(n > 0 ? static_cast<size_t>(n) : 0, '\0');
    if (n > 0) std::vsnprintf(text.data(), text.size() + 1, format, args);
    va_end(args);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    write_line(level, text);
}

void log_capture_ggml() {
    ggml_log_set(
        [](enum ggml_log_level level, const char* text, void*) {
            // ggml writes partial lines (GGML_LOG_LEVEL_CONT); kiln logs whole
            // lines, so continuation fragments go out at debug.
            LogLevel mapped = LogLevel::Debug;
            switch (level) {
                case GGML_LOG_LEVEL_ERROR: mapped = LogLevel::Error; break;
                case GGML_LOG_LEVEL_WARN: mapped = LogLevel::Warn; break;
                case GGML_LOG_LEVEL_INFO: mapped = LogLevel::Verbose; break;
                default: mapped = LogLevel::Debug; break;
            }
            log_message(mapped, "ggml: %s", text);
        },
        nullptr);
}

}  // namespace kiln
