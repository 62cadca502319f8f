// Training curves as a self-contained SVG (no scripts, fonts or other files):
// two panels side by side, loss vs step and accuracy vs step, each with the
// train series (solid) and the eval series (dashed, with a marker per point),
// nice-number axes, a legend and a title. Records are metrics.jsonl objects
// ({"step", "split", fields...}); a missing, null or non-finite value is
// skipped, and an empty panel says "no data".
#pragma once

#include <string>
#include <vector>

#include "core/json.h"

namespace forge::train {

struct PlotOptions {
  std::string title = "training curves";
  std::string loss_field = "loss";
  std::string accuracy_field = "accuracy";
  int width = 1000;  // pixels, both panels
  int height = 420;
};

// Each series is a <polyline> (two points or more) whose data-series
// attribute is "FIELD SPLIT" (e.g. "loss train"); eval points and lone points
// are also <circle>s with the same attribute.
std::string render_svg(const std::vector<json::Value>& records, const PlotOptions& options = {});

// Reads run_dir/metrics.jsonl and writes run_dir/curves.svg atomically.
void write_plot(const std::string& run_dir, const PlotOptions& options = {});

}  // namespace forge::train
