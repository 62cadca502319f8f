#include "core/fault.h"

#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace forge::fault {
namespace {

struct State {
  std::mutex mu;
  Plan plan;
  int64_t hits = 0;  // of plan.point, since it was armed (counted points)
  int rank = 0;
  bool env_read = false;
  bool from_env = false;
};

State& state() {
  static State s;
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t p; (p = s.find(sep, at)) != std::string::npos; at = p + 1)
    parts.push_back(s.substr(at, p - at));
  parts.push_back(s.substr(at));
  return parts;
}

int64_t positive(const std::string& spec, const std::string& field, const char* what) {
  char* end = nullptr;
  const long long v = std::strtoll(field.c_str(), &end, 10);
  FORGE_CHECK(!field.empty() && *end == '\0' && v >= 0,
              "ATTNFORGE_FAULT={}: {} must be a whole number, found \"{}\" (expected "
              "POINT:N[:ACTION[:RANK]], e.g. checkpoint:3:kill or step:10:raise:1)",
              spec, what, field);
  return v;
}

Plan parse(const std::string& spec) {
  const std::vector<std::string> f = split(spec, ':');
  FORGE_CHECK(f.size() >= 2 && f.size() <= 4,
              "ATTNFORGE_FAULT={}: expected POINT:N[:ACTION[:RANK]], e.g. checkpoint:3:kill or "
              "step:10:raise:1",
              spec);
  Plan p;
  p.point = f[0];
  FORGE_CHECK(p.point == "checkpoint" || p.point == "step",
              "ATTNFORGE_FAULT={}: unknown point '{}' (the points: checkpoint, step)", spec,
              p.point);
  p.at = positive(spec, f[1], "N");
  FORGE_CHECK(p.at >= 1, "ATTNFORGE_FAULT={}: N counts from 1", spec);
  if (f.size() >= 3) {
    const std::string& a = f[2];
    FORGE_CHECK(a == "raise" || a == "kill" || a == "hang",
                "ATTNFORGE_FAULT={}: unknown action '{}' (raise, kill or hang)", spec, a);
    p.action = a == "raise" ? Action::raise : a == "kill" ? Action::kill : Action::hang;
  }
  if (f.size() == 4) p.rank = static_cast<int>(positive(spec, f[3], "RANK"));
  return p;
}

// Reads ATTNFORGE_FAULT once (s.mu held).
void read_env(State& s) {
  if (s.env_read) return;
  s.env_read = true;
  const char* spec = std::getenv("ATTNFORGE_FAULT");
  if (spec == nullptr || *spec == '\0') return;
  s.plan = parse(spec);
  s.from_env = true;
}

bool armed_here(const State& s, std::string_view point) {
  return s.plan.at > 0 && s.plan.point == point && (s.plan.rank < 0 || s.plan.rank == s.rank);
}

}  // namespace

void arm(const Plan& plan) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  read_env(s);
  s.plan = plan;
  s.hits = 0;
  s.from_env = false;
}

void set_rank(int rank) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.rank = rank;
}

bool due(std::string_view point) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  read_env(s);
  return armed_here(s, point) && ++s.hits == s.plan.at;
}

bool due_at(std::string_view point, int64_t index) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  read_env(s);
  return armed_here(s, point) && index == s.plan.at;
}

void fire(std::string_view what) {
  State& s = state();
  Plan p;
  bool from_env = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    p = s.plan;
    from_env = s.from_env;
    s.plan.at = 0;  // once
  }
  // No flush, no cleanup: buffered output and half-written files stay as a kill leaves them.
  if (p.action == Action::kill) ::raise(SIGKILL);
  if (p.action == Action::hang) std::this_thread::sleep_for(std::chrono::hours(1));
  throw InjectedFault(fmt::format("fault injected by {} ({} {}{}), simulated crash: {}",
                                  from_env ? "ATTNFORGE_FAULT" : "fault::arm", p.point, p.at,
                                  p.rank >= 0 ? fmt::format(" on rank {}", p.rank) : "", what));
}

void point(std::string_view point, std::string_view what) {
  if (due(point)) fire(what);
}

}  // namespace forge::fault
