// Long Range Arena's data from the public releases (see lra_release.h).
#include "data/lra_release.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/file_io.h"
#include "data/image_folder.h"
#include "data/image_io.h"
#include "data/listops.h"
#include "data/pathfinder.h"
#include "data/text.h"

namespace forge::data {

namespace fs = std::filesystem;

namespace {

// The first of `candidates` (relative to `from`) holding `marker`; an error
// naming what was looked for otherwise.
fs::path find_release_dir(const std::string& from, const std::vector<std::string>& candidates,
                          const std::string& marker, const std::string& what) {
  std::error_code ec;
  FORGE_CHECK(fs::is_directory(from, ec), "data: --from {}: no such folder", from);
  std::vector<std::string> tried;
  for (const std::string& c : candidates) {
    const fs::path dir = c.empty() ? fs::path(from) : fs::path(from) / c;
    if (fs::exists(dir / marker, ec)) return dir;
    tried.push_back((dir / marker).string());
  }
  FORGE_FAIL("data: {} does not hold {}: looked for {}", from, what, fmt::join(tried, ", "));
}

void copy_release_file(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, ec);
  FORGE_CHECK(!ec, "data: cannot copy {} to {}: {}", from.string(), to.string(), ec.message());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  FORGE_CHECK(out, "data: cannot write {}", path.string());
}

// ListOps: LRA's three TSVs, each read by the ListOps reader, copied as they are.
void prepare_listops(const std::string& from, const fs::path& out, PreparedLra& p) {
  const fs::path dir = find_release_dir(
      from, {"", "listops-1000", "lra_release/listops-1000", "lra_release/lra_release/listops-1000"},
      "basic_train.tsv", "LRA's ListOps files (basic_train.tsv, basic_val.tsv, basic_test.tsv)");
  p.from = dir.string();
  for (const char* split : {"train", "val", "test"}) {
    const fs::path file = dir / fmt::format("basic_{}.tsv", split);
    p.examples.emplace_back(split, static_cast<int64_t>(read_listops_tsv(file.string()).size()));
    copy_release_file(file, out / file.filename());
  }
}

// IMDb: <split>/{neg,pos}/<id>_<rating>.txt, label 0 / 1, in order of the id.
void prepare_text(const std::string& from, const fs::path& out, PreparedLra& p) {
  const fs::path dir = find_release_dir(from, {"", "aclImdb"}, "train/pos",
                                        "IMDb's reviews (aclImdb/train/pos, .../neg, test/...)");
  p.from = dir.string();
  int64_t line_breaks = 0;
  for (const char* split : {"train", "test"}) {
    std::string tsv;
    int64_t count = 0;
    for (const auto& [label, folder] : {std::pair{0, "neg"}, std::pair{1, "pos"}}) {
      const fs::path d = dir / split / folder;
      std::error_code ec;
      FORGE_CHECK(fs::is_directory(d, ec), "data: {} is missing (aclImdb's layout: {}/{{neg,pos}})",
                  d.string(), split);
      std::vector<std::pair<uint64_t, fs::path>> files;
      for (const fs::directory_entry& e : fs::directory_iterator(d)) {
        if (e.path().extension() != ".txt") continue;
        const std::string stem = e.path().stem().string();
        const std::string id = stem.substr(0, stem.find('_'));
        FORGE_CHECK(!id.empty() && id.size() <= 18 &&
                        id.find_first_not_of("0123456789") == std::string::npos,
                    "data: {}: expected aclImdb's file names <id>_<rating>.txt", e.path().string());
        files.emplace_back(std::stoull(id), e.path());
      }
      FORGE_CHECK(!files.empty(), "data: {} holds no reviews (*.txt)", d.string());
      std::sort(files.begin(), files.end());
      for (const auto& [id, path] : files) {
        std::string review = io::read_file(path.string());
        for (char& c : review)
          if (c == '\n' || c == '\r') {
            c = ' ';
            ++line_breaks;
          }
        tsv += fmt::format("{}\t{}\n", label, review);
        ++count;
      }
    }
    const fs::path file = out / fmt::format("{}.tsv", split);
    write_text(file, tsv);
    const TextClassification check(file.string());
    FORGE_CHECK(check.size() == count, "data: {} reads back {} reviews of {}", file.string(),
                check.size(), count);
    p.examples.emplace_back(split, count);
  }
  if (line_breaks > 0)
    p.notes.push_back(fmt::format(
        "{} line breaks inside reviews were written as spaces (a TSV line holds one review)",
        line_breaks));
}

// AAN: LRA's new_aan_pairs.{train,eval,test}.tsv, read by the pairs reader,
// copied as they are (eval becomes val).
void prepare_retrieval(const std::string& from, const fs::path& out, PreparedLra& p) {
  const fs::path dir =
      find_release_dir(from, {"", "tsv_data", "lra_release/tsv_data", "lra_release/lra_release/tsv_data"},
                       "new_aan_pairs.train.tsv", "LRA's AAN pairs (new_aan_pairs.*.tsv)");
  p.from = dir.string();
  for (const auto& [theirs, ours] :
       {std::pair{"train", "train"}, std::pair{"eval", "val"}, std::pair{"test", "test"}}) {
    const fs::path file = dir / fmt::format("new_aan_pairs.{}.tsv", theirs);
    p.examples.emplace_back(ours, TextPairs(file.string()).size());
    copy_release_file(file, out / fmt::format("{}.tsv", ours));
  }
}

// CIFAR-10 binary: records of a label byte and 32 x 32 red, green and blue planes.
void prepare_image(const std::string& from, const fs::path& out, PreparedLra& p) {
  const fs::path dir = find_release_dir(from, {"", "cifar-10-batches-bin"}, "data_batch_1.bin",
                                        "CIFAR-10's binary batches (cifar-10-batches-bin)");
  p.from = dir.string();
  std::vector<std::string> names;
  {
    std::ifstream in(dir / "batches.meta.txt");
    FORGE_CHECK(in, "data: cannot open {} (the class names)", (dir / "batches.meta.txt").string());
    std::string line;
    while (std::getline(in, line)) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (!line.empty()) names.push_back(line);
    }
  }
  FORGE_CHECK(names.size() == 10, "data: {} names {} classes; CIFAR-10 has 10",
              (dir / "batches.meta.txt").string(), names.size());
  constexpr int64_t kSide = 32, kRecord = 1 + 3 * kSide * kSide;
  // Every record of the given batch files, in order.
  const auto read_batches = [&](const std::vector<std::string>& files) {
    std::string all;
    for (const std::string& f : files) {
      const std::string bytes = io::read_file((dir / f).string());
      // The release's batches hold 10000 records; any whole number is taken.
      FORGE_CHECK(!bytes.empty() && static_cast<int64_t>(bytes.size()) % kRecord == 0,
                  "data: {} has {} bytes, not a whole number of CIFAR-10 records ({} bytes: a "
                  "label and 32 x 32 x 3 pixels; the release's batches hold 10000)",
                  (dir / f).string(), bytes.size(), kRecord);
      all += bytes;
    }
    return all;
  };
  const auto write_split = [&](const std::string& split, const std::string& records, int64_t begin,
                               int64_t end) {
    for (const std::string& n : names) fs::create_directories(out / split / n);
    for (int64_t i = begin; i < end; ++i) {
      const auto* r = reinterpret_cast<const uint8_t*>(records.data()) + i * kRecord;
      FORGE_CHECK(r[0] < 10, "data: CIFAR-10 record {} of {} has label {}", i, split,
                  static_cast<int>(r[0]));
      Image img{kSide, kSide, 3, std::vector<uint8_t>(3 * kSide * kSide)};
      for (int64_t px = 0; px < kSide * kSide; ++px)
        for (int64_t c = 0; c < 3; ++c)
          img.pixels[static_cast<size_t>(px * 3 + c)] = r[1 + c * kSide * kSide + px];
      write_png((out / split / names[r[0]] / fmt::format("{:05d}.png", i - begin)).string(), img);
    }
    ImageFolderOptions o;
    o.root = (out / split).string();
    p.examples.emplace_back(split, ImageFolder(o).size());
  };
  const std::string train = read_batches({"data_batch_1.bin", "data_batch_2.bin",
                                          "data_batch_3.bin", "data_batch_4.bin",
                                          "data_batch_5.bin"});
  const int64_t n = static_cast<int64_t>(train.size()) / kRecord, n_train = n * 9 / 10;
  write_split("train", train, 0, n_train);
  write_split("val", train, n_train, n);
  const std::string test = read_batches({"test_batch.bin"});
  write_split("test", test, 0, static_cast<int64_t>(test.size()) / kRecord);
}

// Pathfinder: the metadata lines in reading order, 80% / 10% / 10%, each split
// a metadata file of its own beside a link to the release's images.
void prepare_pathfinder(const std::string& from, const fs::path& out, PreparedLra& p) {
  const fs::path dir = find_release_dir(
      from,
      {"", "curv_contour_length_14", "pathfinder32/curv_contour_length_14",
       "lra_release/pathfinder32/curv_contour_length_14",
       "lra_release/lra_release/pathfinder32/curv_contour_length_14"},
      "metadata", "Pathfinder's layout (imgs/ and metadata/*.npy; e.g. pathfinder32/curv_contour_length_14)");
  p.from = dir.string();
  std::vector<std::string> lines;
  for (const std::string& meta : pathfinder_metadata_files(dir.string())) {
    std::ifstream in(meta, std::ios::binary);
    FORGE_CHECK(in, "data: cannot open {}", meta);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(' ') != std::string::npos) lines.push_back(line);
    }
  }
  FORGE_CHECK(lines.size() >= 10, "data: {} names {} images; too few to split 80/10/10",
              dir.string(), lines.size());
  // Image folders named by the lines (field 0), each linked into every split.
  std::vector<std::string> folders;
  for (const std::string& line : lines) {
    const size_t start = line.find_first_not_of(' ');
    const std::string folder = line.substr(start, line.find(' ', start) - start);
    const std::string top = fs::path(folder).begin()->string();
    FORGE_CHECK(top != ".." && !fs::path(folder).is_absolute(),
                "data: {}: the image folder '{}' is outside the release folder", dir.string(),
                folder);
    if (std::find(folders.begin(), folders.end(), top) == folders.end()) folders.push_back(top);
  }
  const int64_t n = static_cast<int64_t>(lines.size());
  const std::array<std::pair<const char*, std::pair<int64_t, int64_t>>, 3> splits = {
      {{"train", {0, n * 8 / 10}}, {"val", {n * 8 / 10, n * 9 / 10}}, {"test", {n * 9 / 10, n}}}};
  for (const auto& [split, range] : splits) {
    const fs::path root = out / split;
    fs::create_directories(root / "metadata");
    for (const std::string& f : folders) {
      std::error_code ec;
      fs::create_directory_symlink(fs::absolute(dir / f), root / f, ec);
      FORGE_CHECK(!ec, "data: cannot link {} to {}: {}", (root / f).string(),
                  fs::absolute(dir / f).string(), ec.message());
    }
    std::string text;
    for (int64_t i = range.first; i < range.second; ++i) text += lines[static_cast<size_t>(i)] + "\n";
    write_text(root / "metadata" / "0.npy", text);
    int64_t skipped = 0;
    p.examples.emplace_back(split,
                            static_cast<int64_t>(read_pathfinder(root.string(), &skipped).size()));
    if (skipped > 0)
      p.notes.push_back(fmt::format("{}: {} empty images are left out (as LRA's pipeline does)",
                                    split, skipped));
  }
  p.notes.push_back(fmt::format("the splits' imgs links point into {}: keep it there",
                                fs::absolute(dir).string()));
}

}  // namespace

std::string lra_default_dir(LraTask task) {
  return (fs::path("data") / "lra" / lra_task_name(task)).string();
}

PreparedLra prepare_lra(LraTask task, const std::string& from, const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec))
    FORGE_CHECK(fs::is_directory(out, ec) && fs::is_empty(out, ec),
                "data: {} already exists and is not an empty folder; nothing was written (give "
                "another --out, or remove it)",
                out);
  const fs::path target = fs::absolute(out);
  const fs::path tmp = target.string() + fmt::format(".tmp-{}", ::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  FORGE_CHECK(!ec, "data: cannot create {}: {}", tmp.string(), ec.message());
  PreparedLra p;
  try {
    switch (task) {
      case LraTask::listops: prepare_listops(from, tmp, p); break;
      case LraTask::text: prepare_text(from, tmp, p); break;
      case LraTask::retrieval: prepare_retrieval(from, tmp, p); break;
      case LraTask::image: prepare_image(from, tmp, p); break;
      case LraTask::pathfinder: prepare_pathfinder(from, tmp, p); break;
    }
    fs::remove(target, ec);  // an empty folder, or nothing
    fs::rename(tmp, target, ec);
    FORGE_CHECK(!ec, "data: cannot move {} to {}: {}", tmp.string(), target.string(),
                ec.message());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return p;
}

}  // namespace forge::data
