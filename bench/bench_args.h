// The benchmark programs' command lines and main: each program lists its
// options once, as (name, where the value goes), and one routine walks argv
// against the list.
//
//   int64_t n = 1024;
//   bool csv = false;
//   std::vector<std::string> kinds;
//   parse_bench_args(argc, argv,
//                    {{"--n", &n}, {"--csv", &csv}, {"--kind", &kinds},
//                     {"--device", [&](const std::string& v) { device = parse(v); }}});
//   int main(int argc, char** argv) { return bench_main("bench_stack", argc, argv, run); }
//
// A bool target is a flag (no value); an integer or double target takes a
// number (all of the value: "12x" is an error); a string list takes comma-separated items; a
// function gets the value as written. An unknown option, a missing value or a malformed number
// throws, naming the option (an unknown one with the list of options); bench_main prints "PROGRAM:
// error: ..." and exits 1.
#pragma once

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/error.h"

namespace forge::bench {

// "a,b,,c" -> {"a", "b", "c"}.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// v as a T, all of it, or an error naming the option.
template <typename T>
T parse_number(const std::string& option, const std::string& v) {
  size_t used = 0;
  T x{};
  try {
    if constexpr (std::is_same_v<T, int>)
      x = std::stoi(v, &used);
    else if constexpr (std::is_same_v<T, int64_t>)
      x = std::stoll(v, &used);
    else
      x = std::stod(v, &used);
  } catch (const std::logic_error&) {  // invalid_argument, out_of_range
    used = 0;
  }
  FORGE_CHECK(!v.empty() && used == v.size(), "{} takes a number, got '{}'", option, v);
  return x;
}

struct BenchOption {
  const char* name;  // "--n"
  std::variant<bool*, int*, int64_t*, double*, std::string*, std::vector<std::string>*,
               std::function<void(const std::string&)>>
      target;
};

inline void parse_bench_args(int argc, char** argv, const std::vector<BenchOption>& options) {
  std::string names;
  for (const BenchOption& o : options) names += (names.empty() ? "" : ", ") + std::string(o.name);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const BenchOption* option = nullptr;
    for (const BenchOption& o : options)
      if (a == o.name) option = &o;
    FORGE_CHECK(option, "unknown argument {} (options: {})", a, names);
    if (bool* const* flag = std::get_if<bool*>(&option->target)) {
      **flag = true;
      continue;
    }
    FORGE_CHECK(i + 1 < argc, "{} needs a value", a);
    const std::string v = argv[++i];
    std::visit(
        [&](const auto& t) {
          using T = std::decay_t<decltype(t)>;
          if constexpr (std::is_same_v<T, bool*>)
            *t = true;  // (flags are set above)
          else if constexpr (std::is_same_v<T, std::string*>)
            *t = v;
          else if constexpr (std::is_same_v<T, std::vector<std::string>*>)
            *t = split_list(v);
          else if constexpr (std::is_same_v<T, std::function<void(const std::string&)>>)
            t(v);
          else
            *t = parse_number<std::remove_pointer_t<T>>(a, v);
        },
        option->target);
  }
}

inline int bench_main(const char* program, int argc, char** argv,
                      const std::function<int(int, char**)>& run) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace forge::bench
