// Training-curve SVG: the expected series with one point per finite value,
// markers for eval and lone points, nice tick labels, escaping, empty panels,
// and write_plot's file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "train/metrics.h"
#include "train/plot.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

json::Value record(int64_t step, const char* split, std::vector<std::pair<const char*, double>> v) {
  json::Object r;
  r.emplace_back("step", json::Value(step));
  r.emplace_back("split", json::Value(split));
  for (const auto& [k, x] : v) r.emplace_back(k, json::Value(x));
  return json::Value(std::move(r));
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// The coordinate pairs of the polyline whose data-series is `series` (-1: none).
int polyline_points(const std::string& svg, const std::string& series) {
  const size_t at = svg.find("<polyline data-series=\"" + series + "\"");
  if (at == std::string::npos) return -1;
  const size_t begin = svg.find("points=\"", at) + 8;
  const std::string points = svg.substr(begin, svg.find('"', begin) - begin);
  return points.empty() ? 0 : static_cast<int>(count(points, " ") + 1);
}

// Well-formed enough: one root, balanced groups and texts, self-closed shapes.
void expect_well_formed(const std::string& svg) {
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "<g "), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  for (const char* shape : {"<polyline", "<circle", "<line", "<rect"}) {
    for (size_t p = svg.find(shape); p != std::string::npos; p = svg.find(shape, p + 1)) {
      const size_t end = svg.find('>', p);
      ASSERT_NE(end, std::string::npos);
      EXPECT_EQ(svg[end - 1], '/') << svg.substr(p, end - p + 1);
    }
  }
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(Plot, SeriesPointsAndMarkers) {
  std::vector<json::Value> records;
  for (int64_t s = 0; s < 10; ++s) {
    records.push_back(record(s * 100, "train",
                             {{"loss", s == 5 ? std::nan("") : 2.0 - 0.15 * static_cast<double>(s)},
                              {"accuracy", 0.1 * static_cast<double>(s)}}));
    if (s % 4 == 0)
      records.push_back(record(s * 100, "eval", {{"loss", 1.9 - 0.1 * static_cast<double>(s)}}));
  }
  records.push_back(record(950, "train", {{"lr", 0.1}}));   // no loss: not a point
  records.push_back(record(960, "test", {{"loss", 5.0}}));  // another split: not drawn
  json::Object null_loss;
  null_loss.emplace_back("step", json::Value(970));
  null_loss.emplace_back("split", json::Value("train"));
  null_loss.emplace_back("loss", json::Value());  // NaN as the log writes it
  records.push_back(json::Value(std::move(null_loss)));

  const std::string svg = render_svg(records);
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg, "loss train"), 9);  // 10 steps, one NaN
  EXPECT_EQ(polyline_points(svg, "loss eval"), 3);   // steps 0, 400, 800
  EXPECT_EQ(count(svg, "<circle data-series=\"loss eval\""), 3u);
  EXPECT_EQ(count(svg, "<circle data-series=\"loss train\""), 0u);
  EXPECT_EQ(polyline_points(svg, "accuracy train"), 10);
  EXPECT_EQ(polyline_points(svg, "accuracy eval"), -1);
  EXPECT_NE(svg.find(">training curves</text>"), std::string::npos);
  EXPECT_EQ(count(svg, ">train</text>"), 3u);       // the legends (loss, accuracy, lr)
  EXPECT_EQ(polyline_points(svg, "lr train"), -1);  // one lr point: a marker
  EXPECT_EQ(count(svg, "<circle data-series=\"lr train\""), 1u);
  EXPECT_EQ(count(svg, ">eval</text>"), 1u);
  EXPECT_EQ(svg.find("no data"), std::string::npos);
  // Steps 0..900: ticks every 200; accuracy 0..0.9 every 0.2; loss 0.65..2.0 every 0.5.
  for (const char* label : {">0</text>", ">200</text>", ">1000</text>", ">0.2</text>",
                            ">0.8</text>", ">1.0</text>", ">0.5</text>", ">2.0</text>"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_EQ(svg.find(">-0"), std::string::npos);
}

TEST(Plot, PointsStayInsideThePanels) {
  std::vector<json::Value> records;
  for (int64_t s = 1; s <= 5; ++s)
    records.push_back(record(s * 7, "train", {{"loss", std::pow(10.0, static_cast<double>(s))}}));
  const std::string svg = render_svg(records, {.width = 600, .height = 300});
  expect_well_formed(svg);
  const size_t begin = svg.find("points=\"") + 8;
  std::string points = svg.substr(begin, svg.find('"', begin) - begin);
  for (char& c : points)
    if (c == ',') c = ' ';
  std::istringstream in(points);
  double x, y;
  int n = 0;
  while (in >> x >> y) {
    EXPECT_GE(x, 0);
    EXPECT_LE(x, 200);  // the loss panel is the left third
    EXPECT_GE(y, 32);
    EXPECT_LE(y, 300);
    ++n;
  }
  EXPECT_EQ(n, 5);
}

TEST(Plot, EmptyAndSinglePoint) {
  const std::string empty = render_svg({});
  expect_well_formed(empty);
  EXPECT_EQ(count(empty, "no data"), 3u);
  EXPECT_EQ(count(empty, "<polyline"), 0u);

  const std::string one = render_svg({record(0, "eval", {{"loss", 0.7}, {"accuracy", 1.0}})});
  expect_well_formed(one);
  EXPECT_EQ(count(one, "<polyline"), 0u);
  EXPECT_EQ(count(one, "<circle data-series=\"loss eval\""), 1u);
  EXPECT_EQ(count(one, "<circle data-series=\"accuracy eval\""), 1u);
  EXPECT_EQ(count(one, "no data"), 1u);  // no learning rate

  // A lone train point (a flat range) and NaN everywhere else.
  const std::string flat = render_svg(
      {record(5, "train", {{"loss", 1.0}}), record(6, "train", {{"loss", std::nan("")}})});
  expect_well_formed(flat);
  EXPECT_EQ(count(flat, "<circle data-series=\"loss train\""), 1u);
  EXPECT_EQ(count(flat, "no data"), 2u);  // the accuracy and lr panels
}

// The legend sits between a panel's title and its plot area: above every
// point, so it covers no data wherever the curves go (it used to sit in the
// top right corner, over a rising curve's last points).
TEST(Plot, TheLegendCoversNoData) {
  std::vector<json::Value> records;
  for (int64_t s = 0; s <= 10; ++s)
    records.push_back(record(
        s, "train", {{"loss", 1.0}, {"accuracy", 0.1 * static_cast<double>(s)}, {"lr", 0.1}}));
  records.push_back(record(10, "eval", {{"accuracy", 1.0}}));
  const std::string svg = render_svg(records);
  expect_well_formed(svg);
  double lowest_legend = 0, highest_point = 1e9;
  for (size_t p = svg.find("<line class=\"legend\""); p != std::string::npos;
       p = svg.find("<line class=\"legend\"", p + 1))
    lowest_legend = std::max(lowest_legend, std::stod(svg.substr(svg.find("y1=\"", p) + 4)));
  for (size_t p = svg.find("cy=\""); p != std::string::npos; p = svg.find("cy=\"", p + 1))
    highest_point = std::min(highest_point, std::stod(svg.substr(p + 4)));
  for (size_t p = svg.find("points=\""); p != std::string::npos; p = svg.find("points=\"", p + 1)) {
    std::string pts = svg.substr(p + 8, svg.find('"', p + 8) - p - 8);
    for (char& c : pts)
      if (c == ',') c = ' ';
    std::istringstream in(pts);
    for (double x, y; in >> x >> y;) highest_point = std::min(highest_point, y);
  }
  EXPECT_GT(lowest_legend, 0);
  EXPECT_LT(lowest_legend + 6, highest_point) << "a legend reaches into the data";
}

TEST(Plot, ConfusionMatrixHeatMap) {
  const std::vector<std::vector<int64_t>> m = {{8, 2, 0}, {1, 9, 0}, {0, 0, 0}};
  const std::string svg = render_confusion_svg(m, {"cat", "dog <x>"}, "eval");
  expect_well_formed(svg);
  EXPECT_EQ(count(svg, "<rect data-cell="), 9u);
  // A full row is dark, an empty one (no examples) white; counts are written.
  const auto fill_of = [&](const std::string& cell) {
    const size_t p = svg.find("data-cell=\"" + cell + "\"");
    const size_t f = svg.find("fill=\"", p) + 6;
    return svg.substr(f, svg.find('"', f) - f);
  };
  EXPECT_EQ(fill_of("2 2"), "rgb(255,255,255)");
  EXPECT_EQ(fill_of("0 1"), fill_of("0 1"));
  EXPECT_NE(fill_of("1 1"), fill_of("0 0"));  // 90% and 80% of their rows
  EXPECT_NE(svg.find(">9</text>"), std::string::npos);
  EXPECT_NE(svg.find("dog &lt;x&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">2</text>"), std::string::npos);  // class 2 has no name: its id
  EXPECT_THROW(render_confusion_svg({}, {}, "x"), Error);
}

TEST(Plot, OptionsAndEscaping) {
  PlotOptions o;
  o.title = "vit <small> & \"fast\"";
  o.loss_field = "nll";
  o.accuracy_field = "top1";
  const std::string svg = render_svg({record(1, "train", {{"nll", 3.0}, {"top1", 0.2}}),
                                      record(2, "train", {{"nll", 2.0}, {"top1", 0.4}})},
                                     o);
  expect_well_formed(svg);
  EXPECT_NE(svg.find("vit &lt;small&gt; &amp; &quot;fast&quot;"), std::string::npos);
  EXPECT_EQ(polyline_points(svg, "nll train"), 2);
  EXPECT_EQ(polyline_points(svg, "top1 train"), 2);
  EXPECT_THROW(render_svg({}, {.width = 10}), Error);
}

TEST(Plot, WritePlotReadsTheMetricsFile) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("forge_plot_{}", ::getpid());
  fs::remove_all(dir);
  {
    MetricsLog log(dir.string());
    for (int64_t s = 1; s <= 4; ++s) log.log(s, "train", {{"loss", 1.0 / static_cast<double>(s)}});
  }
  write_plot(dir.string());
  std::ifstream in(dir / "curves.svg", std::ios::binary);
  const std::string svg(std::istreambuf_iterator<char>(in), {});
  expect_well_formed(svg);
  EXPECT_EQ(polyline_points(svg, "loss train"), 4);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files,
            4u);  // metrics.jsonl, metrics.csv, the TensorBoard events and curves.svg, no temp file
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge::train
