// Errors as values. Bad input (files, flags, bodies) is reported as an Error
// whose message names the thing and what is wrong with it; callers add
// context and pass it up, the front-end prints it once.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

struct Error {
    std::string message;
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
