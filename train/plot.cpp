// render_svg: the two-panel training-curve SVG, drawn by hand.
#include "train/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "train/checkpoint.h"
#include "train/metrics.h"

namespace forge::train {

namespace {

struct Point {
  double step, value;
};

struct Series {
  const char* split;
  const char* color;
  bool dashed;
  std::vector<Point> points;
};

// An axis from `lo` to `hi` with ticks every `tick`, labelled with `decimals`.
struct Axis {
  double lo, hi, tick;
  int decimals;
  double frac(double v) const { return (v - lo) / (hi - lo); }
};

// The "nice" number (1, 2 or 5 times a power of ten) nearest to x (round) or
// at least x (ceiling), after Heckbert's Graphics Gems labelling.
double nice_number(double x, bool round) {
  const double e = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, e);
  double n;
  if (round) {
    n = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  } else {
    n = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  }
  return n * std::pow(10.0, e);
}

// Covers [lo, hi] (lo > hi: no data) with about five nice ticks; `integer`
// axes (steps) never tick between integers.
Axis make_axis(double lo, double hi, bool integer) {
  if (lo > hi) {
    lo = 0;
    hi = 1;
  }
  if (lo == hi) {
    const double d = lo == 0 ? 1 : std::abs(lo) * 0.1;
    const bool non_negative = lo >= 0;
    lo -= d;
    hi += d;
    if (integer && non_negative) lo = std::max(lo, 0.0);
  }
  double tick = nice_number(nice_number(hi - lo, false) / 4, true);
  if (integer) tick = std::max(tick, 1.0);
  Axis a{std::floor(lo / tick) * tick, std::ceil(hi / tick) * tick, tick, 0};
  a.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(tick) + 1e-9)));
  return a;
}

std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::vector<Point> collect(const std::vector<json::Value>& records, const std::string& split,
                           const std::string& field) {
  std::vector<Point> out;
  for (const json::Value& r : records) {
    if (!r.is_object()) continue;
    const json::Value* s = r.find("split");
    const json::Value* step = r.find("step");
    const json::Value* v = r.find(field);
    if (!s || !s->is_string() || s->as_string() != split) continue;
    if (!step || !step->is_number() || !v || !v->is_number()) continue;
    const double x = step->as_double(), y = v->as_double();
    if (std::isfinite(x) && std::isfinite(y)) out.push_back({x, y});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Point& a, const Point& b) { return a.step < b.step; });
  return out;
}

// One panel in the box (x0, y0, w, h) of the whole image.
void draw_panel(std::string& svg, const std::vector<json::Value>& records, const std::string& field,
                double x0, double y0, double w, double h) {
  std::vector<Series> series = {{"train", "#1f77b4", false, collect(records, "train", field)},
                                {"eval", "#d62728", true, collect(records, "eval", field)}};
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const Series& s : series) {
    for (const Point& p : s.points) {
      xlo = std::min(xlo, p.step);
      xhi = std::max(xhi, p.step);
      ylo = std::min(ylo, p.value);
      yhi = std::max(yhi, p.value);
    }
  }
  const Axis xa = make_axis(xlo, xhi, true), ya = make_axis(ylo, yhi, false);

  // The plot area inside the panel: room for the panel title and the legend
  // above it (so the legend never covers data), tick labels and axis names.
  const double left = x0 + 64, top = y0 + 44, right = x0 + w - 16, bottom = y0 + h - 44;
  const auto px = [&](double v) { return left + xa.frac(v) * (right - left); };
  const auto py = [&](double v) { return bottom - ya.frac(v) * (bottom - top); };

  svg += fmt::format("<g class=\"panel\" data-field=\"{}\">\n", escape(field));
  svg += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" font-size=\"13\" "
      "font-weight=\"bold\">{}</text>\n",
      (left + right) / 2, y0 + 16, escape(field));
  const auto ticks = [](const Axis& a) { return std::llround((a.hi - a.lo) / a.tick); };
  for (int64_t i = 0; i <= ticks(xa); ++i) {
    const double v = xa.lo + static_cast<double>(i) * xa.tick;
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e5e5e5\"/>\n"
        "<text x=\"{0:.1f}\" y=\"{3:.1f}\" text-anchor=\"middle\">{4:.{5}f}</text>\n",
        px(v), top, bottom, bottom + 15, v, xa.decimals);
  }
  for (int64_t i = 0; i <= ticks(ya); ++i) {
    double v = ya.lo + static_cast<double>(i) * ya.tick;
    if (std::abs(v) < ya.tick * 1e-9) v = 0;  // no "-0.00"
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{1:.1f}\" y2=\"{2:.1f}\" stroke=\"#e5e5e5\"/>\n"
        "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:.{6}f}</text>\n",
        left, right, py(v), left - 6, py(v) + 4, v, ya.decimals);
  }
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#333\"/>\n",
      left, top, right - left, bottom - top);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n",
                     (left + right) / 2, bottom + 34);
  svg += fmt::format(
      "<text x=\"{0:.1f}\" y=\"{1:.1f}\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 {0:.1f} {1:.1f})\">{2}</text>\n",
      x0 + 16, (top + bottom) / 2, escape(field));

  std::vector<const Series*> shown;
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    shown.push_back(&s);
    const std::string id = escape(field + " " + s.split);
    const std::string dash = s.dashed ? " stroke-dasharray=\"6 3\"" : "";
    if (s.points.size() >= 2) {
      svg += fmt::format(
          "<polyline data-series=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} "
          "points=\"",
          id, s.color, dash);
      for (size_t i = 0; i < s.points.size(); ++i) {
        svg += fmt::format("{}{:.1f},{:.1f}", i ? " " : "", px(s.points[i].step),
                           py(s.points[i].value));
      }
      svg += "\"/>\n";
    }
    if (s.dashed || s.points.size() == 1) {
      for (const Point& p : s.points) {
        svg += fmt::format(
            "<circle data-series=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"2.5\" fill=\"{}\"/>\n", id,
            px(p.step), py(p.value), s.color);
      }
    }
  }
  // The legend, in one row between the panel's title and its plot area,
  // right-aligned: outside the data, whatever the curves do.
  double legend_x = right - 60.0 * static_cast<double>(shown.size());
  for (const Series* s : shown) {
    svg += fmt::format(
        "<line class=\"legend\" x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" "
        "stroke=\"{}\" stroke-width=\"1.5\"{}/>\n"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        legend_x, top - 10, legend_x + 22, top - 10, s->color,
        s->dashed ? " stroke-dasharray=\"6 3\"" : "", legend_x + 27, top - 6, s->split);
    legend_x += 60;
  }
  if (shown.empty()) {
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n",
        (left + right) / 2, (top + bottom) / 2);
  }
  svg += "</g>\n";
}

}  // namespace

std::string render_svg(const std::vector<json::Value>& records, const PlotOptions& options) {
  FORGE_CHECK(options.width >= 200 && options.height >= 150,
              "render_svg: the image must be at least 200 x 150 pixels, found {} x {}",
              options.width, options.height);
  const double w = options.width, h = options.height;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<text x=\"{2:.1f}\" y=\"22\" text-anchor=\"middle\" font-size=\"16\">{3}</text>\n",
      options.width, options.height, w / 2, escape(options.title));
  draw_panel(svg, records, options.loss_field, 0, 32, w / 3, h - 32);
  draw_panel(svg, records, options.accuracy_field, w / 3, 32, w / 3, h - 32);
  draw_panel(svg, records, options.lr_field, 2 * w / 3, 32, w / 3, h - 32);
  svg += "</svg>\n";
  return svg;
}

std::string render_confusion_svg(const std::vector<std::vector<int64_t>>& confusion,
                                 const std::vector<std::string>& names, const std::string& title) {
  const auto C = static_cast<int64_t>(confusion.size());
  FORGE_CHECK(C > 0, "render_confusion_svg: no classes");
  // Cells shrink with the classes so that the image stays readable: counts
  // are written into cells of 24 pixels or more.
  const double cell = std::clamp(560.0 / static_cast<double>(C), 2.0, 48.0);
  const double label = C <= 60 ? 110 : 20, left = label + 10, top = 40 + label;
  const double side = cell * static_cast<double>(C);
  const double width = left + side + 20, height = top + side + 40;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"sans-serif\" font-size=\"11\">\n"
      "<rect width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"white\"/>\n"
      "<text x=\"{2:.1f}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      width, height, width / 2, escape(title));
  const auto name = [&](int64_t c) {
    return static_cast<size_t>(c) < names.size() ? names[static_cast<size_t>(c)]
                                                 : std::to_string(c);
  };
  for (int64_t i = 0; i < C; ++i) {
    int64_t total = 0;
    for (int64_t n : confusion[static_cast<size_t>(i)]) total += n;
    for (int64_t j = 0; j < C; ++j) {
      const int64_t n = confusion[static_cast<size_t>(i)][static_cast<size_t>(j)];
      // The share of the true class's examples: white (0) to dark blue (1).
      const double f = total > 0 ? static_cast<double>(n) / static_cast<double>(total) : 0.0;
      const auto channel = [&](double full) {
        return static_cast<int>(std::lround(255 - f * (255 - full)));
      };
      svg += fmt::format(
          "<rect data-cell=\"{} {}\" data-count=\"{}\" x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" "
          "height=\"{:.1f}\" fill=\"rgb({},{},{})\"/>\n",
          i, j, n, left + cell * static_cast<double>(j), top + cell * static_cast<double>(i), cell,
          cell, channel(8), channel(48), channel(107));
      if (cell >= 24 && n > 0)
        svg += fmt::format(
            "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
            left + cell * (static_cast<double>(j) + 0.5),
            top + cell * (static_cast<double>(i) + 0.5) + 4, f > 0.5 ? "white" : "black", n);
    }
    if (C <= 60) {
      svg +=
          fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 4,
                      top + cell * (static_cast<double>(i) + 0.5) + 4, escape(name(i)));
      const double x = left + cell * (static_cast<double>(i) + 0.5) + 4;
      svg += fmt::format(
          "<text x=\"{0:.1f}\" y=\"{1:.1f}\" transform=\"rotate(-60 {0:.1f} "
          "{1:.1f})\">{2}</text>\n",
          x, top - 4, escape(name(i)));
    }
  }
  svg += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"#333\"/>\n"
      "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">predicted class (columns); true "
      "class "
      "(rows); colour: share of the row</text>\n",
      left, top, side, side, left + side / 2, top + side + 24);
  svg += "</svg>\n";
  return svg;
}

void write_plot(const std::string& run_dir, const PlotOptions& options) {
  const std::filesystem::path dir(run_dir);
  const std::string svg = render_svg(read_metrics((dir / "metrics.jsonl").string()), options);
  io::write_file_atomic((dir / "curves.svg").string(), svg);
}

}  // namespace forge::train
