// The text of `attnforge COMMAND --help` for each command of the table in
// apps/attnforge.cpp (the one-line summaries of `attnforge --help` are there).
#pragma once

namespace forge::cli {

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

Runs every attention case's gradient check (float64 central differences,
eps 1e-6, atol 1e-5, rtol 1e-3 unless a case says otherwise) and prints a
pass/fail table. OP selects cases whose name starts with it (e.g. softmax,
favor/relu); none runs them all. Then prints TaylorShift's direct-vs-efficient
form difference.

options:
  --list     list the case names and exit
  --help     this text
Exit status 1 when any case fails.
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

}  // namespace forge::cli
