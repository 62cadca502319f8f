// Errors: FORGE_CHECK throws forge::Error naming the file, line and a message a
// user can act on (what was expected, what was found). Library code never aborts.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace forge {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace forge

#define FORGE_CHECK(cond, ...)                                              \
  do {                                                                      \
    if (!(cond)) [[unlikely]] {                                             \
      ::forge::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                       \
  } while (0)

#define FORGE_FAIL(...) ::forge::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
