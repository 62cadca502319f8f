// The build's version: the project version (CMakeLists.txt) and the git
// commit it was built from ("git describe --always --dirty"; "unknown"
// outside a git checkout). Shown by `attnforge --version` and written into
// every checkpoint and export.
#pragma once

namespace forge {

const char* version();     // "0.19.0"
const char* git_commit();  // "35f6a3c1d2e4" or "35f6a3c1d2e4-dirty"

}  // namespace forge
