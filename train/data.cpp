// Recipe -> datasets (see data.h).
#include "train/data.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/file_io.h"
#include "core/safetensors.h"
#include "data/fashion_mnist.h"
#include "data/image_folder.h"
#include "data/listops.h"
#include "data/lm_text.h"
#include "data/mixup.h"
#include "data/pathfinder.h"
#include "data/pixel_sequence.h"
#include "data/seq2seq.h"
#include "data/subset.h"
#include "data/synthetic_images.h"
#include "data/text.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

data::DatasetPtr limit(data::DatasetPtr d, int64_t n) {
  if (n <= 0 || n >= d->size()) return d;
  return std::make_shared<data::Subset>(std::move(d), n);
}

data::DatasetPtr fashion_mnist(const Recipe& r, const std::string& split, bool train, bool raw) {
  data::FashionMnistOptions o;
  if (!r.string("data.root").empty()) o.root = r.string("data.root");
  FORGE_CHECK(split == "train" || split == "test",
              "recipe: Fashion-MNIST has the splits 'train' and 'test', not '{}' (data.train_split "
              "/ data.eval_split)",
              split);
  o.split = split;
  o.normalize = r.boolean("data.normalize") && !raw;
  const auto mean = r.number_list("data.mean"), std = r.number_list("data.std");
  FORGE_CHECK(mean.size() <= 1 && std.size() <= 1,
              "recipe: data.mean / data.std: Fashion-MNIST has one channel, give one value each");
  if (!mean.empty()) o.mean = mean[0];
  if (!std.empty()) o.std = std[0];
  if (train) {
    o.random_crop_padding = r.integer("data.random_crop_padding");
    o.hflip = r.boolean("data.hflip");
  }
  return std::make_shared<data::FashionMnist>(o);
}

// image_folder's transforms (train and eval); `raw`: grayscale values in [0, 1]
// for pixel sequences.
data::ImageTransformOptions image_folder_transform(const Recipe& r, bool raw) {
  data::ImageTransformOptions t;
  t.size = r.integer("model.image_size");
  t.scale_min = r.number("data.train_scale_min");
  t.hflip = r.number("data.hflip_prob");
  t.crop_pct = r.number("data.crop_pct");
  t.interpolation = data::interpolation_from_name(r.string("data.interpolation"));
  t.mean = r.number_list("data.mean");
  t.std = r.number_list("data.std");
  t.scaled_jpeg_decode = r.boolean("data.scaled_jpeg_decode");
  if (!r.string("data.auto_augment").empty()) {
    t.rand_augment = true;
    try {
      t.rand_augment_options = data::parse_rand_augment(r.string("data.auto_augment"));
    } catch (const Error& e) {
      FORGE_FAIL("recipe: data.auto_augment: {}", e.message());
    }
  }
  const auto jitter = r.number_list("data.color_jitter");
  FORGE_CHECK(jitter.size() <= 1 || jitter.size() == 3 || jitter.size() == 4,
              "recipe: data.color_jitter takes 1, 3 or 4 values ([brightness, contrast, "
              "saturation(, hue)]), got {}",
              jitter.size());
  for (double v : jitter)
    FORGE_CHECK(v >= 0, "recipe: data.color_jitter values must be >= 0, got {}", v);
  if (!jitter.empty()) {
    const auto at = [&](size_t k) { return jitter.size() == 1 ? jitter[0] : jitter[k]; };
    t.color_jitter = {at(0), at(1), at(2), jitter.size() == 4 ? jitter[3] : 0.0};
    FORGE_CHECK(t.color_jitter.hue <= 0.5, "recipe: data.color_jitter: hue must be <= 0.5, got {}",
                t.color_jitter.hue);
  }
  t.erasing.prob = r.number("data.erasing_prob");
  const std::string& mode = r.string("data.erasing_mode");
  t.erasing.mode = mode == "pixel"  ? data::EraseMode::pixel
                   : mode == "rand" ? data::EraseMode::rand
                                    : data::EraseMode::constant;
  t.erasing.max_count = static_cast<int>(r.integer("data.erasing_count"));
  if (raw) {
    t.grayscale = true;
    t.mean = {0.0};
    t.std = {1.0};
  } else if (!r.boolean("data.normalize")) {
    t.mean = {0.0};
    t.std = {1.0};
  }
  return t;
}

// Generated data (ListOps, Pathfinder) lives in one shared cache, one
// directory per generator and settings: CACHE/<generator>-<XXH3 of the
// settings>, with the settings in CACHE/.../settings.txt. Every run of the same
// settings reads the one copy. It is built in a directory of its own and
// renamed into place, so a directory there is complete, and processes that
// generate it at once (data-parallel ranks, parallel runs) agree on one copy.
std::string cached_generation(const std::string& generator, const std::string& settings,
                              const std::function<void(const std::string&)>& write,
                              const std::function<void(const std::string&)>& log) {
  const fs::path dir = fs::path(data_cache_dir()) /
                       fmt::format("{}-{}", generator, safetensors::checksum_hex(settings));
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    log(fmt::format("{}: generated data from the cache {}", generator, dir.string()));
    return dir.string();
  }
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  FORGE_CHECK(!ec, "data cache: cannot create {}: {} (set ATTNFORGE_CACHE to a writable folder)",
              tmp.string(), ec.message());
  log(fmt::format("{}: generating ({}) into the cache {}", generator, settings, dir.string()));
  try {
    write(tmp.string());
    io::write_file_atomic((tmp / "settings.txt").string(), settings + "\n");
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::rename(tmp, dir, ec);
  if (ec) {  // another process put its copy there first: the same data
    fs::remove_all(tmp, ec);
    FORGE_CHECK(fs::is_directory(dir, ec), "data cache: cannot move {} to {}", tmp.string(),
                dir.string());
  }
  return dir.string();
}

// ---- data.root or generated stand-ins ----

// What a source reads from data.root, and how to get it: said when the root is
// not given or not there.
struct RootHelp {
  std::string layout, get;
};

RootHelp root_help(const Recipe& r) {
  static const std::map<std::string, RootHelp> kHelp = {
      {"image_folder",
       {"a folder with one sub-folder per split (data.train_split, data.eval_split: train/ "
        "and val/), each with one folder of pictures per class (ImageNet: ILSVRC2012's "
        "train and val images, val sorted into the 1000 class folders of train)",
        "docs/USER_GUIDE.md, 'ImageNet-style training', says how to lay out ILSVRC2012's "
        "archives"}},
      {"pixels",
       {"LRA Image: a folder with train/, val/ and test/, one folder of pictures per class",
        "attnforge data image --from cifar-10-batches-bin (CIFAR-10's binary release) "
        "writes it to data/lra/image"}},
      {"listops",
       {"basic_train.tsv, basic_val.tsv and basic_test.tsv (LRA's listops-1000 folder)",
        "attnforge data listops --from lra_release/lra_release/listops-1000 (LRA's release "
        "archive, lra_release.gz) writes it to data/lra/listops"}},
      {"pathfinder",
       {"train/, val/ and test/, each in the layout of Linsley's generator (imgs/ and "
        "metadata/)",
        "attnforge data pathfinder --from "
        "lra_release/lra_release/pathfinder32/curv_contour_length_14 (LRA's release archive) "
        "splits it 80/10/10 into data/lra/pathfinder"}},
      {"text",
       {"train.tsv and test.tsv, one 'label<TAB>text' a line",
        "attnforge data text --from aclImdb (IMDb's release, aclImdb_v1.tar.gz) writes them "
        "to data/lra/text"}},
      {"retrieval",
       {"train.tsv, val.tsv and test.tsv, one 'label<TAB>text1<TAB>text2' (or LRA's AAN "
        "row) a line",
        "attnforge data retrieval --from lra_release/lra_release/tsv_data (LRA's release "
        "archive) writes them to data/lra/retrieval"}},
  };
  const auto it = kHelp.find(r.string("data.dataset"));
  return it != kHelp.end() ? it->second
                           : RootHelp{"the source's files", "docs/USER_GUIDE.md, 'Data'"};
}

bool can_generate(const Recipe& r) {
  const std::string& kind = r.string("data.dataset");
  return kind == "listops" || kind == "pathfinder" || kind == "image_folder" ||
         (kind == "pixels" && r.string("data.pixel_source") == "image_folder");
}

// The data.root of a source with real data, checked to be there; nullopt
// when the recipe asks for generated stand-ins (data.synthetic: true) instead.
std::optional<std::string> data_root(const Recipe& r) {
  const std::string& kind = r.string("data.dataset");
  if (r.boolean("data.synthetic")) {
    FORGE_CHECK(can_generate(r),
                "recipe: data.synthetic: data.dataset {} has no generated stand-in (listops, "
                "pathfinder and image_folder have); leave data.synthetic false",
                kind);
    return std::nullopt;
  }
  const std::string& root = r.string("data.root");
  const RootHelp help = root_help(r);
  const std::string stand_in =
      can_generate(r) ? "; to try the recipe on generated stand-in data instead (a smoke test, "
                        "not the task), --set data.synthetic=true"
                      : "";
  const std::string how = fmt::format("{}. To get it: {}{}", help.layout, help.get, stand_in);
  FORGE_CHECK(!root.empty(), "recipe: data.dataset {} needs data.root: {}", kind, how);
  std::error_code ec;
  FORGE_CHECK(fs::exists(root, ec), "recipe: data.root '{}' does not exist; data.dataset {} reads "
              "from it {}", root, kind, how);
  return root;
}

// Without data.root: pictures generated once into the cache (train/ and val/).
std::string image_folder_root(const Recipe& r, const std::function<void(const std::string&)>& log) {
  if (const auto root = data_root(r)) return *root;
  data::SyntheticImagesOptions g;
  g.classes = r.integer("data.generate_classes");
  g.train_per_class = std::max<int64_t>(1, r.integer("data.generate_train") / g.classes);
  g.eval_per_class = std::max<int64_t>(1, r.integer("data.generate_eval") / g.classes);
  g.seed = static_cast<uint64_t>(r.integer("seed"));
  const std::string settings = fmt::format(
      "synthetic images v1: {} classes, {} train and {} val per class, sides {}..{}, quality {}, "
      "seed {}",
      g.classes, g.train_per_class, g.eval_per_class, g.min_side, g.max_side, g.quality, g.seed);
  return cached_generation(
      "images", settings,
      [&](const std::string& dir) { data::write_synthetic_image_folder(dir, g); }, log);
}

data::DatasetPtr image_folder(const Recipe& r, const std::string& split, bool raw,
                              const std::function<void(const std::string&)>& log) {
  data::ImageFolderOptions o;
  o.root = (fs::path(image_folder_root(r, log)) / split).string();
  o.max_image_pixels = r.integer("data.max_image_pixels");
  o.transform = image_folder_transform(r, raw);
  return std::make_shared<data::ImageFolder>(o);
}

// ListOps: root/basic_<split>.tsv (LRA's names), generated when no root is given.
std::string listops_file(const Recipe& r, const std::string& split,
                         const std::function<void(const std::string&)>& log) {
  std::string root = data_root(r).value_or("");
  if (root.empty()) {
    data::ListOpsGenConfig g;
    g.num_train = r.integer("data.generate_train");
    g.num_val = g.num_test = r.integer("data.generate_eval");
    g.min_length = r.integer("data.generate_min_length");
    g.max_length = r.integer("data.generate_max_length");
    const uint64_t seed = static_cast<uint64_t>(r.integer("seed"));
    const std::string settings =
        fmt::format("listops v1: {} train, {} val, {} test; lengths in ({}, {}); seed {}",
                    g.num_train, g.num_val, g.num_test, g.min_length, g.max_length, seed);
    root = cached_generation(
        "listops", settings,
        [&](const std::string& dir) {
          data::write_listops_splits(dir, data::generate_listops(g, seed));
        },
        log);
  }
  return (fs::path(root) / ("basic_" + split + ".tsv")).string();
}

// Pathfinder: root/<split> in the LRA layout, generated when no root is given.
std::string pathfinder_dir(const Recipe& r, const std::string& split,
                           const std::function<void(const std::string&)>& log) {
  std::string root = data_root(r).value_or("");
  if (root.empty()) {
    const std::vector<std::pair<std::string, int64_t>> splits = {
        {"train", r.integer("data.generate_train")},
        {"val", r.integer("data.generate_eval")},
        {"test", r.integer("data.generate_eval")}};
    const uint64_t seed = static_cast<uint64_t>(r.integer("seed"));
    const std::string settings =
        fmt::format("pathfinder v1: {} train, {} val, {} test; default generator; seed {}",
                    splits[0].second, splits[1].second, splits[2].second, seed);
    root = cached_generation(
        "pathfinder", settings,
        [&](const std::string& dir) {
          for (size_t i = 0; i < splits.size(); ++i)
            data::write_pathfinder(
                (fs::path(dir) / splits[i].first).string(),
                data::generate_pathfinder(data::PathfinderGenConfig{}, splits[i].second,
                                          data::Rng::mix({seed, 77, i})));
        },
        log);
  }
  return (fs::path(root) / split).string();
}

data::LmSplit lm_split(const std::string& split) {
  for (data::LmSplit s : {data::LmSplit::train, data::LmSplit::valid, data::LmSplit::test})
    if (split == data::lm_split_name(s)) return s;
  FORGE_FAIL(
      "recipe: lm_text has the splits 'train', 'valid' and 'test', not '{}' "
      "(data.train_split / data.eval_split)",
      split);
}

data::LmSplitPoints lm_split_points(const Recipe& r) {
  data::LmSplitPoints p;
  const auto bytes = r.int_list("data.split_bytes");
  const auto fractions = r.number_list("data.split_fractions");
  FORGE_CHECK(bytes.empty() || fractions.empty(),
              "recipe: data.split_bytes and data.split_fractions both set; give the split ends one "
              "way");
  FORGE_CHECK(bytes.empty() || bytes.size() == 3,
              "recipe: data.split_bytes has {} values; give the ends of train, valid and test, "
              "e.g. [90000000, 95000000, 100000000]",
              bytes.size());
  FORGE_CHECK(fractions.empty() || fractions.size() == 3,
              "recipe: data.split_fractions has {} values; give the ends of train, valid and test "
              "as fractions of the corpus, e.g. [0.9, 0.95, 1.0]",
              fractions.size());
  if (bytes.size() == 3) {
    p.train_end = bytes[0];
    p.valid_end = bytes[1];
    p.test_end = bytes[2];
  }
  if (fractions.size() == 3) {
    for (double f : fractions)
      FORGE_CHECK(f > 0 && f <= 1, "recipe: data.split_fractions: {} is not in (0, 1]", f);
    p.train_end_fraction = fractions[0];
    p.valid_end_fraction = fractions[1];
    p.test_end_fraction = fractions[2];
  }
  return p;
}

// Seq2seq TSV: root/<split>.tsv or root/<split>.tsv.gz.
std::string tsv_file(const Recipe& r, const std::string& split) {
  FORGE_CHECK(!r.string("data.root").empty(),
              "recipe: data.dataset seq2seq_tsv needs data.root (a folder with <split>.tsv files "
              "of source<TAB>target lines)");
  const fs::path plain = fs::path(r.string("data.root")) / (split + ".tsv");
  const fs::path gz = fs::path(plain.string() + ".gz");
  return (!fs::exists(plain) && fs::exists(gz) ? gz : plain).string();
}

// Example 0 of `d`, for the data's shape; `role` names the split in errors.
data::Example first_example(const data::Dataset& d, const char* role) {
  FORGE_CHECK(d.size() > 0, "data: the {} split ({}) has no examples; check the data source", role,
              d.describe());
  return d.get(0, nullptr);
}

}  // namespace

DataShape next_token_shape(const Recipe& r) {
  DataShape shape;
  shape.images = false;
  const std::string& kind = r.string("data.dataset");
  if (kind == "lm_text") {
    shape.task = Task::language_model;
    shape.vocab_size = data::kLmVocabSize;
    shape.max_length = r.integer("data.seq_len");
    shape.byte_tokens = true;
  } else if (kind == "copy") {
    shape.task = Task::seq2seq;
    shape.vocab_size = shape.target_vocab_size = r.integer("data.copy_vocab");
    shape.max_length = r.integer("data.copy_length");
    shape.target_length = 2 * shape.max_length;
  } else if (kind == "seq2seq_tsv") {
    const data::Seq2SeqTsvOptions d;
    shape.task = Task::seq2seq;
    shape.vocab_size = shape.target_vocab_size = data::kSeq2SeqByteVocabSize;
    shape.max_length =
        r.integer("data.max_length") > 0 ? r.integer("data.max_length") : d.max_source_length;
    shape.target_length = r.integer("data.max_target_length") > 0
                              ? r.integer("data.max_target_length")
                              : d.max_target_length;
  } else {
    FORGE_FAIL(
        "recipe: data.dataset {} gives classification data, not next-token sequences "
        "(lm_text, copy, seq2seq_tsv)",
        kind);
  }
  return shape;
}

data::ImageTransformOptions eval_image_transform(const Recipe& r) {
  const std::string& kind = r.string("data.dataset");
  const bool raw = kind == "pixels" || kind == "pathfinder";
  const std::string source = kind == "pixels" ? r.string("data.pixel_source") : kind;
  data::ImageTransformOptions t;
  if (source == "image_folder") {
    t = image_folder_transform(r, raw);
    if (raw) t.size = std::llround(std::sqrt(static_cast<double>(r.integer("model.max_len"))));
  } else {
    FORGE_CHECK(source == "fashion_mnist" || source == "pathfinder",
                "recipe: data.dataset {} does not take images", kind);
    // Fashion-MNIST and Pathfinder images are used as they are: gray, their
    // own size (a picture of another size is resized to it), scaled to [0, 1]
    // and, for Fashion-MNIST, normalised.
    const data::FashionMnistOptions defaults;
    t.size = r.integer("model.image_size");
    if (raw) {  // a sequence of side * side pixels
      const int64_t n = r.integer("model.max_len");
      t.size = std::llround(std::sqrt(static_cast<double>(n)));
      FORGE_CHECK(n > 0 && t.size * t.size == n,
                  "recipe: model.max_len = {} is not the pixel count of a square image", n);
    }
    t.crop_pct = 1.0;
    t.grayscale = true;
    const auto mean = r.number_list("data.mean"), std = r.number_list("data.std");
    const bool normalise = source == "fashion_mnist" && !raw && r.boolean("data.normalize");
    t.mean = {normalise ? (mean.empty() ? defaults.mean : mean[0]) : 0.0};
    t.std = {normalise ? (std.empty() ? defaults.std : std[0]) : 1.0};
  }
  t.train = false;
  return t;
}

std::string data_cache_dir() {
  if (const char* c = std::getenv("ATTNFORGE_CACHE"); c && *c) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "attnforge").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "attnforge").string();
  return ".attnforge-cache";
}

TaskData build_data(const Recipe& r, const std::string& split_arg, bool open_train,
                    const std::function<void(const std::string&)>& log) {
  TaskData t;
  const std::string& kind = r.string("data.dataset");
  const std::string train_split = r.string("data.train_split");
  const std::string eval_split = split_arg.empty() ? r.string("data.eval_split") : split_arg;
  int64_t max_length = r.integer("data.max_length");
  std::shared_ptr<const data::LmCorpus> corpus;  // lm_text: read once for both splits

  auto open = [&](const std::string& split, bool train) -> data::DatasetPtr {
    if (kind == "lm_text") {
      FORGE_CHECK(!r.string("data.root").empty(),
                  "recipe: data.dataset lm_text needs data.root (a text file, or a folder of "
                  "them; .gz files are read too)");
      const data::LmSplit s = lm_split(split);
      if (!corpus) {
        data::LmFilesOptions f;
        const auto include = r.string_list("data.include");
        if (!include.empty()) f.include = include;
        f.exclude = r.string_list("data.exclude");
        corpus = data::read_lm_corpus(r.string("data.root"), f);
      }
      data::LmTextOptions o;
      o.seq_len = r.integer("data.seq_len");
      o.splits = lm_split_points(r);
      o.random_windows = train;
      return std::make_shared<data::LmText>(corpus, s, o);
    }
    if (kind == "copy") {
      data::CopyTaskOptions o;
      o.length = r.integer("data.copy_length");
      o.vocab_size = r.integer("data.copy_vocab");
      o.size = r.integer(train ? "data.generate_train" : "data.generate_eval");
      // Each split's evaluation view is its own fixed set.
      const uint64_t which = split == "train" ? 0 : split == "test" ? 2 : 1;
      o.eval_seed = data::Rng::mix({static_cast<uint64_t>(r.integer("seed")), 78, which});
      return std::make_shared<data::CopyTask>(o);
    }
    if (kind == "seq2seq_tsv") {
      data::Seq2SeqTsvOptions o;
      if (max_length > 0) o.max_source_length = max_length;
      if (r.integer("data.max_target_length") > 0)
        o.max_target_length = r.integer("data.max_target_length");
      return std::make_shared<data::Seq2SeqTsv>(tsv_file(r, split), o);
    }
    if (kind == "fashion_mnist") return fashion_mnist(r, split, train, false);
    if (kind == "image_folder") return image_folder(r, split, false, log);
    if (kind == "pixels") {
      data::DatasetPtr images = r.string("data.pixel_source") == "fashion_mnist"
                                    ? fashion_mnist(r, split, train, true)
                                    : image_folder(r, split, true, log);
      return std::make_shared<data::PixelSequence>(images);
    }
    if (kind == "listops") {
      data::ListOpsOptions o;
      if (max_length > 0) o.max_length = max_length;
      return std::make_shared<data::ListOps>(listops_file(r, split, log), o);
    }
    if (kind == "text" || kind == "retrieval") {
      data::TextOptions o;
      if (max_length > 0) o.max_length = max_length;
      const std::string file = (fs::path(*data_root(r)) / (split + ".tsv")).string();
      if (kind == "text") return std::make_shared<data::TextClassification>(file, o);
      return std::make_shared<data::TextPairs>(file, o);
    }
    if (kind == "pathfinder")
      return std::make_shared<data::PixelSequence>(std::make_shared<data::Pathfinder>(
          pathfinder_dir(r, split, log), r.integer("data.max_image_pixels")));
    FORGE_FAIL("recipe: data.dataset '{}' is not handled", kind);
  };

  if (open_train) {
    t.train = limit(open(train_split, true), r.integer("data.limit_train"));
    log(fmt::format("train: {}", t.train->describe()));
  }
  t.eval = limit(open(eval_split, false), r.integer("data.limit_eval"));
  log(fmt::format("eval ({}): {}", eval_split, t.eval->describe()));

  // What the model needs to know: from the first example and the source. The
  // model is built for the eval split's shape, so the training split's first
  // example must have it too (images [C, H, W], pixel sequences [H * W]).
  const data::Example e = first_example(*t.eval, "evaluation");
  if (t.train) {
    const data::Example et = first_example(*t.train, "training");
    const bool fixed_shape =
        e.input.dtype() == DType::f32 || kind == "pixels" || kind == "pathfinder";
    FORGE_CHECK(et.input.dtype() == e.input.dtype() &&
                    (!fixed_shape || et.input.shape() == e.input.shape()),
                "data: the training split's examples are {} {} ({}) but the evaluation split's "
                "are {} {} ({}); both splits must have examples of one shape: use splits of the "
                "same image size (data.root, data.train_split, data.eval_split)",
                dtype_name(et.input.dtype()), shape_str(et.input.shape()), t.train->describe(),
                dtype_name(e.input.dtype()), shape_str(e.input.shape()), t.eval->describe());
  }
  t.shape.classes = (t.train ? t.train : t.eval)->num_classes();
  t.shape.images = e.input.dtype() == DType::f32 && e.input.dim() == 3;
  if (e.target.defined()) {
    t.shape = next_token_shape(r);
  } else if (t.shape.images) {
    t.shape.channels = e.input.size(0);
    t.shape.image_size = e.input.size(1);
    FORGE_CHECK(e.input.size(1) == e.input.size(2), "data: images must be square, got {}x{}",
                e.input.size(1), e.input.size(2));
  } else {
    t.shape.pairs = e.input2.defined();
    if (kind == "listops")
      t.shape.vocab_size = data::kListOpsVocabSize;
    else if (kind == "text" || kind == "retrieval")
      t.shape.vocab_size = data::kByteVocabSize;
    else
      t.shape.vocab_size = data::PixelSequence::kVocabSize;
    if (max_length <= 0) {
      if (kind == "listops")
        max_length = 2000;
      else if (kind == "text" || kind == "retrieval")
        max_length = 4000;
      else
        max_length = e.input.size(0);  // pixels: H * W
    }
    t.shape.max_length = max_length;
  }
  t.mixup.mixup_alpha = r.number("data.mixup_alpha");
  t.mixup.cutmix_alpha = r.number("data.cutmix_alpha");
  t.mixup.prob = r.number("data.mix_prob");
  t.mixup.switch_prob = r.number("data.mix_switch_prob");
  FORGE_CHECK(t.shape.images || (t.mixup.mixup_alpha == 0 && t.mixup.cutmix_alpha == 0),
              "recipe: data.mixup_alpha / data.cutmix_alpha apply to images only; data.dataset {} "
              "gives token sequences",
              kind);
  return t;
}

data::LoaderOptions loader_options(const Recipe& r, const TaskData& d, bool train) {
  data::LoaderOptions o;
  o.batch_size = train || r.integer("loop.eval_batch_size") == 0
                     ? r.integer("loop.batch_size")
                     : r.integer("loop.eval_batch_size");
  o.shuffle = train;
  o.drop_last = train;
  o.seed = static_cast<uint64_t>(r.integer("seed"));
  o.workers = static_cast<int>(r.integer("data.workers"));
  o.prefetch = static_cast<int>(r.integer("data.prefetch"));
  o.pad_id = 0;
  o.pad_to = !d.shape.images && r.boolean("data.pad_to_max") ? d.shape.max_length : 0;
  o.augment = train;
  o.epochs = train ? 0 : 1;  // evaluation reads epoch 0 only
  FORGE_CHECK(d.shape.images || r.integer("data.repeated_augmentation") == 1,
              "recipe: data.repeated_augmentation applies to images only; data.dataset {} gives "
              "token sequences",
              r.string("data.dataset"));
  if (train) o.repeats = r.integer("data.repeated_augmentation");
  if (train && (d.mixup.mixup_alpha > 0 || d.mixup.cutmix_alpha > 0))
    o.transform = data::make_mixup(d.mixup);
  return o;
}

}  // namespace forge::train
