// attnforge: the command-line program.
//
//   attnforge train RECIPE.yaml [--set key=value]... [--out DIR] [--dump-config] [--check-nan]
//   attnforge train --resume RUN_OR_CHECKPOINT [--out NEW_DIR] [--set key=value]... [--check-nan]
//   attnforge eval CHECKPOINT [--split NAME] [--ema] [--out FILE [--overwrite]] [--set
//   key=value]... attnforge predict CKPT INPUT... [--top-k K] [--batch-size N] [--ema] [--out FILE
//   [--overwrite]] attnforge attention-maps CKPT INPUT [--index I] [--ema] [--out DIR
//   [--overwrite]] [--set ...] attnforge export CKPT --out DIR [--overwrite] [--format
//   pytorch|timm] [--ema] attnforge generate CKPT [--prompt TEXT | --prompt-file F] [--source TEXT]
//   [--length N] ... attnforge gradcheck [OP...] [--list] attnforge bench attention [options of
//   bench_attention] attnforge info attnforge recipe-reference          (the Markdown of
//   docs/RECIPES.md) attnforge --version
//
// Data parallelism: `mpirun -np N attnforge train|eval ...` (docs/DISTRIBUTED.md).
// Rank 0 prints; a rank that fails prints its error and ends the whole job.
//
// Exit status: 0 done, 1 bad input or a failed run (the message says what and
// where), 2 bad command line, 130 / 143 stopped by SIGINT / SIGTERM after
// writing a checkpoint.
#include <cblas.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "autograd/gradcheck.h"
#include "bench/attention.h"
#include "core/device.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/threading.h"
#include "core/version.h"
#include "data/lra_release.h"
#include "dist/group.h"
#include "ops/attention/attention.h"
#include "ops/attention/registry.h"
#include "ops/blas.h"
#include "ops/blas_core.h"
#include "train/attention_maps.h"
#include "train/checkpoint.h"
#include "train/export.h"
#include "train/generate.h"
#include "train/outputs.h"
#include "train/plot.h"
#include "train/predict.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using forge::train::Recipe;

std::atomic<int> g_signal{0};
// The first SIGINT / SIGTERM asks the trainer to checkpoint and stop after the
// current step; a second one ends the process at once (the default action).
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kMainHelp =
    R"(attnforge: train efficient-attention transformers from YAML recipes.

usage: attnforge COMMAND [options]      (attnforge COMMAND --help for each)

commands:
  train      train a recipe, or continue a run (--resume RUN_DIR)
  eval       evaluate a checkpoint on a split
  predict    run a trained classifier on new inputs (images, IDX, TSV) -> JSON lines
  export     write a checkpoint as plain PyTorch (model.py, model.safetensors, config.json)
  attention-maps  draw a classifier's attention (per layer and head, rollout for ViTs) on one input
  generate   continue a text with a language model, or decode a source with an encoder-decoder
  data       prepare a Long Range Arena task's data from its public release (data TASK --from DIR)
  gradcheck  check every attention op's backward against finite differences (f64)
  bench      time the attention mechanisms (bench attention ...)
  info       the build, BLAS, threads and CUDA devices
  recipe-reference  print every recipe key with its type, default and meaning (Markdown)

  --version  the version and the git commit of this build
)";

constexpr const char* kTrainHelp = R"(usage: attnforge train RECIPE.yaml [options]
       attnforge train --resume RUN_DIR [options]

Trains the model a recipe describes (see docs/RECIPES.md for every key).

options:
  --set KEY=VALUE  override a recipe key (repeatable); VALUE is a YAML scalar or
                   a list such as [a, b]. Example: --set model.attention.kind=favor
  --out DIR        run directory (default: output.dir, else the next free
                   runs/<name>-<N>); must not hold a run already
  --resume PATH    continue a run exactly as if it had not stopped: PATH is its
                   run directory or its latest checkpoint (reads the run's
                   recipe.yaml; --set overrides it). PATH may also be an older
                   checkpoint (RUN/checkpoints/step-N or best) with --out NEWDIR:
                   a new run continuing from it, leaving RUN as it was
  --dump-config    check the recipe as a start would (device, data, model,
                   optimizer, schedule), print it resolved (defaults, --set and
                   the sizes the data decides filled in) and exit
  --check-nan      check every op's output and gradient; the first non-finite one
                   is named (slower)
  --help           this text

SIGINT (Ctrl-C) or SIGTERM write a checkpoint and stop; --resume continues.
)";

constexpr const char* kEvalHelp = R"(usage: attnforge eval CHECKPOINT [options]

Evaluates a checkpoint with the recipe stored in it on the whole split, prints
the result as JSON (loss, accuracy; for classifiers also top-5 accuracy, the
accuracy of each class and the confusion matrix) and writes it to a file, with
the confusion matrix as a picture beside it (FILE-confusion.svg). CHECKPOINT is a run directory (its
latest checkpoint), RUN/checkpoints/latest, RUN/checkpoints/best or a
checkpoint directory (RUN/checkpoints/step-00001000).

options:
  --split NAME     the split to evaluate (default: the recipe's data.eval_split)
  --ema            evaluate the moving average of the weights (a run with ema.decay)
  --out FILE       where to write the JSON (default: <run dir>/eval-<checkpoint>-<split>.json,
                   -first<N> added for a subset, -ema for the moving average); never inside a
                   checkpoint, and not over an existing file unless --overwrite
  --overwrite      replace an existing --out file (and its -confusion.svg)
  --set KEY=VALUE  override a recipe key (e.g. data.root, loop.eval_batch_size;
                   data.limit_eval=N evaluates the first N examples only)
  --help           this text
)";

constexpr const char* kPredictHelp = R"(usage: attnforge predict CHECKPOINT INPUT... [options]

Runs a trained classifier on new inputs and writes one JSON line per example:
its top classes (id, name, probability), logits and probabilities. CHECKPOINT
is a run directory, RUN/checkpoints/latest|best or a checkpoint directory.
INPUT: for an image model, PNG or JPEG files, or IDX files of u8 images
[N, H, W]; for a sequence classifier, TSV files in its training data's layout
(ListOps: expression[TAB label]; text: [label TAB] text; pairs: the last two
columns), so the data's own files work as they are. Inputs are prepared as
evaluation prepares its data (the checkpoint's recipe and card say how).

options:
  --top-k K          classes listed per example (default 5)
  --ema              use the moving average of the weights (a run with ema.decay)
  --batch-size N     examples per forward (default: the recipe's eval batch size)
  --limit N          the first N examples of the inputs only (e.g. of an IDX file)
  --out FILE         write the JSON lines there instead of stdout (never inside a checkpoint,
                     not over an existing file unless --overwrite)
  --overwrite        replace an existing --out file
  --set KEY=VALUE    override a recipe key (e.g. device=cpu, threads=2)
  --help             this text
)";

constexpr const char* kExportHelp =
    R"(usage: attnforge export CHECKPOINT --out DIR [--overwrite] [--format pytorch|timm] [--ema]

Writes a checkpoint as a directory PyTorch loads without attnforge: model.py
(plain PyTorch rebuilding the model, every attention mechanism included),
model.safetensors (the weights, f32) and config.json (the model's keys and its
card: input preparation, class names). Then, in Python:
    import sys; sys.path.insert(0, "DIR"); import model
    m = model.load("DIR"); logits = m(x)
CHECKPOINT is a run directory, RUN/checkpoints/latest|best or a checkpoint
directory. Classifiers (vit, sequence_classifier).

options:
  --out DIR        the directory to create (it must not exist, unless --overwrite)
  --overwrite      replace an earlier export at DIR (a directory holding only
                   model.safetensors, config.json and model.py)
  --ema            export the moving average of the weights (a run with ema.decay)
  --format F       pytorch (default), or timm for softmax ViTs: timm's names
                   (fused qkv) and config.json's "timm": {"model_name", "kwargs"}
                   for timm.create_model(model_name, **kwargs), whose
                   load_state_dict(state dict, strict=True) then holds
  --help           this text
)";

constexpr const char* kAttentionMapsHelp =
    R"(usage: attnforge attention-maps CHECKPOINT INPUT [options]

Draws the attention of a trained classifier on one input: for every layer and
head, its attention matrix coloured (layerLL_headHH.png); for a ViT, also the
picture beside where each head looks from the class token (..._image.png),
and the attention rollout over all layers (rollout.png). INPUT is a picture
(PNG, JPEG, or an IDX file with --index) or a TSV line, as predict takes.
Mechanisms without explicit maps (efficient, linear, favor) draw none.

options:
  --index I        the example of INPUT to draw (default 0)
  --ema            draw with the moving average of the weights (a run with ema.decay)
  --out DIR        where to write (default: <run dir>/attention_maps-<checkpoint>-<I>); never
                   inside a checkpoint, and not an existing directory unless --overwrite
  --overwrite      write into an existing --out directory (its images of the same names are replaced)
  --set KEY=VALUE  override a recipe key
  --help           this text
)";

constexpr const char* kGenerateHelp = R"(usage: attnforge generate CHECKPOINT [options]

Generates from a language model or an encoder-decoder: CHECKPOINT is a
checkpoint directory or a run directory (its latest checkpoint). The tokens are
written to stdout as they are drawn; a summary goes to stderr. Text is bytes
for lm_text and seq2seq_tsv recipes, token ids separated by spaces for copy.

options:
  --prompt TEXT        the text to continue (a language model needs one; for an
                       encoder-decoder, the decoder's first tokens after its start token)
  --prompt-file FILE   the prompt read from a file
  --source TEXT        encoder-decoder: the encoder's input
  --length N           new tokens at most (default 256)
  --temperature T      divide the logits by T before sampling (default 1)
  --top-k K            sample among the K most likely tokens
  --filter-thres F     sample among the top (1 - F) fraction of the vocabulary
                       (performer-pytorch's top_k filter, e.g. 0.9)
  --greedy             the most likely token each time, no sampling
  --exact-window       past the model's positions (model.max_len), recompute the
                       last max_len tokens for every token, as the references'
                       generate loops do; by default the decoding state is
                       rebuilt from the last max_len / 2 tokens when it is full
                       (each token then sees max_len / 2 to max_len tokens), as
                       fast as within the window
  --seed S             seed of the sampling (default 0): a seed gives one output
  --eos ID             stop at this token (default: the data's end token, if any)
  --logits FILE        write a JSON line per draw: the tokens before it ("context",
                       and the encoder's "source"), the "logits" it was drawn from
                       and the token drawn ("next")
  --overwrite          replace an existing --logits file
  --set KEY=VALUE      override a recipe key (e.g. device=cpu, threads=2)
  --help               this text
)";

constexpr const char* kGradcheckHelp = R"(usage: attnforge gradcheck [OP...] [options]

Runs the registry of attention gradient checks (float64 central differences,
eps 1e-6, atol 1e-5, rtol 1e-3 unless a case says otherwise) and prints a
pass/fail table. OP selects cases whose name starts with it (e.g. softmax,
favor/causal); none runs them all. Then prints TaylorShift's direct-vs-efficient
form difference.

options:
  --list     list the case names and exit
  --help     this text
Exit status 1 when any case fails.
)";

constexpr const char* kBenchHelp =
    R"(usage: attnforge bench attention [--max-n N] [--csv] [--one NAME N]

Times every attention mechanism's forward and forward+backward and measures its
peak memory (B 1, H 8, d 64, f32). The PyTorch comparison: make bench-torch.
)";

constexpr const char* kDataHelp = R"(usage: attnforge data TASK --from DIR [--out DIR]

Prepares a Long Range Arena task's data from its public release, downloaded and
unpacked, into the layout its recipe (recipes/lra/TASK.yaml) reads. --out
defaults to data/lra/TASK, the recipe's data.root. Everything is read back by
the reader the recipe uses before it is moved into place; nothing is
overwritten: --out must not exist or be an empty folder.

  TASK        --from
  listops     lra_release/lra_release/listops-1000      (LRA's lra_release.gz)
  retrieval   lra_release/lra_release/tsv_data          (LRA's lra_release.gz)
  pathfinder  lra_release/lra_release/pathfinder32/curv_contour_length_14
              (or another curv_* folder; split 80/10/10 as LRA does)
  text        aclImdb                                   (IMDb's aclImdb_v1.tar.gz)
  image       cifar-10-batches-bin                      (CIFAR-10's binary version)

docs/USER_GUIDE.md, "Long Range Arena", has the downloads and each step.
)";

constexpr const char* kRecipeReferenceHelp = R"(usage: attnforge recipe-reference

Prints every recipe key with its type, default and meaning, as Markdown (the
text of docs/RECIPES.md).
)";

constexpr const char* kInfoHelp = R"(usage: attnforge info

Prints the build (compiler, type, CUDA backend), BLAS, threads and CUDA devices.
)";

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// The value after args[i] (advancing i), or a usage error naming the option.
std::string value_of(const std::vector<std::string>& args, size_t& i) {
  if (i + 1 >= args.size()) throw UsageError(fmt::format("{} needs a value", args[i]));
  return args[++i];
}

int cmd_train(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kTrainHelp, stdout);
    return 0;
  }
  std::string recipe_path, resume, out;
  std::vector<std::string> sets;
  bool dump = false, check_nan = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--set")
      sets.push_back(value_of(args, i));
    else if (a.rfind("--set=", 0) == 0)
      sets.push_back(a.substr(6));
    else if (a == "--resume")
      resume = value_of(args, i);
    else if (a == "--out")
      out = value_of(args, i);
    else if (a == "--dump-config")
      dump = true;
    else if (a == "--check-nan")
      check_nan = true;
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("train: unknown option {}", a));
    else if (recipe_path.empty())
      recipe_path = a;
    else
      throw UsageError(fmt::format("train: one recipe expected, got a second: {}", a));
  }
  if (resume.empty() == recipe_path.empty())
    throw UsageError("train: give a recipe file, or --resume RUN_DIR (not both)");
  forge::train::TrainOptions options;
  options.check_nan = check_nan;
  Recipe recipe;
  if (resume.empty()) {
    recipe = Recipe::from_file(recipe_path);
    options.run_dir = out;
  } else {
    // A run directory, or a checkpoint: the latest one continues its run; an
    // older one starts a new run (--out) from it.
    std::error_code ec;
    if (!fs::exists(resume, ec))
      throw std::runtime_error(
          fmt::format("--resume {}: no such run directory or checkpoint", resume));
    const fs::path given = fs::path(resume).lexically_normal();
    const std::string base =
        (given.filename().empty() ? given.parent_path() : given).filename().string();
    const bool run_dir = fs::is_directory(given, ec) && base != "checkpoints" &&
                         !fs::exists(given / "model.safetensors", ec);
    std::optional<forge::train::CheckpointRef> ref;
    if (!run_dir || !out.empty()) ref = forge::train::resolve_checkpoint(resume, "--resume");
    if (!out.empty()) {
      options.resume_from = resume;
      options.run_dir = out;
      recipe = Recipe::from_yaml(forge::train::read_checkpoint(ref->dir).recipe_yaml,
                                 ref->dir + "/model.safetensors (recipe)");
    } else {
      if (ref && !ref->latest)
        throw std::runtime_error(fmt::format(
            "--resume {}: {} is not the latest checkpoint of {}; continuing from it there would "
            "discard the newer ones. Continue from it in a new run directory: attnforge train "
            "--resume {} --out NEWDIR",
            resume, ref->dir, ref->run_dir.empty() ? "its run" : ref->run_dir, resume));
      options.run_dir = ref ? ref->run_dir : resume;
      options.resume = true;
      const fs::path file = fs::path(options.run_dir) / "recipe.yaml";
      if (!fs::exists(file, ec))
        throw std::runtime_error(fmt::format(
            "--resume {}: no recipe.yaml in {}: the run was stopped before it started; start it "
            "again with attnforge train RECIPE.yaml --out {}",
            resume, options.run_dir, options.run_dir));
      recipe = Recipe::from_file(file.string());
    }
  }
  for (const std::string& s : sets) recipe.set(s);
  if (dump) {
    std::vector<std::string> notes;
    const Recipe resolved = forge::train::resolve_recipe(recipe, &notes);
    for (const std::string& n : notes)
      std::fprintf(stderr, "attnforge train: note: %s\n", n.c_str());
    std::fputs(resolved.to_yaml().c_str(), stdout);
    return 0;
  }
  // ATTNFORGE_FAULT=RANK:STEP[:hang] makes that rank fail (or hang) before
  // that step: how the tests check that one failing or silent process ends a
  // data-parallel job.
  struct Fault {
    int rank = -1;
    long long step = -1;
    bool hang = false;
  };
  std::optional<Fault> fault;
  if (const char* f = std::getenv("ATTNFORGE_FAULT")) {
    Fault x;
    char mode[8] = "";
    const int got = std::sscanf(f, "%d:%lld:%7s", &x.rank, &x.step, mode);
    x.hang = got == 3 && std::string(mode) == "hang";
    if (got < 2 || x.rank < 0 || x.step < 0 || (got == 3 && !x.hang))
      throw UsageError(fmt::format("ATTNFORGE_FAULT={}: expected RANK:STEP or RANK:STEP:hang", f));
    fault = x;
  }
  options.stop_requested = [fault](int64_t step) {
    const int rank = forge::dist::Group::world().rank();
    if (fault && fault->rank == rank && fault->step == step) {
      if (fault->hang) std::this_thread::sleep_for(std::chrono::hours(1));
      FORGE_FAIL("fault injected by ATTNFORGE_FAULT: rank {} fails before step {}", rank, step + 1);
    }
    return g_signal.load() != 0;
  };
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto result = forge::train::train(recipe, options);
  if (result.status == forge::train::TrainResult::Status::interrupted)
    return g_signal.load() == SIGTERM ? 143 : 130;
  return 0;
}

int cmd_eval(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kEvalHelp, stdout);
    return 0;
  }
  std::string ckpt, split, out;
  std::vector<std::string> sets;
  bool ema = false, overwrite = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--split")
      split = value_of(args, i);
    else if (a == "--ema")
      ema = true;
    else if (a == "--overwrite")
      overwrite = true;
    else if (a == "--out")
      out = value_of(args, i);
    else if (a == "--set")
      sets.push_back(value_of(args, i));
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("eval: unknown option {}", a));
    else if (ckpt.empty())
      ckpt = a;
    else
      throw UsageError(fmt::format("eval: one checkpoint expected, got a second: {}", a));
  }
  if (ckpt.empty()) throw UsageError("eval: give a checkpoint or a run directory");
  // The confusion matrix goes beside the JSON: FILE.json -> FILE-confusion.svg.
  const auto svg_of = [](const std::string& json_path) {
    fs::path svg(json_path);
    svg.replace_filename(svg.stem().string() + "-confusion.svg");
    return svg.string();
  };
  const bool root = forge::dist::Group::world().root();
  if (!out.empty() && root) {  // checked before the evaluation, which may take long
    forge::train::check_output_file(out, "eval --out", overwrite);
    forge::train::check_output_file(svg_of(out), "eval --out (its confusion matrix)", overwrite);
  }
  const auto r = forge::train::evaluate_checkpoint(ckpt, split, sets, ema);
  if (!root) return 0;  // rank 0 reports the reduced result
  for (const std::string& w : r.warnings)
    std::fprintf(stderr, "attnforge eval: warning: %s\n", w.c_str());
  const std::string text = forge::json::dump(r.to_json(), 2) + "\n";
  std::fputs(text.c_str(), stdout);
  if (out.empty()) {
    // A name for what was evaluated (checkpoint, split, subset, weights): a
    // second evaluation of the same replaces it, any other gets its own file.
    const fs::path dir(r.checkpoint);
    const fs::path beside = r.run_dir.empty() ? dir.parent_path() : fs::path(r.run_dir);
    out = (beside / fmt::format("eval-{}-{}{}{}.json", dir.filename().string(), r.split,
                                r.limit > 0 ? fmt::format("-first{}", r.limit) : "",
                                ema ? "-ema" : ""))
              .string();
    forge::train::check_output_file(out, "eval (its default output)", true);
    forge::train::check_output_file(svg_of(out), "eval (its default output)", true);
  }
  forge::io::write_file_atomic(out, text);
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  if (!r.confusion.empty()) {
    const fs::path svg(svg_of(out));
    forge::io::write_file_atomic(
        svg.string(),
        forge::train::render_confusion_svg(r.confusion, r.class_names,
                                           fmt::format("{} on {} (step {}): accuracy {:.2f}%",
                                                       fs::path(r.checkpoint).filename().string(),
                                                       r.split, r.step, 100 * r.accuracy)));
    std::fprintf(stderr, "wrote %s\n", svg.string().c_str());
  }
  return 0;
}

// A number option's value, or a usage error naming the option.
template <typename T>
T number_of(const std::vector<std::string>& args, size_t& i) {
  const std::string& name = args[i];
  const std::string v = value_of(args, i);
  try {
    size_t used = 0;
    T x{};
    if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(std::stod(v, &used));
    else
      x = static_cast<T>(std::stoll(v, &used));
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw UsageError(fmt::format("{}: expected a number, got '{}'", name, v));
}

int cmd_generate(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kGenerateHelp, stdout);
    return 0;
  }
  forge::train::GenerateRequest q;
  bool have_prompt = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--prompt" || a == "--prompt-file") {
      if (have_prompt) throw UsageError("generate: give one of --prompt and --prompt-file");
      have_prompt = true;
      q.prompt =
          a == "--prompt" ? value_of(args, i) : forge::io::read_file(value_of(args, i), 1 << 24);
    } else if (a == "--source")
      q.source = value_of(args, i);
    else if (a == "--length")
      q.length = number_of<int64_t>(args, i);
    else if (a == "--temperature")
      q.temperature = number_of<double>(args, i);
    else if (a == "--top-k")
      q.top_k = number_of<int64_t>(args, i);
    else if (a == "--filter-thres")
      q.filter_thres = number_of<double>(args, i);
    else if (a == "--greedy")
      q.greedy = true;
    else if (a == "--exact-window")
      q.exact_window = true;
    else if (a == "--seed")
      q.seed = number_of<uint64_t>(args, i);
    else if (a == "--eos")
      q.eos = number_of<int64_t>(args, i);
    else if (a == "--logits")
      q.logits_file = value_of(args, i);
    else if (a == "--overwrite")
      q.overwrite = true;
    else if (a == "--set")
      q.overrides.push_back(value_of(args, i));
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("generate: unknown option {}", a));
    else if (q.checkpoint.empty())
      q.checkpoint = a;
    else
      throw UsageError(fmt::format("generate: one checkpoint expected, got a second: {}", a));
  }
  if (q.checkpoint.empty()) throw UsageError("generate: give a checkpoint or run directory");
  if (q.top_k > 0 && q.filter_thres > 0)
    throw UsageError("generate: give one of --top-k and --filter-thres");
  if (q.eos < -1 && q.eos != -2)
    throw UsageError("generate: --eos must be a token id (or -1: none)");
  const auto r = forge::train::generate(q, [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fprintf(stderr, "\n%s: %lld prompt tokens, %lld generated in %.2f s (%.1f tokens/s; %s)\n",
               r.checkpoint.c_str(), static_cast<long long>(r.prompt_tokens),
               static_cast<long long>(r.generated), r.seconds,
               r.seconds > 0 ? static_cast<double>(r.generated) / r.seconds : 0.0, r.how().c_str());
  return 0;
}

int cmd_predict(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kPredictHelp, stdout);
    return 0;
  }
  forge::train::PredictRequest q;
  std::string out;
  bool overwrite = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--top-k")
      q.top_k = number_of<int64_t>(args, i);
    else if (a == "--ema")
      q.ema = true;
    else if (a == "--overwrite")
      overwrite = true;
    else if (a == "--batch-size") {
      q.batch_size = number_of<int64_t>(args, i);
      if (q.batch_size < 1) throw UsageError("predict: --batch-size must be 1 or more");
    } else if (a == "--limit") {
      q.limit = number_of<int64_t>(args, i);
      if (q.limit < 1) throw UsageError("predict: --limit must be 1 or more");
    } else if (a == "--out")
      out = value_of(args, i);
    else if (a == "--set")
      q.overrides.push_back(value_of(args, i));
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("predict: unknown option {}", a));
    else if (q.checkpoint.empty())
      q.checkpoint = a;
    else
      q.inputs.push_back(a);
  }
  if (q.checkpoint.empty() || q.inputs.empty())
    throw UsageError("predict: give a checkpoint (or run directory) and at least one input file");
  if (q.top_k < 1) throw UsageError("predict: --top-k must be 1 or more");
  if (!out.empty()) forge::train::check_output_file(out, "predict --out", overwrite);
  // Every line is known before anything is written: a bad input leaves no
  // half-written --out file.
  std::string text;
  const auto r = forge::train::predict(
      q, [&](const forge::json::Value& rec) { text += forge::json::dump(rec) + "\n"; });
  if (out.empty())
    std::fputs(text.c_str(), stdout);
  else
    forge::io::write_file_atomic(out, text);
  std::fprintf(stderr, "%s: %lld examples in %.2f s%s\n", r.checkpoint.c_str(),
               static_cast<long long>(r.examples), r.seconds,
               out.empty() ? "" : (", written to " + out).c_str());
  return 0;
}

int cmd_export(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kExportHelp, stdout);
    return 0;
  }
  forge::train::ExportRequest q;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--out")
      q.out_dir = value_of(args, i);
    else if (a == "--overwrite")
      q.overwrite = true;
    else if (a == "--format")
      q.format = value_of(args, i);
    else if (a == "--ema")
      q.ema = true;
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("export: unknown option {}", a));
    else if (q.checkpoint.empty())
      q.checkpoint = a;
    else
      throw UsageError(fmt::format("export: one checkpoint expected, got a second: {}", a));
  }
  if (q.checkpoint.empty() || q.out_dir.empty())
    throw UsageError("export: give a checkpoint (or run directory) and --out DIR");
  const auto r = forge::train::export_checkpoint(q);
  std::fprintf(stderr, "exported %s (%lld tensors) to %s: %smodel.safetensors, config.json\n",
               r.checkpoint.c_str(), static_cast<long long>(r.tensors), r.dir.c_str(),
               q.format == "timm" ? "" : "model.py, ");
  return 0;
}

int cmd_attention_maps(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kAttentionMapsHelp, stdout);
    return 0;
  }
  std::string ckpt, input, out;
  int64_t index = 0;
  std::vector<std::string> sets;
  bool ema = false, overwrite = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--index")
      index = number_of<int64_t>(args, i);
    else if (a == "--ema")
      ema = true;
    else if (a == "--overwrite")
      overwrite = true;
    else if (a == "--out")
      out = value_of(args, i);
    else if (a == "--set")
      sets.push_back(value_of(args, i));
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("attention-maps: unknown option {}", a));
    else if (ckpt.empty())
      ckpt = a;
    else if (input.empty())
      input = a;
    else
      throw UsageError(fmt::format("attention-maps: one input expected, got a second: {}", a));
  }
  if (ckpt.empty() || input.empty())
    throw UsageError("attention-maps: give a checkpoint (or run directory) and an input file");
  if (!out.empty()) forge::train::check_output_dir(out, "attention-maps --out", overwrite);
  const auto model = forge::train::load_classifier(ckpt, sets, "attention-maps", ema);
  auto inputs = forge::train::prepare_inputs(model, {input});
  if (index < 0 || index >= static_cast<int64_t>(inputs.examples.size()))
    throw std::runtime_error(fmt::format("attention-maps: --index {}: {} holds {} example(s)",
                                         index, input, inputs.examples.size()));
  inputs.examples = {inputs.examples[static_cast<size_t>(index)]};
  inputs.names = {inputs.names[static_cast<size_t>(index)]};
  if (out.empty()) {
    const fs::path dir(model.checkpoint);
    out = (dir.parent_path().parent_path() /
           fmt::format("attention_maps-{}-{}", dir.filename().string(), index))
              .string();
    // Its own default: the same maps again (same checkpoint and index) replace it.
    forge::train::check_output_dir(out, "attention-maps (its default output)", true);
  }
  forge::train::AttentionMapsResult r;
  forge::train::for_each_batch(model, inputs, 1, [&](const forge::data::Batch& b, int64_t) {
    r = forge::train::draw_attention_maps(*model.task, b, forge::train::vit_layout(model.recipe),
                                          out);
  });
  if (r.layers_with_maps == 0)
    throw std::runtime_error(fmt::format(
        "attention-maps: model.attention.kind {} forms no attention matrix in any of its {} "
        "layers (softmax, local, linformer and taylorshift heads have one; the linear forms "
        "compute attention without it), so there is nothing to draw; nothing was written",
        model.recipe.string("model.attention.kind"), r.layers));
  std::fprintf(stderr, "%s: %zu images of %lld layer(s) (%lld with explicit maps)%s in %s\n",
               inputs.names[0].c_str(), r.files.size(), static_cast<long long>(r.layers),
               static_cast<long long>(r.layers_with_maps), r.rollout ? ", rollout included" : "",
               out.c_str());
  return 0;
}

int cmd_gradcheck(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kGradcheckHelp, stdout);
    return 0;
  }
  std::vector<std::string> prefixes;
  bool list = false;
  for (const auto& a : args) {
    if (a == "--list")
      list = true;
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("gradcheck: unknown option {}", a));
    else
      prefixes.push_back(a);
  }
  const auto& registry = forge::ops::attention::gradcheck_registry();
  std::vector<const forge::ops::attention::GradcheckCase*> cases;
  for (const auto& c : registry) {
    bool match = prefixes.empty();
    for (const auto& p : prefixes) match = match || c.name.rfind(p, 0) == 0;
    if (match) cases.push_back(&c);
  }
  if (cases.empty()) {
    std::string names;
    for (const auto& c : registry) names += "  " + c.name + "\n";
    throw UsageError(fmt::format("gradcheck: no case matches; the cases are:\n{}", names));
  }
  if (list) {
    for (const auto* c : cases) std::printf("%s\n", c->name.c_str());
    return 0;
  }
  size_t width = 4;
  for (const auto* c : cases) width = std::max(width, c->name.size());
  std::printf("%-*s  result  max |analytic - numeric|\n", static_cast<int>(width), "case");
  int failed = 0;
  for (const auto* c : cases) {
    forge::autograd::GradcheckResult r;
    try {
      r = forge::autograd::gradcheck(c->fn, c->make_inputs(), c->options);
    } catch (const forge::Error& e) {
      r.ok = false;
      r.message = e.what();
    }
    failed += r.ok ? 0 : 1;
    std::printf("%-*s  %-6s  %.3g\n", static_cast<int>(width), c->name.c_str(),
                r.ok ? "pass" : "FAIL", r.max_abs_error);
    if (!r.ok) std::printf("    %s\n", r.message.c_str());
  }
  std::printf("\n%zu cases: %zu passed, %d failed\n", cases.size(),
              cases.size() - static_cast<size_t>(failed), failed);
  bool taylorshift = prefixes.empty();
  for (const auto& p : prefixes) taylorshift = taylorshift || p.rfind("taylorshift", 0) == 0;
  if (taylorshift) {
    std::printf("\nTaylorShift direct vs efficient (B 1, H 2, N 256, d 16, q, k, v ~ N(0, 1)):\n");
    for (auto dtype : {forge::DType::f32, forge::DType::f64}) {
      const auto d = forge::ops::attention::taylorshift_form_difference(1, 2, 256, 16, dtype);
      std::printf("  %s: mean |difference| %.3g, mean relative %.3g\n", forge::dtype_name(dtype),
                  d.mean_abs, d.mean_rel);
    }
  }
  return failed == 0 ? 0 : 1;
}

int cmd_bench(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::fputs(kBenchHelp, stdout);
    return 0;
  }
  if (args.empty()) throw UsageError("bench: give what to time: bench attention [options]");
  if (args[0] != "attention")
    throw UsageError(
        fmt::format("bench: unknown benchmark '{}'; the one here is: attention", args[0]));
  std::vector<std::string> argv_s = {"attnforge bench attention"};
  argv_s.insert(argv_s.end(), args.begin() + 1, args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  return bench_attention_main(static_cast<int>(argv_s.size()), argv.data());
}

int cmd_data(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kDataHelp, stdout);
    return 0;
  }
  std::string task_name, from, out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--from")
      from = value_of(args, i);
    else if (a == "--out")
      out = value_of(args, i);
    else if (!a.empty() && a[0] == '-')
      throw UsageError(fmt::format("data: unknown option {}", a));
    else if (task_name.empty())
      task_name = a;
    else
      throw UsageError(fmt::format("data: one task expected, got a second: {}", a));
  }
  if (task_name.empty() || from.empty())
    throw UsageError(
        "data: give a task (listops, text, retrieval, image, pathfinder) and --from DIR");
  forge::data::LraTask task;
  try {
    task = forge::data::lra_task_from_name(task_name);
  } catch (const forge::Error& e) {
    throw UsageError(forge::message_of(e));
  }
  if (out.empty()) out = forge::data::lra_default_dir(task);
  const forge::data::PreparedLra p = forge::data::prepare_lra(task, from, out);
  std::vector<std::string> counts;
  for (const auto& [split, n] : p.examples) counts.push_back(fmt::format("{} {}", split, n));
  std::fprintf(stderr, "prepared LRA %s from %s into %s: %s examples\n", task_name.c_str(),
               p.from.c_str(), out.c_str(), fmt::format("{}", fmt::join(counts, ", ")).c_str());
  for (const std::string& n : p.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  const std::string set_root =
      out == forge::data::lra_default_dir(task) ? "" : " --set data.root=" + out;
  std::fprintf(stderr, "train with: attnforge train recipes/lra/%s.yaml%s\n", task_name.c_str(),
               set_root.c_str());
  return 0;
}

int cmd_info(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::fputs(kInfoHelp, stdout);
    return 0;
  }
#ifdef NDEBUG
  const char* type = "optimised (NDEBUG)";
#else
  const char* type = "debug";
#endif
  std::printf("attnforge %s (%s)\n", forge::version(), forge::git_commit());
  std::printf("  compiler     %s %s, C++ %ld\n",
#if defined(__clang__)
              "clang", __clang_version__,
#else
              "gcc", __VERSION__,
#endif
              static_cast<long>(__cplusplus));
  std::printf("  build        %s\n", type);
  std::printf("  BLAS         %s\n", forge::blas::openblas_config().c_str());
  std::printf("  BLAS kernels %s\n", forge::blas::kernel_summary().c_str());
  std::printf("  bf16 GEMMs   %s\n", forge::ops::bf16_gemm_summary().c_str());
  std::printf("  threads      %d (OpenMP; set with the recipe key threads or OMP_NUM_THREADS)\n",
              forge::num_threads());
  std::printf("  CUDA backend %s\n", forge::cuda_built() ? "built" : "not built");
  std::printf("  CUDA devices %d\n", forge::cuda_device_count());
  return 0;
}

// A failed process of a data-parallel job: rank 0 prints and ends the job at
// once; another rank first gives rank 0 two seconds to do so (an error every
// rank meets, a bad recipe say, is then printed once), then prints and ends it.
[[noreturn]] void fail_job(forge::dist::Group& group, const std::string& cmd, const char* what) {
  if (!group.root()) std::this_thread::sleep_for(std::chrono::seconds(2));
  std::fprintf(stderr, "attnforge %s: rank %d of %d: error: %s\n", cmd.c_str(), group.rank(),
               group.size(), what);
  std::fflush(stderr);
  group.abort(1);
}

int run_command(const std::string& cmd, const std::vector<std::string>& args) {
  const int world = forge::dist::Group::world().size();
  if (world > 1 && cmd != "train" && cmd != "eval")
    throw UsageError(
        fmt::format("{} runs in one process; only train and eval run under mpirun "
                    "(this is rank {} of {})",
                    cmd, forge::dist::Group::world().rank(), world));
  if (cmd == "train") return cmd_train(args);
  if (cmd == "eval") return cmd_eval(args);
  if (cmd == "generate") return cmd_generate(args);
  if (cmd == "predict") return cmd_predict(args);
  if (cmd == "export") return cmd_export(args);
  if (cmd == "attention-maps") return cmd_attention_maps(args);
  if (cmd == "gradcheck") return cmd_gradcheck(args);
  if (cmd == "bench") return cmd_bench(args);
  if (cmd == "info") return cmd_info(args);
  if (cmd == "data") return cmd_data(args);
  if (cmd == "recipe-reference") {
    if (wants_help(args)) {
      std::fputs(kRecipeReferenceHelp, stdout);
      return 0;
    }
    if (!args.empty())
      throw UsageError(fmt::format("recipe-reference takes no arguments, got {}", args[0]));
    std::fputs(forge::train::recipe_reference_markdown().c_str(), stdout);
    return 0;
  }
  throw UsageError(fmt::format("unknown command '{}'", cmd));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(kMainHelp, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "version") {
    std::printf("attnforge %s (%s)\n", forge::version(), forge::git_commit());
    return 0;
  }
  // Errors name what and where in the user's terms; ATTNFORGE_DEBUG=1 adds the
  // source line that raised them.
  const char* debug = std::getenv("ATTNFORGE_DEBUG");
  const auto shown = [&](const std::exception& e) {
    return debug && *debug && std::string(debug) != "0" ? std::string(e.what())
                                                        : forge::message_of(e);
  };
  const std::string cmd = args[0];
  args.erase(args.begin());
  forge::dist::Group* group = nullptr;
  int code = 0;
  try {
    group = &forge::dist::Group::world();  // initialises MPI under mpirun
    code = run_command(cmd, args);
  } catch (const UsageError& e) {
    // Every rank reads the same command line: rank 0 says it.
    if (!group || group->root()) {
      const bool known = cmd == "train" || cmd == "eval" || cmd == "generate" || cmd == "predict" ||
                         cmd == "export" || cmd == "attention-maps" || cmd == "gradcheck" ||
                         cmd == "bench" || cmd == "info" || cmd == "data" ||
                         cmd == "recipe-reference";
      std::fprintf(stderr, "attnforge: %s\n(attnforge %s--help for the options)\n", e.what(),
                   known ? (cmd + " ").c_str() : "");
    }
    code = 2;
  } catch (const std::exception& e) {
    if (group && group->size() > 1) fail_job(*group, cmd, shown(e).c_str());
    std::fprintf(stderr, "attnforge %s: error: %s\n", cmd.c_str(), shown(e).c_str());
    code = 1;
  }
  if (group) group->finalize();
  return code;
}
