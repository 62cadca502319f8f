// metrics.jsonl as a resume reads it (train/metrics_file.h: read_metrics, and
// metrics_kept, what a run resumed at a step keeps) on any bytes. The resume
// step comes from the first byte. What is kept reads back as records of
// steps up to the resume step, no more of them than the file holds, and
// keeping them again changes nothing.
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "train/metrics_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace forge;
  const int64_t step = size > 0 ? data[0] % 16 : 0;
  const fuzz::MemFile file(data, size);
  std::vector<json::Value> all;
  const bool read = fuzz::accepts([&] { all = train::read_metrics(file.path()); });
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string kept;
  if (!fuzz::accepts([&] { kept = train::metrics_kept(text, file.path(), step); })) return 0;
  FUZZ_REQUIRE(kept.size() <= text.size());
  FUZZ_REQUIRE(train::metrics_kept(kept, "kept", step) == kept);
  const fuzz::MemFile again(kept.data(), kept.size());
  const std::vector<json::Value> records = train::read_metrics(again.path());
  if (read) FUZZ_REQUIRE(records.size() <= all.size());
  for (const json::Value& r : records) FUZZ_REQUIRE(r.at("step").as_int() <= step);
  return 0;
}
