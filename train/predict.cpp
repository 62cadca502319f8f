// attnforge predict (see predict.h).
#include "train/predict.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "core/file_io.h"
#include "data/idx.h"
#include "data/image_io.h"
#include "data/listops.h"
#include "data/loader.h"
#include "data/pixel_sequence.h"
#include "data/text.h"
#include "data/tsv_inputs.h"
#include "ops/ops.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/model.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

// Prepared examples as a dataset (label 0: unknown), for the loader's collation.
class Inputs : public data::Dataset {
 public:
  Inputs(const PreparedInputs& in, int64_t classes) : in_(in), classes_(classes) {}
  int64_t size() const override { return static_cast<int64_t>(in_.examples.size()); }
  data::Example get(int64_t i, data::Rng*) const override {
    return in_.examples[static_cast<size_t>(i)];
  }
  int64_t num_classes() const override { return classes_; }
  std::string describe() const override { return fmt::format("{} inputs", in_.examples.size()); }

 private:
  const PreparedInputs& in_;
  int64_t classes_;
};

bool has_extension(const std::string& path, std::initializer_list<const char*> exts) {
  std::string e = fs::path(path).extension().string();
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* x : exts)
    if (e == x) return true;
  return false;
}

// An IDX file by its content: 00 00 08 (u8), and 3 dims, or gzip.
bool looks_like_idx(const std::string& path) {
  char head[4] = {};
  std::ifstream(path, std::ios::binary).read(head, 4);
  return (head[0] == 0 && head[1] == 0 && head[2] == 8) ||
         (static_cast<unsigned char>(head[0]) == 0x1f &&
          static_cast<unsigned char>(head[1]) == 0x8b && !has_extension(path, {".tsv", ".txt"}));
}

// What the model takes and how a picture or a text line becomes it.
struct Preparer {
  bool images = false;  // [C, S, S] pictures; else token sequences
  bool pixels = false;  // token sequences of pixels
  bool pairs = false;
  std::string kind;  // data.dataset
  int64_t max_length = 0;
  data::ImageTransformOptions transform;

  Tensor picture(const data::Image& img) const {
    const Tensor x = data::transform_image(img, transform, nullptr);
    return pixels ? data::PixelSequence::tokens(x) : x;
  }
  Tensor text(const std::string& s, const std::string& where) const {
    if (kind == "listops") {
      const std::vector<uint8_t> ids = data::listops_tokenize(s, where);
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()), max_length);
      Tensor t = Tensor::empty({n}, DType::i64);
      for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = ids[static_cast<size_t>(i)];
      return t;
    }
    return data::byte_tokens(s, max_length);
  }
};

void read_inputs(const std::string& path, const Preparer& p, int64_t max_pixels,
                 PreparedInputs& out) {
  std::error_code ec;
  FORGE_CHECK(!fs::is_directory(path, ec),
              "predict: input {}: a directory; give the files in it (pictures, IDX or TSV files), "
              "e.g. {}/*.png",
              path, fs::path(path).lexically_normal().string());
  FORGE_CHECK(fs::is_regular_file(path, ec), "predict: input {}: no such file", path);
  const auto add = [&](data::Example e, std::string name) {
    out.examples.push_back(std::move(e));
    out.names.push_back(std::move(name));
  };
  if (p.images || p.pixels) {
    if (looks_like_idx(path)) {
      const data::IdxArray a = data::read_idx(path);
      FORGE_CHECK(a.dims.size() == 3,
                  "predict: {}: an IDX file of images is [N, H, W]; this one is {} dimensional",
                  path, a.dims.size());
      const int64_t n = a.dims[0], h = a.dims[1], w = a.dims[2];
      for (int64_t i = 0; i < n; ++i) {
        data::Image img;
        img.height = h;
        img.width = w;
        img.channels = 1;
        img.pixels.assign(a.data.begin() + i * h * w, a.data.begin() + (i + 1) * h * w);
        data::Example e;
        e.input = p.picture(img);
        add(std::move(e), fmt::format("{}#{}", path, i));
      }
      return;
    }
    FORGE_CHECK(has_extension(path, {".png", ".jpg", ".jpeg"}),
                "predict: input {}: the model takes pictures: give PNG or JPEG files, or IDX "
                "files of u8 images [N, H, W]",
                path);
    // As evaluation reads image files (a large JPEG decoded at a reduced scale).
    data::Example e;
    const Tensor x = data::transform_image_file(data::read_image_bytes(path), path, p.transform,
                                                nullptr, max_pixels);
    e.input = p.pixels ? data::PixelSequence::tokens(x) : x;
    add(std::move(e), path);
    return;
  }
  FORGE_CHECK(!has_extension(path, {".png", ".jpg", ".jpeg"}) && !looks_like_idx(path),
              "predict: input {}: the model takes token sequences: give TSV files (one example a "
              "line, in the training data's layout)",
              path);
  const data::TsvLayout layout = p.pairs              ? data::TsvLayout::pairs
                                 : p.kind == "listops" ? data::TsvLayout::listops
                                                       : data::TsvLayout::text;
  for (const data::TsvInput& in :
       data::parse_tsv_inputs(io::read_file(path, size_t{1} << 30), path, layout)) {
    data::Example e;
    e.input = p.text(in.text, in.where);
    if (layout == data::TsvLayout::pairs) e.input2 = p.text(in.text2, in.where);
    FORGE_CHECK(e.input.numel() > 0, "predict: {}: the text makes no tokens", in.where);
    add(std::move(e), in.where);
  }
}

}  // namespace

Classifier load_classifier(const std::string& checkpoint, const std::vector<std::string>& overrides,
                           const std::string& what, bool ema) {
  Classifier m;
  const CheckpointRef ref = resolve_checkpoint(checkpoint, what);
  m.checkpoint = ref.dir;
  const Checkpoint c = read_checkpoint(ref.dir);
  m.recipe = Recipe::from_yaml(c.recipe_yaml, ref.dir + "/model.safetensors (recipe)");
  Recipe& r = m.recipe;
  for (const std::string& s : overrides) r.set(s);
  const std::string& type = r.string("model.type");
  FORGE_CHECK(type == "vit" || type == "sequence_classifier",
              "{}: {} holds a {} model; {} runs classifiers (vit, sequence_classifier); a language "
              "model or an encoder-decoder continues a text with attnforge generate",
              what, ref.dir, type, what);
  // What the model was built for: the resolved recipe says it; a checkpoint
  // written before recipes were resolved asks the data.
  DataShape& shape = m.shape;
  shape.images = type == "vit";
  shape.classes = r.integer("model.classes");
  shape.channels = r.integer("model.channels");
  shape.image_size = r.integer("model.image_size");
  shape.vocab_size = r.integer("model.vocab_size");
  shape.max_length = r.integer("model.max_len");
  shape.pairs = r.boolean("model.dual_encoder");
  if (shape.classes == 0 || (shape.images ? shape.channels == 0 : shape.max_length == 0)) {
    shape = build_data(r, "", false, [](const std::string&) {}).shape;
    resolve_sizes(r, shape);
  }
  if (!shape.images && r.integer("data.max_length") > 0)
    shape.max_length = std::min(shape.max_length, r.integer("data.max_length"));
  m.place = placement(r);
  m.task =
      build_trained_model(r, shape, m.place, checkpoint_weights(c, ema, what + " --ema " + ref.dir),
                          what + ": " + ref.dir);
  m.task->module().eval();
  if (c.card.is_object())
    if (const json::Value* cls = c.card.find("classes"); cls && cls->is_array())
      for (const json::Value& n : cls->as_array()) m.class_names.push_back(n.as_string());
  return m;
}

PreparedInputs prepare_inputs(const Classifier& m, const std::vector<std::string>& paths) {
  const Recipe& r = m.recipe;
  const std::string& kind = r.string("data.dataset");
  Preparer prep;
  prep.images = m.shape.images;
  prep.pixels = kind == "pixels" || kind == "pathfinder";
  prep.pairs = m.shape.pairs;
  prep.kind = kind;
  prep.max_length = m.shape.max_length;
  if (prep.images || prep.pixels) prep.transform = eval_image_transform(r);
  PreparedInputs out;
  for (const std::string& path : paths)
    read_inputs(path, prep, r.integer("data.max_image_pixels"), out);
  FORGE_CHECK(!out.examples.empty(), "the inputs {} hold no example", fmt::join(paths, ", "));
  return out;
}

void for_each_batch(const Classifier& m, const PreparedInputs& inputs, int64_t batch_size,
                    const std::function<void(const data::Batch&, int64_t first)>& run) {
  TaskData data;
  data.eval = std::make_shared<Inputs>(inputs, m.shape.classes);
  data.shape = m.shape;
  data::LoaderOptions lo = loader_options(m.recipe, data, false);
  if (batch_size > 0) lo.batch_size = batch_size;
  lo.workers = 0;
  data::DataLoader loader(data.eval, lo);
  NoGradGuard no_grad;
  int64_t first = 0;
  for (int64_t bi = 0; bi < loader.batches_per_epoch(); ++bi) {
    data::Batch b = loader.build(0, bi);
    if (b.input.defined() && is_floating(b.input.dtype())) b.input = b.input.to(m.place.dtype);
    for (Tensor* t : {&b.input, &b.mask, &b.input2, &b.mask2})
      if (t->defined()) *t = t->to(m.place.device);
    run(b, first);
    first += b.size;
  }
}

PredictResult predict(const PredictRequest& q,
                      const std::function<void(const json::Value&)>& emit) {
  const auto t0 = std::chrono::steady_clock::now();
  FORGE_CHECK(!q.inputs.empty(), "predict: give at least one input file");
  FORGE_CHECK(q.top_k >= 1, "predict: --top-k must be 1 or more, got {}", q.top_k);
  FORGE_CHECK(q.limit >= 0, "predict: --limit must be 0 (all) or more, got {}", q.limit);
  const Classifier m = load_classifier(q.checkpoint, q.overrides, "predict", q.ema);
  PreparedInputs inputs = prepare_inputs(m, q.inputs);
  if (q.limit > 0 && static_cast<int64_t>(inputs.examples.size()) > q.limit) {
    inputs.examples.resize(static_cast<size_t>(q.limit));
    inputs.names.resize(static_cast<size_t>(q.limit));
  }
  PredictResult result;
  result.checkpoint = m.checkpoint;
  for_each_batch(m, inputs, q.batch_size, [&](const data::Batch& b, int64_t first) {
    const Tensor logits = m.task->forward(b).to(Device::cpu()).to(DType::f64);  // (B, C)
    const int64_t B = logits.size(0), C = logits.size(1);
    const double* z = logits.data<double>();
    for (int64_t i = 0; i < B; ++i) {
      const double* zi = z + i * C;
      double peak = zi[0];
      for (int64_t k = 1; k < C; ++k) peak = std::max(peak, zi[k]);
      std::vector<double> prob(static_cast<size_t>(C));  // softmax of the row, in f64
      double sum = 0;
      for (int64_t k = 0; k < C; ++k) sum += prob[static_cast<size_t>(k)] = std::exp(zi[k] - peak);
      json::Array lz, pz;
      std::vector<int64_t> order(static_cast<size_t>(C));
      for (int64_t k = 0; k < C; ++k) {
        prob[static_cast<size_t>(k)] /= sum;
        lz.emplace_back(zi[k]);
        pz.emplace_back(prob[static_cast<size_t>(k)]);
        order[static_cast<size_t>(k)] = k;
      }
      const int64_t top = std::min(q.top_k, C);
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t c) {
        return zi[a] > zi[c] || (zi[a] == zi[c] && a < c);
      });
      json::Array best;
      for (int64_t k = 0; k < top; ++k) {
        const int64_t id = order[static_cast<size_t>(k)];
        json::Value e;
        e["class"] = id;
        if (static_cast<size_t>(id) < m.class_names.size())
          e["name"] = m.class_names[static_cast<size_t>(id)];
        e["probability"] = prob[static_cast<size_t>(id)];
        best.push_back(std::move(e));
      }
      json::Value rec;
      rec["input"] = inputs.names[static_cast<size_t>(first + i)];
      rec["top_k"] = json::Value(std::move(best));
      rec["logits"] = json::Value(std::move(lz));
      rec["probabilities"] = json::Value(std::move(pz));
      emit(rec);
    }
    result.examples += B;
  });
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace forge::train
