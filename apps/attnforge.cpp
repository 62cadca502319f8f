// attnforge: the command-line program. Each command is one row of the table
// kCommands below (name, one-line summary, --help text, options, positional
// arguments, whether it runs under mpirun, and the function that runs it);
// apps/options.h parses every command line; apps/help_texts.h holds the
// --help texts. The work itself is in the library (train/, data/, ops/).
//
// Data parallelism: `mpirun -np N attnforge train|eval ...` (docs/DISTRIBUTED.md).
// Rank 0 prints; a rank that fails prints its error and ends the whole job.
//
// Exit status: 0 done, 1 bad input or a failed run (the message says what and
// where), 2 bad command line, 130 / 143 stopped by SIGINT / SIGTERM after
// writing a checkpoint.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "apps/help_texts.h"
#include "apps/options.h"
#include "autograd/gradcheck.h"
#include "core/device.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/threading.h"
#include "core/version.h"
#include "data/lra_release.h"
#include "dist/group.h"
#include "ops/attention/attention.h"
#include "ops/attention/cases.h"
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
#include "train/resume.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using forge::cli::Args;
using forge::cli::OptionSpec;
using forge::cli::UsageError;
using forge::train::Recipe;
constexpr auto kFlag = OptionSpec::flag;
constexpr auto kValue = OptionSpec::value;
constexpr auto kRepeated = OptionSpec::repeated;

std::atomic<int> g_signal{0};
// The first SIGINT / SIGTERM asks the trainer to checkpoint and stop after the
// current step; a second one ends the process at once (the default action).
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

// The trainer's stop poll: a first SIGINT / SIGTERM (on_signal).
bool signalled(int64_t /*step*/) {
  return g_signal.load() != 0;
}

int cmd_train(const Args& a) {
  const std::string recipe_path = a.positional.empty() ? "" : a.positional[0];
  if (a.has("--resume") == !recipe_path.empty())
    throw UsageError("train: give a recipe file, or --resume RUN_DIR (not both)");
  forge::train::TrainOptions options;
  Recipe recipe;
  if (a.has("--resume")) {
    forge::train::ResumePlan plan = forge::train::plan_resume(a.text("--resume"), a.text("--out"));
    recipe = std::move(plan.recipe);
    options = std::move(plan.options);
  } else {
    recipe = Recipe::from_file(recipe_path);
    options.run_dir = a.text("--out");
  }
  for (const std::string& s : a.all("--set")) recipe.set(s);
  if (a.flag("--dump-config")) {
    std::vector<std::string> notes;
    const Recipe resolved = forge::train::resolve_recipe(recipe, &notes);
    for (const std::string& n : notes)
      std::fprintf(stderr, "attnforge train: note: %s\n", n.c_str());
    std::fputs(resolved.to_yaml().c_str(), stdout);
    return 0;
  }
  options.check_nan = a.flag("--check-nan");
  options.stop_requested = signalled;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto result = forge::train::train(recipe, options);
  if (result.status == forge::train::TrainResult::Status::interrupted)
    return g_signal.load() == SIGTERM ? 143 : 130;
  return 0;
}

// eval's JSON beside its confusion matrix: FILE.json -> FILE-confusion.svg.
std::string confusion_svg_of(const std::string& json_path) {
  fs::path svg(json_path);
  svg.replace_filename(svg.stem().string() + "-confusion.svg");
  return svg.string();
}

int cmd_eval(const Args& a) {
  if (a.positional.empty()) throw UsageError("eval: give a checkpoint or a run directory");
  std::string out = a.text("--out");
  const bool ema = a.flag("--ema"), root = forge::dist::Group::world().root();
  if (!out.empty() && root) {  // checked before the evaluation, which may take long
    forge::train::check_output_file(out, "eval --out", a.flag("--overwrite"));
    forge::train::check_output_file(confusion_svg_of(out), "eval --out (its confusion matrix)",
                                    a.flag("--overwrite"));
  }
  const auto r = forge::train::evaluate_checkpoint(a.positional[0], a.text("--split"),
                                                   a.all("--set"), ema);
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
    forge::train::check_output_file(confusion_svg_of(out), "eval (its default output)", true);
  }
  forge::io::write_file_atomic(out, text);
  std::fprintf(stderr, "wrote %s\n", out.c_str());
  if (r.confusion.empty()) return 0;
  const std::string title = fmt::format("{} on {} (step {}): accuracy {:.2f}%",
                                        fs::path(r.checkpoint).filename().string(), r.split,
                                        r.step, 100 * r.accuracy);
  forge::io::write_file_atomic(confusion_svg_of(out), forge::train::render_confusion_svg(
                                                          r.confusion, r.class_names, title));
  std::fprintf(stderr, "wrote %s\n", confusion_svg_of(out).c_str());
  return 0;
}

int cmd_generate(const Args& a) {
  forge::train::GenerateRequest q;
  if (a.has("--prompt") && a.has("--prompt-file"))
    throw UsageError("generate: give one of --prompt and --prompt-file");
  q.prompt = a.has("--prompt-file") ? forge::io::read_file(a.text("--prompt-file"), 1 << 24)
                                    : a.text("--prompt");
  q.source = a.text("--source");
  q.length = a.number<int64_t>("--length", q.length);
  q.temperature = a.number<double>("--temperature", q.temperature);
  q.top_k = a.number<int64_t>("--top-k", q.top_k);
  q.filter_thres = a.number<double>("--filter-thres", q.filter_thres);
  q.greedy = a.flag("--greedy");
  q.exact_window = a.flag("--exact-window");
  q.seed = a.number<uint64_t>("--seed", q.seed);
  q.eos = a.number<int64_t>("--eos", q.eos);
  q.logits_file = a.text("--logits");
  q.overwrite = a.flag("--overwrite");
  q.overrides = a.all("--set");
  if (a.positional.empty()) throw UsageError("generate: give a checkpoint or run directory");
  q.checkpoint = a.positional[0];
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

int cmd_predict(const Args& a) {
  forge::train::PredictRequest q;
  q.top_k = a.number<int64_t>("--top-k", q.top_k);
  q.ema = a.flag("--ema");
  q.batch_size = a.number<int64_t>("--batch-size", q.batch_size);
  q.limit = a.number<int64_t>("--limit", q.limit);
  q.overrides = a.all("--set");
  if (a.has("--batch-size") && q.batch_size < 1)
    throw UsageError("predict: --batch-size must be 1 or more");
  if (a.has("--limit") && q.limit < 1) throw UsageError("predict: --limit must be 1 or more");
  if (a.positional.size() < 2)
    throw UsageError("predict: give a checkpoint (or run directory) and at least one input file");
  q.checkpoint = a.positional[0];
  q.inputs.assign(a.positional.begin() + 1, a.positional.end());
  if (q.top_k < 1) throw UsageError("predict: --top-k must be 1 or more");
  const std::string out = a.text("--out");
  if (!out.empty()) forge::train::check_output_file(out, "predict --out", a.flag("--overwrite"));
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

int cmd_export(const Args& a) {
  forge::train::ExportRequest q;
  q.out_dir = a.text("--out");
  q.overwrite = a.flag("--overwrite");
  q.format = a.text("--format", q.format);
  q.ema = a.flag("--ema");
  if (a.positional.empty() || q.out_dir.empty())
    throw UsageError("export: give a checkpoint (or run directory) and --out DIR");
  q.checkpoint = a.positional[0];
  const auto r = forge::train::export_checkpoint(q);
  std::fprintf(stderr, "exported %s (%lld tensors) to %s: %smodel.safetensors, config.json\n",
               r.checkpoint.c_str(), static_cast<long long>(r.tensors), r.dir.c_str(),
               q.format == "timm" ? "" : "model.py, ");
  return 0;
}

int cmd_attention_maps(const Args& a) {
  if (a.positional.size() < 2)
    throw UsageError("attention-maps: give a checkpoint (or run directory) and an input file");
  const std::string &ckpt = a.positional[0], &input = a.positional[1];
  const int64_t index = a.number<int64_t>("--index", 0);
  std::string out = a.text("--out");
  if (!out.empty()) forge::train::check_output_dir(out, "attention-maps --out", a.flag("--overwrite"));
  const auto model = forge::train::load_classifier(ckpt, a.all("--set"), "attention-maps",
                                                   a.flag("--ema"));
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

// The attention cases whose names start with one of `prefixes` (all without).
std::vector<const forge::ops::attention::AttentionCase*> gradcheck_cases(
    const std::vector<std::string>& prefixes) {
  const auto& all = forge::ops::attention::attention_cases();
  std::vector<const forge::ops::attention::AttentionCase*> cases;
  for (const auto& c : all) {
    bool match = prefixes.empty();
    for (const auto& p : prefixes) match = match || c.name.rfind(p, 0) == 0;
    if (match) cases.push_back(&c);
  }
  if (cases.empty()) {
    std::string names;
    for (const auto& c : all) names += "  " + c.name + "\n";
    throw UsageError(fmt::format("gradcheck: no case matches; the cases are:\n{}", names));
  }
  return cases;
}

int cmd_gradcheck(const Args& a) {
  const auto cases = gradcheck_cases(a.positional);
  if (a.flag("--list")) {
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
      r = forge::autograd::gradcheck(c->fn, c->make_inputs(c->dims), c->gradcheck);
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
  bool taylorshift = a.positional.empty();
  for (const auto& p : a.positional) taylorshift = taylorshift || p.rfind("taylorshift", 0) == 0;
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

int cmd_data(const Args& a) {
  if (a.positional.empty() || !a.has("--from"))
    throw UsageError(
        "data: give a task (listops, text, retrieval, image, pathfinder) and --from DIR");
  const std::string& task_name = a.positional[0];
  forge::data::LraTask task;
  try {
    task = forge::data::lra_task_from_name(task_name);
  } catch (const forge::Error& e) {
    throw UsageError(forge::message_of(e));
  }
  const std::string out = a.text("--out", forge::data::lra_default_dir(task));
  const forge::data::PreparedLra p = forge::data::prepare_lra(task, a.text("--from"), out);
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

int cmd_info(const Args&) {
#ifdef NDEBUG
  const char* type = "optimised (NDEBUG)";
#else
  const char* type = "debug";
#endif
#if defined(__clang__)
  const std::string compiler = fmt::format("clang {}", __clang_version__);
#else
  const std::string compiler = fmt::format("gcc {}", __VERSION__);
#endif
  std::printf("attnforge %s (%s)\n", forge::version(), forge::git_commit());
  std::printf("  compiler     %s, C++ %ld\n", compiler.c_str(), static_cast<long>(__cplusplus));
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

int cmd_recipe_reference(const Args&) {
  std::fputs(forge::train::recipe_reference_markdown().c_str(), stdout);
  return 0;
}

// ---- the table of commands ----

struct Command {
  const char* name;
  const char* summary;  // its line in `attnforge --help`
  const char* help;     // `attnforge NAME --help`
  std::vector<OptionSpec> options;
  // What each positional argument is, for errors ("one checkpoint"); with
  // more_positional the last kind repeats.
  std::vector<std::string> positional;
  bool more_positional = false;
  int (*run)(const Args&);
  bool under_mpirun = false;  // runs in every process of `mpirun -np N` (else one process only)
};

const std::vector<Command>& commands() {
  using namespace forge::cli;
  static const std::vector<Command> table = {
      {"train", "train a recipe, or continue a run (--resume RUN_DIR)", kTrainHelp,
       {{"--set", kRepeated}, {"--resume", kValue}, {"--out", kValue},
        {"--dump-config", kFlag}, {"--check-nan", kFlag}},
       {"one recipe"}, false, cmd_train, true},
      {"eval", "evaluate a checkpoint on a split", kEvalHelp,
       {{"--split", kValue}, {"--ema", kFlag}, {"--overwrite", kFlag}, {"--out", kValue},
        {"--set", kRepeated}},
       {"one checkpoint"}, false, cmd_eval, true},
      {"predict", "run a trained classifier on new inputs (images, IDX, TSV) -> JSON lines",
       kPredictHelp,
       {{"--top-k", kValue}, {"--ema", kFlag}, {"--overwrite", kFlag}, {"--batch-size", kValue},
        {"--limit", kValue}, {"--out", kValue}, {"--set", kRepeated}},
       {"a checkpoint", "an input"}, true, cmd_predict},
      {"export", "write a checkpoint as plain PyTorch (model.py, model.safetensors, config.json)",
       kExportHelp, {{"--out", kValue}, {"--overwrite", kFlag}, {"--format", kValue},
                     {"--ema", kFlag}},
       {"one checkpoint"}, false, cmd_export},
      {"attention-maps",
       "draw a classifier's attention (per layer and head, rollout for ViTs) on one input",
       kAttentionMapsHelp,
       {{"--index", kValue}, {"--ema", kFlag}, {"--overwrite", kFlag}, {"--out", kValue},
        {"--set", kRepeated}},
       {"a checkpoint", "one input"}, false, cmd_attention_maps},
      {"generate",
       "continue a text with a language model, or decode a source with an encoder-decoder",
       kGenerateHelp,
       {{"--prompt", kValue}, {"--prompt-file", kValue}, {"--source", kValue},
        {"--length", kValue}, {"--temperature", kValue}, {"--top-k", kValue},
        {"--filter-thres", kValue}, {"--greedy", kFlag}, {"--exact-window", kFlag},
        {"--seed", kValue}, {"--eos", kValue}, {"--logits", kValue}, {"--overwrite", kFlag},
        {"--set", kRepeated}},
       {"one checkpoint"}, false, cmd_generate},
      {"data",
       "prepare a Long Range Arena task's data from its public release (data TASK --from DIR)",
       kDataHelp, {{"--from", kValue}, {"--out", kValue}}, {"one task"}, false, cmd_data},
      {"gradcheck", "check every attention op's backward against finite differences (f64)",
       kGradcheckHelp, {{"--list", kFlag}}, {"an op"}, true, cmd_gradcheck},
      {"info", "the build, BLAS, threads and CUDA devices", kInfoHelp, {}, {}, false, cmd_info},
      {"recipe-reference",
       "print every recipe key with its type, default and meaning (Markdown)",
       kRecipeReferenceHelp, {}, {}, false, cmd_recipe_reference},
  };
  return table;
}

const Command* find_command(const std::string& name) {
  for (const Command& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::string main_help() {
  std::string s =
      "attnforge: train efficient-attention transformers from YAML recipes.\n\n"
      "usage: attnforge COMMAND [options]      (attnforge COMMAND --help for each)\n\n"
      "commands:\n";
  for (const Command& c : commands()) s += fmt::format("  {:<9}  {}\n", c.name, c.summary);
  return s + "\n  --version  the version and the git commit of this build\n";
}

bool wants_help(const std::vector<std::string>& args) {
  return std::find(args.begin(), args.end(), "--help") != args.end() ||
         std::find(args.begin(), args.end(), "-h") != args.end();
}

int run_command(const std::string& name, const std::vector<std::string>& args) {
  const Command* c = find_command(name);
  if (!c) throw UsageError(fmt::format("unknown command '{}'", name));
  const auto& world = forge::dist::Group::world();
  if (world.size() > 1 && !c->under_mpirun)
    throw UsageError(fmt::format("{} runs in one process; only train and eval run under mpirun "
                                 "(this is rank {} of {})",
                                 name, world.rank(), world.size()));
  if (wants_help(args)) {
    std::fputs(c->help, stdout);
    return 0;
  }
  return c->run(
      forge::cli::parse_args(name, args, c->options, c->positional, c->more_positional));
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

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::fputs(main_help().c_str(), args.empty() ? stderr : stdout);
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
    if (!group || group->root())
      std::fprintf(stderr, "attnforge: %s\n(attnforge %s--help for the options)\n", e.what(),
                   find_command(cmd) ? (cmd + " ").c_str() : "");
    code = 2;
  } catch (const std::exception& e) {
    if (group && group->size() > 1) fail_job(*group, cmd, shown(e).c_str());
    std::fprintf(stderr, "attnforge %s: error: %s\n", cmd.c_str(), shown(e).c_str());
    code = 1;
  }
  if (group) group->finalize();
  return code;
}
