// Errors: FORGE_CHECK throws forge::Error naming the file, line and a message a
// user can act on (what was expected, what was found). Library code never aborts.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>
#include <string_view>

namespace forge {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
