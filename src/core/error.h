// Two kinds of failure. dtrain::Error is a user error: bad config, bad data,
// bad command line. Its message names what was wrong, shows the values and says
// what to change (the hint). DTRAIN_CHECK is an internal invariant: when it
// fires it is our bug, and the message carries file:line.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, std::string hint = {});
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string message_;
  std::string hint_;
};

// A job that was valid but could not run here (no CUDA device, the loss
// diverged): exit code 3 rather than 2.
class RunError : public Error {
 public:
  using Error::Error;
};

// Raised by DTRAIN_CHECK: an internal invariant failed (a dtrain bug).
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);

}  // namespace dtrain

#define DTRAIN_CHECK(cond, ...)                                                         \
  do {                                                                                  \
    if (!(cond)) [[unlikely]] {                                                         \
      ::dtrain::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    }                                                                                   \
  } while (0)
