// Errors: FORGE_CHECK throws forge::Error with a message a user can act on
// (what was expected, what was found) and the source file and line that threw
// it. what() gives both ("message (train/recipe.cpp:92)"), for developers and
// logs; a program shows users message() (attnforge: the location only with
// ATTNFORGE_DEBUG=1). Library code never aborts.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace forge {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string location = {})
      : std::runtime_error(location.empty() ? message : message + " (" + location + ")"),
        message_(message),
        location_(std::move(location)) {}
  // The message alone, and "file.cpp:line" (empty when not known).
  const std::string& message() const { return message_; }
  const std::string& location() const { return location_; }

 private:
  std::string message_, location_;
};

// What to show a user of an exception: a forge::Error's message without its
// source location, any other's what(). Use it where one error's text goes
// into another's message.
std::string message_of(const std::exception& e);

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

// `bytes` fit to quote in a message (they may come from a damaged or hostile
// file): printable ASCII as is, every other byte and " and \ as \xNN, cut
// with "..." after `max_chars` characters.
std::string escaped(std::string_view bytes, size_t max_chars = 64);

}  // namespace forge

#if defined(__CUDACC__)
// nvcc cannot compile fmt's compile-time format-string checks: in .cu files
// the message is formatted at run time.
#define FORGE_FORMAT(format_string, ...) \
  ::fmt::format(::fmt::runtime(format_string) __VA_OPT__(, ) __VA_ARGS__)
#else
#define FORGE_FORMAT(...) ::fmt::format(__VA_ARGS__)
#endif

#define FORGE_CHECK(cond, ...)                                             \
  do {                                                                     \
    if (!(cond)) [[unlikely]] {                                            \
      ::forge::throw_error(__FILE__, __LINE__, FORGE_FORMAT(__VA_ARGS__)); \
    }                                                                      \
  } while (0)

#define FORGE_FAIL(...) ::forge::throw_error(__FILE__, __LINE__, FORGE_FORMAT(__VA_ARGS__))
