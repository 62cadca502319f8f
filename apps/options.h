// The command line of one attnforge command, parsed by one routine from the
// command's list of options (apps/attnforge.cpp's table of commands).
//
//   const std::vector<OptionSpec> kOptions = {{"--out", OptionSpec::value},
//                                             {"--ema", OptionSpec::flag},
//                                             {"--set", OptionSpec::repeated}};
//   const Args a = parse_args("eval", args, kOptions, {"a checkpoint or a run directory"});
//   a.positional[0]; a.text("--out"); a.flag("--ema"); a.all("--set");
//   a.number<int64_t>("--length", 256)
// Errors are UsageErrors naming the command and the option: an unknown option,
// a value missing, a number that is not one, a positional argument too many
// (naming what was expected). "--name=value" is accepted for value options.
#pragma once

#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace forge::cli {

// A mistake on the command line: exit status 2 and a pointer to --help.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OptionSpec {
  enum Kind { flag, value, repeated };
  const char* name;  // "--out"
  Kind kind = value;
};

class Args {
 public:
  std::vector<std::string> positional;

  bool flag(const std::string& name) const { return values_.contains(name); }
  bool has(const std::string& name) const { return values_.contains(name); }
  // The value given (the last one), or `otherwise`.
  std::string text(const std::string& name, const std::string& otherwise = "") const {
    const auto it = values_.find(name);
    return it == values_.end() ? otherwise : it->second.back();
  }
  // Every value of a repeated option, in order.
  std::vector<std::string> all(const std::string& name) const {
    const auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  // The value as a number (integer or floating point by T), or `otherwise`.
  template <typename T>
  T number(const std::string& name, T otherwise) const {
    if (!has(name)) return otherwise;
    const std::string v = text(name);
    try {
      size_t used = 0;
      T x{};
      if constexpr (std::is_floating_point_v<T>)
        x = static_cast<T>(std::stod(v, &used));
      else
        x = static_cast<T>(std::stoll(v, &used));
      if (used == v.size()) return x;
    } catch (const std::exception&) {
    }
    throw UsageError(fmt::format("{}: expected a number, got '{}'", name, v));
  }

 private:
  friend Args parse_args(const std::string&, const std::vector<std::string>&,
                         const std::vector<OptionSpec>&, const std::vector<std::string>&, bool);
  std::map<std::string, std::vector<std::string>> values_;
};

// args of `command` against its options. `positional` names what each
// positional argument is ("a checkpoint", "an input"); with `more_positional`
// the last kind may repeat (predict's inputs), else one argument too many is
// an error naming the expected ones.
inline Args parse_args(const std::string& command, const std::vector<std::string>& args,
                       const std::vector<OptionSpec>& options,
                       const std::vector<std::string>& positional = {},
                       bool more_positional = false) {
  Args out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      if (out.positional.size() >= positional.size() && !more_positional)
        throw UsageError(
            positional.empty()
                ? fmt::format("{} takes no arguments, got {}", command, a)
                : fmt::format("{}: {} expected, got a second: {}", command,
                              positional.back(), a));
      out.positional.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const OptionSpec* spec = nullptr;
    for (const OptionSpec& o : options)
      if (name == o.name) spec = &o;
    if (!spec || (spec->kind == OptionSpec::flag && eq != std::string::npos))
      throw UsageError(fmt::format("{}: unknown option {}", command, a));
    std::vector<std::string>& slot = out.values_[name];
    if (spec->kind == OptionSpec::flag) {
      slot.push_back("");
    } else if (eq != std::string::npos) {
      slot.push_back(a.substr(eq + 1));
    } else {
      if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", a));
      slot.push_back(args[++i]);
    }
  }
  return out;
}

}  // namespace forge::cli
