#include "core/error.h"

#include <cstring>

namespace forge {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep the path short: "core/tensor.cpp" rather than the absolute build path.
  const char* shown = file;
  for (const char* marker : {"/core/", "/autograd/", "/ops/", "/nn/", "/optim/", "/data/",
                             "/train/", "/apps/", "/tests/", "/bench/"}) {
    if (const char* p = std::strstr(file, marker)) {
      shown = p + 1;
      break;
    }
  }
  throw Error(fmt::format("{} ({}:{})", message, shown, line));
}

}  // namespace forge
