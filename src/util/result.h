// Errors as values. Bad input (files, flags, bodies) is reported as an Error
// whose message names the thing and what is wrong with it; callers add
// context and pass it up (in_context keeps the kind), the front-end prints it
// once. Callers decide on the kind, never on the message text.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

// What went wrong, for callers that react (retry smaller, report a status
// code, exit with 1 or 2). The C API's codes mirror these (include/kiln.h).
enum class ErrorKind {
    Internal,        // a failed graph, a bug: nothing the caller can fix
    InvalidRequest,  // a flag, request field or prompt out of range
    BadFile,         // a model, image or tokenizer file that cannot be used
    OutOfMemory,     // a budget or an allocation could not hold the job
    Cancelled,       // kiln_cancel stopped the job
};

// "internal", "invalid request", "bad file", "out of memory", "cancelled".
inline const char* error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::Internal: return "internal";
        case ErrorKind::InvalidRequest: return "invalid request";
        case ErrorKind::BadFile: return "bad file";
        case ErrorKind::OutOfMemory: return "out of memory";
        case ErrorKind::Cancelled: return "cancelled";
    }
    return "internal";
}

struct Error {
    std::string message;
    ErrorKind kind = ErrorKind::Internal;

    static Error invalid_request(std::string message) { return {std::move(message), ErrorKind::InvalidRequest}; }
    static Error bad_file(std::string message) { return {std::move(message), ErrorKind::BadFile}; }
    static Error out_of_memory(std::string message) { return {std::move(message), ErrorKind::OutOfMemory}; }
    static Error cancelled(std::string message) { return {std::move(message), ErrorKind::Cancelled}; }

    // The same error with `context` in front of its message ("file.gguf: ").
    Error in_context(const std::string& context) const { return {context + message, kind}; }
    // The same message as `new_kind`, unless it already says out of memory or
    // cancelled (those outrank where the failure happened).
    Error as(ErrorKind new_kind) const {
        if (kind == ErrorKind::OutOfMemory || kind == ErrorKind::Cancelled) return *this;
        return {message, new_kind};
    }
};

// Either a value or an Error. Accessing value() of an error (or error() of a
// value) is a programmer error.
template <class T>
class [[nodiscard]] Result {
  public:
    Result(T value) : state_(std::move(value)) {}
    Result(Error error) : state_(std::move(error)) {}

    bool ok() const { return state_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T& value() & { return std::get<0>(state_); }
    const T& value() const& { return std::get<0>(state_); }
    T&& value() && { return std::get<0>(std::move(state_)); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    const Error& error() const { return std::get<1>(state_); }

  private:
    std::variant<T, Error> state_;
};

// Success or an Error, for operations that return nothing.
class [[nodiscard]] Status {
  public:
    Status() = default;
    Status(Error error) : error_(std::move(error)) {}
    static Status Ok() { return Status(); }

    bool ok() const { return !error_.has_value(); }
    explicit operator bool() const { return ok(); }
    const Error& error() const { return *error_; }

  private:
    std::optional<Error> error_;
};

}  // namespace kiln

// Returns the error of a Result/Status expression from the enclosing function.
#define KILN_TRY(expr)                                      \
    do {                                                    \
        auto&& kiln_try_result_ = (expr);                   \
        if (!kiln_try_result_.ok()) {                       \
            return ::kiln::Error{kiln_try_result_.error()}; \
        }                                                   \
    } while (0)
