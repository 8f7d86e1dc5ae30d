// Process-wide logging. Levels debug < verbose < info < warn < error; the
// default is info. Errors go to stderr, everything else to stdout, so that a
// script can keep the results and still see the failures.
#pragma once

#include <optional>
#include <string_view>

namespace kiln {

enum class LogLevel { Debug, Verbose, Info, Warn, Error };

void log_set_level(LogLevel level);
LogLevel log_level();
// ANSI colours on level tags; off by default (--color turns it on).
void log_set_color(bool enabled);

// Sends every message at or above the level to `callback` (one whole line,
// no trailing newline) instead of stdout/stderr; null restores the default.
using LogCallback = void (*)(LogLevel level, const char* text, void* user_data);
void log_set_callback(LogCallback callback, void* user_data);

// "debug", "verbose", "info", "warn"/"warning", "error" (case-insensitive).
std::optional<LogLevel> parse_log_level(std::string_view name);
const char* log_level_name(LogLevel level);

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void log_message(LogLevel level, const char* format, ...);

// Sends ggml's own log lines through kiln's levels (ggml info -> verbose).
void log_capture_ggml();

}  // namespace kiln

#define KILN_LOG_DEBUG(...) ::kiln::log_message(::kiln::LogLevel::Debug, __VA_ARGS__)
#define KILN_LOG_VERBOSE(...) ::kiln::log_message(::kiln::LogLevel::Verbose, __VA_ARGS__)
#define KILN_LOG_INFO(...) ::kiln::log_message(::kiln::LogLevel::Info, __VA_ARGS__)
#define KILN_LOG_WARN(...) ::kiln::log_message(::kiln::LogLevel::Warn, __VA_ARGS__)
#define KILN_LOG_ERROR(...) ::kiln::log_message(::kiln::LogLevel::Error, __VA_ARGS__)
