#include "core/error.h"

#include <cstring>

namespace forge {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep the path short: "core/tensor.cpp" rather than the absolute build path.
  const char* shown = file;
  for (const char* marker : {"/core/", "/autograd/", "/ops/", "/nn/", "/optim/", "/data/",
                             "/train/", "/dist/", "/apps/", "/tests/", "/bench/"}) {
    if (const char* p = std::strstr(file, marker)) {
      shown = p + 1;
      break;
    }
  }
  throw Error(message, fmt::format("{}:{}", shown, line));
}

std::string message_of(const std::exception& e) {
  if (const auto* f = dynamic_cast<const Error*>(&e)) return f->message();
  return e.what();
}

std::string escaped(std::string_view bytes, size_t max_chars) {
  std::string out;
  for (const char c : bytes) {
    if (out.size() >= max_chars) return out + "...";
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  return out;
}

}  // namespace forge
