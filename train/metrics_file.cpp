#include "train/metrics_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace forge::train {

namespace {

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

json::Value parse_line(std::string_view line, const std::string& path, size_t number) {
  const std::string where = fmt::format("{}:{}", path, number);
  json::Value r = json::parse(line, where);
  check_metrics_record(r, where);
  return r;
}

}  // namespace

void check_metrics_record(const json::Value& r, const std::string& where) {
  FORGE_CHECK(r.is_object(), "{}: expected a JSON object (a metrics record), found {}", where,
              json::type_name(r.type()));
  const json::Value* step = r.find("step");
  FORGE_CHECK(step && step->is_int() && step->as_double() >= 0,
              "{}: expected an integer \"step\" >= 0, found {}", where,
              step ? json::dump(*step) : std::string("none"));
  const json::Value* split = r.find("split");
  FORGE_CHECK(split && split->is_string(),
              "{}: expected a string \"split\" (\"train\" or \"eval\"), found {}", where,
              split ? json::dump(*split) : std::string("none"));
}

std::string read_metrics_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in.is_open(), "{}: cannot open: {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FORGE_CHECK(!in.bad(), "{}: read failed", path);
  return text;
}

std::string metrics_kept(std::string_view text, const std::string& path, int64_t resume_step) {
  std::string kept;
  size_t pos = 0;
  for (size_t number = 1; pos < text.size(); ++number) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) break;
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (blank(line)) continue;
    if (parse_line(line, path, number).at("step").as_int() <= resume_step) {
      kept.append(line);
      kept.push_back('\n');
    }
  }
  return kept;
}

std::vector<json::Value> read_metrics(const std::string& path) {
  const std::string text = read_metrics_text(path);
  std::vector<json::Value> out;
  size_t pos = 0;
  for (size_t number = 1; pos < text.size(); ++number) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string_view line = std::string_view(text).substr(pos, nl - pos);
    pos = nl + 1;
    if (!blank(line)) out.push_back(parse_line(line, path, number));
  }
  return out;
}

}  // namespace forge::train
