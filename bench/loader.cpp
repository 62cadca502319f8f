// Images per second of the training data pipeline (read, decode, augment,
// collate, batch transform) for ImageNet-like JPEGs, per loader worker count;
// bench/torch_loader.py times torchvision's DeiT pipeline on the same files.
//
//   bench_loader [--recipe recipes/vit/imagenet_vit_s16.yaml] [--root DIR] [--images 2048]
//                [--workers 1,2] [--batches 16] [--batch-size 64] [--set key=value ...]
//                [--out FILE]
//   bench_loader --print-root [--images 2048]
// Without --root, DIR is a synthetic ImageFolder (data/synthetic_images.h: 16
// classes, sides 300..500, quality 90, --images training pictures rounded up
// to a multiple of 16, and 4 per class in val/) generated once under
// $ATTNFORGE_CACHE, else /tmp, and reused.
// For each worker count the recipe's training loader (train/data.h:
// build_data, loader_options; data.root and data.workers overridden, the
// batch size set) takes one warm-up batch per worker, then K batches are
// timed. Starting the clock after one batch per worker leaves every worker at
// the start of a batch, so the K batches measure the steady rate, not the
// prefetched queue. The evaluation transform (loader_options(..., false):
// resize and centre crop, no augmentation) is timed once, on the same
// training pictures, with the largest worker count. Prints a table, and one
// JSON line per configuration to stdout (or to --out FILE). --print-root
// generates the synthetic set if needed and prints its folder (what
// torch_loader.py is given).
#include "data/loader.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "core/error.h"
#include "core/json.h"
#include "data/synthetic_images.h"
#include "train/data.h"
#include "train/recipe.h"

using namespace forge;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kClasses = 16;

struct Args {
  std::string recipe = "recipes/vit/imagenet_vit_s16.yaml";
  std::string root, out;
  int64_t images = 2048, batches = 16, batch_size = 64;
  std::vector<int> workers = {1, 2};
  std::vector<std::string> sets;
  bool print_root = false;
};

// A worker count of --workers: 0 or a positive whole number.
int worker_count(const std::string& item) {
  char* end = nullptr;
  const long long n = std::strtoll(item.c_str(), &end, 10);
  FORGE_CHECK(!item.empty() && *end == '\0' && n >= 0 && n <= 4096,
              "--workers expects worker counts (0 or more, comma-separated), got '{}'", item);
  return static_cast<int>(n);
}

Args parse(int argc, char** argv) {
  Args a;
  bench::parse_bench_args(argc, argv,
                          {{"--recipe", &a.recipe},
                           {"--root", &a.root},
                           {"--out", &a.out},
                           {"--images", &a.images},
                           {"--batches", &a.batches},
                           {"--batch-size", &a.batch_size},
                           {"--set", [&](const std::string& v) { a.sets.push_back(v); }},
                           {"--workers",
                            [&](const std::string& v) {
                              a.workers.clear();
                              size_t start = 0;
                              while (start <= v.size()) {
                                const size_t comma = std::min(v.find(',', start), v.size());
                                a.workers.push_back(worker_count(v.substr(start, comma - start)));
                                start = comma + 1;
                              }
                            }},
                           {"--print-root", &a.print_root}});
  for (const auto& [option, n] :
       {std::pair{"--images", a.images}, std::pair{"--batches", a.batches},
        std::pair{"--batch-size", a.batch_size}})
    FORGE_CHECK(n >= 1, "{} expects a positive integer, got {}", option, n);
  return a;
}

// The synthetic set of `images` training pictures, generated once: written
// into a folder of its own, then renamed into place, so a folder found under
// the final name is complete.
std::string synthetic_root(int64_t images) {
  data::SyntheticImagesOptions o;
  o.classes = kClasses;
  o.train_per_class = (images + kClasses - 1) / kClasses;
  o.eval_per_class = 4;
  o.min_side = 300;
  o.max_side = 500;
  o.quality = 90;
  const char* cache = std::getenv("ATTNFORGE_CACHE");
  const fs::path base = cache && *cache ? fs::path(cache) : fs::path("/tmp");
  const fs::path dir =
      base / fmt::format("bench-loader-images-{}x{}-{}-{}-q{}-seed{}", o.classes, o.train_per_class,
                         o.min_side, o.max_side, o.quality, o.seed);
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return dir.string();
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  std::fprintf(stderr, "bench_loader: generating %lld JPEGs into %s\n",
               static_cast<long long>(o.classes * (o.train_per_class + o.eval_per_class)),
               dir.c_str());
  fs::remove_all(tmp, ec);
  data::write_synthetic_image_folder(tmp.string(), o);
  fs::rename(tmp, dir, ec);
  if (ec) {  // another process put its copy in place first
    fs::remove_all(tmp, ec);
    FORGE_CHECK(fs::is_directory(dir, ec), "bench_loader: cannot create {}", dir.string());
  }
  return dir.string();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one, five, fifteen;
  f >> one >> five >> fifteen;
  return one.empty() ? "unknown" : one + " " + five + " " + fifteen;
}

struct Measure {
  double images_per_s = 0;
  int64_t images = 0;
  double seconds = 0;
};

// One warm-up batch per worker (one in all without workers), then `batches`
// timed batches; epochs roll over when the set is small.
Measure time_loader(data::DataLoader& loader, int workers, int64_t batches) {
  data::Batch b;
  auto take = [&] {
    while (!loader.next(b)) {
    }
    return b.size;
  };
  for (int i = 0; i < std::max(1, workers); ++i) take();
  Measure m;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batches; ++i) m.images += take();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.images_per_s = static_cast<double>(m.images) / m.seconds;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    const std::string root = a.root.empty() ? synthetic_root(a.images) : a.root;
    if (a.print_root) {
      std::printf("%s\n", root.c_str());
      return 0;
    }
    train::Recipe recipe = train::Recipe::from_file(a.recipe);
    for (const std::string& s : a.sets) recipe.set(s);
    recipe.set("data.root=" + root);
    const train::TaskData data = train::build_data(recipe, "", true, [](const std::string& line) {
      std::fprintf(stderr, "%s\n", line.c_str());
    });
    const unsigned cores = std::thread::hardware_concurrency();
    const std::string load = load_average();

    std::FILE* json_out = stdout;
    if (!a.out.empty()) {
      json_out = std::fopen(a.out.c_str(), "w");
      FORGE_CHECK(json_out != nullptr, "bench_loader: cannot create {}", a.out);
    }
    std::vector<std::string> json_lines;
    std::printf("bench_loader: %s\n  %s\n  %u cores, load average %s (before the runs)\n",
                a.recipe.c_str(), data.train->describe().c_str(), cores, load.c_str());
    std::printf("%-10s %-6s %8s %6s %8s %10s\n", "loader", "mode", "workers", "batch", "images",
                "images/s");
    auto run = [&](bool train, int workers) {
      recipe.set(fmt::format("data.workers={}", workers));
      data::LoaderOptions lo = train::loader_options(recipe, data, train);
      lo.batch_size = a.batch_size;
      lo.drop_last = true;
      lo.epochs = 0;  // evaluation's loader stops its workers after one epoch; time many
      data::DataLoader loader(data.train, lo);
      const Measure m = time_loader(loader, workers, a.batches);
      std::printf("%-10s %-6s %8d %6lld %8lld %10.1f\n", "attnforge", train ? "train" : "eval",
                  workers, static_cast<long long>(a.batch_size), static_cast<long long>(m.images),
                  m.images_per_s);
      std::fflush(stdout);
      const json::Value line = json::Object{
          {"loader", "attnforge"},
          {"mode", train ? "train" : "eval"},
          {"workers", workers},
          {"images_per_s", m.images_per_s},
          {"batch_size", a.batch_size},
          {"batches", a.batches},
          {"images", m.images},
          {"seconds", m.seconds},
          {"cores", static_cast<int64_t>(cores)},
          {"load_average", load},
          {"root", root},
          {"recipe", a.recipe},
          {"batch_transform", lo.transform ? "mixup/cutmix" : "none"},
          {"transform", data.train->describe()},
      };
      json_lines.push_back(json::dump(line));
    };
    for (int w : a.workers) run(true, w);
    run(false, *std::max_element(a.workers.begin(), a.workers.end()));
    for (const std::string& line : json_lines) std::fprintf(json_out, "%s\n", line.c_str());
    if (json_out != stdout) std::fclose(json_out);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
