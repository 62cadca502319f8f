// The run's metrics.jsonl as text, read and checked without writing (no
// TensorBoard here, so that a fuzz target links it alone): the records, and
// the lines a resume keeps.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"

namespace forge::train {

// A record must be an object with an integer "step" >= 0 and a string
// "split"; `where` ("file:line", "MetricsLog path") starts the error.
void check_metrics_record(const json::Value& record, const std::string& where);

// The file's bytes; errors name it.
std::string read_metrics_text(const std::string& path);

// What a run resumed at `resume_step` keeps of metrics.jsonl `text` (from
// `path`): its whole lines whose step is at most resume_step, in order, blank
// lines dropped; a last line without its newline was torn by a crash and is
// dropped. A bad whole line is an error naming path:line.
std::string metrics_kept(std::string_view text, const std::string& path, int64_t resume_step);

// Every record of a metrics file, in file order. Blank lines are skipped; a
// line that is not a JSON object with an integer "step" and a string "split"
// is a forge::Error naming the file and line ("run/metrics.jsonl:12: ...").
std::vector<json::Value> read_metrics(const std::string& path);

}  // namespace forge::train
