// Training curves as a self-contained SVG (no scripts, fonts or other files):
// three panels side by side, loss, accuracy and learning rate vs step, each
// with the train series (solid) and the eval series (dashed, with a marker
// per point), nice-number axes, a legend above the plot area (it covers no
// data) and a title. Records are metrics.jsonl objects
// ({"step", "split", fields...}); a missing, null or non-finite value is
// skipped, and an empty panel says "no data".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"

namespace forge::train {

struct PlotOptions {
  std::string title = "training curves";
  std::string loss_field = "loss";
  std::string accuracy_field = "accuracy";
  std::string lr_field = "lr";
  int width = 1200;  // pixels, all panels
  int height = 420;
};

// Each series is a <polyline> (two points or more) whose data-series
// attribute is "FIELD SPLIT" (e.g. "loss train"); eval points and lone points
// are also <circle>s with the same attribute.
std::string render_svg(const std::vector<json::Value>& records, const PlotOptions& options = {});

// A confusion matrix (rows: true class, columns: predicted) as a heat map:
// each cell coloured by its share of its row, with its count when the cells
// are large enough and the class names along both sides (up to 60 classes);
// each cell is a <rect data-cell="TRUE PRED" data-count="N">.
std::string render_confusion_svg(const std::vector<std::vector<int64_t>>& confusion,
                                 const std::vector<std::string>& names, const std::string& title);

// Reads run_dir/metrics.jsonl and writes run_dir/curves.svg atomically.
void write_plot(const std::string& run_dir, const PlotOptions& options = {});

}  // namespace forge::train
