// The one failure-injection hook, for tests and scripts/soak.sh: code marks
// the points where a crash can be simulated, and a test (fault::arm) or the
// environment arms one of them:
//
//   ATTNFORGE_FAULT=POINT:N[:ACTION[:RANK]]
//
// POINT, where it fires:
//   checkpoint  the N-th checkpoint write step since the process started (or
//               since fault::arm): creating the temp directory, writing each
//               file (a fault there leaves the file half written), each
//               fsync, rename and removal (train/checkpoint_commit.cpp,
//               train/checkpoint_manager.cpp);
//   step        the training loop once N steps are done (a resumed run's
//               steps included), before the next one (train/run.cpp).
// ACTION: raise (the default: throws InjectedFault, an Error the code lets
// through without cleaning up, as a crash would leave things), kill (SIGKILL:
// no flush, no cleanup) or hang (sleeps an hour: a process that stopped
// answering). RANK: only that process of a data-parallel job (dist tells the
// hook each process's rank); without it every process.
//
// A fault fires once. The environment is read at the first point or arm.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"

namespace forge::fault {

// A crash the hook simulated: unlike a real error, nothing is cleaned up.
class InjectedFault : public Error {
 public:
  using Error::Error;
};

enum class Action { raise, kill, hang };

struct Plan {
  std::string point;  // "checkpoint" or "step"
  int64_t at = 0;     // N (<= 0: nothing armed)
  Action action = Action::raise;
  int rank = -1;  // -1: every process
};

// Arms `plan`, replacing ATTNFORGE_FAULT's and any earlier one.
void arm(const Plan& plan);
// This process's rank in a data-parallel job (0 without one).
void set_rank(int rank);

// A counted point (checkpoint): whether the armed fault is due at this hit.
// Then fire() it (after leaving what a crash there would leave).
bool due(std::string_view point);
// An indexed point (step): whether the armed fault is due at `index`.
bool due_at(std::string_view point, int64_t index);
// The armed action at `what` (a description of the point): throws, kills or hangs.
[[noreturn]] void fire(std::string_view what);
// A counted point: due(point), then fire(what).
void point(std::string_view point, std::string_view what);

}  // namespace forge::fault
