#include "core/version.h"

#include "forge_version.h"  // generated at build time (cmake/version.cmake)

namespace forge {

const char* version() {
  return FORGE_VERSION;
}
const char* git_commit() {
  return FORGE_GIT_COMMIT;
}

}  // namespace forge
