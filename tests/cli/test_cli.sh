#!/usr/bin/env bash
# The attnforge command end to end: help texts, bad command lines and recipes
# (clear message, non-zero status), --dump-config, a run stopped by SIGINT
# that writes a checkpoint and resumes to completion, eval, a language model
# trained from the demo recipe and generate from it, gradcheck, info.
#   tests/cli/test_cli.sh PATH/TO/attnforge
set -uo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
src="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/attnforge_cli.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export ATTNFORGE_CACHE="${ATTNFORGE_CACHE:-$work/cache}"  # generated data (ctest sets one)
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect STATUS PATTERN -- command...: the exit status and a line of its output.
expect() {
  local want="$1" pattern="$2"
  shift 3
  local out status
  out="$("$@" 2>&1)"
  status=$?
  [ "$status" -eq "$want" ] || fail "$* exited $status, expected $want; output: $out"
  grep -qE -- "$pattern" <<<"$out" || fail "$* did not print /$pattern/; output: $out"
}

cat >"$work/tiny.yaml" <<'EOF'
name: cli
threads: 2
model: {type: vit, image_size: 28, patch_size: 7, dim: 32, depth: 1, heads: 2, mlp_ratio: 2}
data: {dataset: fashion_mnist, limit_train: 2048, limit_eval: 128, workers: 1}
schedule: {kind: cosine, warmup_steps: 5}
loop: {epochs: 0, steps: 400, batch_size: 32, log_every: 5, eval_every: 200}
checkpoint: {every: 100}
EOF

# The repository stands alone: no file points to the design notes beside it (dot-dot/shared).
outside="$(grep -rln '\.\./shared' "$src" --include='*.md' --include='*.h' --include='*.cpp' \
  --include='*.cu' --include='*.cuh' --include='*.py' --include='*.sh' --include='*.txt' \
  --exclude-dir=build --exclude-dir=.git 2>/dev/null)"
[ -z "$outside" ] || fail "files point outside the repository: $outside"

# ---- help and bad command lines ----
expect 0 "commands:" -- "$bin" --help
for cmd in train eval predict export attention-maps generate data gradcheck info recipe-reference; do
  expect 0 "usage: attnforge $cmd" -- "$bin" "$cmd" --help
  grep -q "^  $cmd  *[a-z]" <<<"$("$bin" --help)" || fail "attnforge --help does not list $cmd"
done
expect 2 "info takes no arguments" -- "$bin" info extra
expect 2 "export: unknown option --ema=1" -- "$bin" export x --format=timm --out y --ema=1
expect 2 "recipe-reference takes no arguments" -- "$bin" recipe-reference extra
expect 2 "unknown command 'trian'" -- "$bin" trian
expect 2 "train: unknown option --bogus" -- "$bin" train "$work/tiny.yaml" --bogus
expect 2 "give a recipe file, or --resume" -- "$bin" train
expect 2 "--set needs a value" -- "$bin" train "$work/tiny.yaml" --set

# ---- bad recipes: status 1, the key named ----
printf 'model:\n  dimm: 3\n' >"$work/bad.yaml"
expect 1 "unknown key 'model.dimm'" -- "$bin" train "$work/bad.yaml" --out "$work/bad_run"
[ ! -e "$work/bad_run" ] || fail "a bad recipe created its run directory"
expect 1 "'loop.batch_size' = 0 is out of range" -- "$bin" train "$work/tiny.yaml" --set loop.batch_size=0
expect 1 "at least .* parameters [(]model.dim = 2000000000, .*more than this machine's .* GB of memory" -- \
  "$bin" train "$work/tiny.yaml" --set model.dim=2000000000 --set model.heads=1 --out "$work/huge"
[ ! -e "$work/huge" ] || fail "a model too large for the machine left its run directory"
expect 1 "cannot open the file" -- "$bin" train "$work/missing.yaml"

# ---- hostile recipes: refused before anything is written, never a hang ----
: >"$work/empty.yaml"
expect 1 "is empty" -- "$bin" train "$work/empty.yaml" --out "$work/empty_run"
[ ! -e "$work/empty_run" ] || fail "an empty recipe created its run directory"
expect 1 "is a directory" -- "$bin" train "$work" --dump-config
printf 'name: ../../escape\n' >"$work/escape.yaml"
expect 1 "'name' = '../../escape'" -- "$bin" train "$work/escape.yaml"
# More batch than data: refused at once (it used to spin forever).
expect 1 "batch" -- timeout 60 "$bin" train "$work/tiny.yaml" --set data.limit_train=100 \
  --set loop.batch_size=500 --out "$work/no_batch"
[ ! -e "$work/no_batch" ] || fail "a start that makes no batch created its run directory"
expect 1 "no such run directory" -- "$bin" train --resume "$work/never_ran"
mkdir -p "$work/killed_early"
expect 1 "stopped before it started.*--out" -- "$bin" train --resume "$work/killed_early"
# A failed start does not block its directory: fixed, it trains there.
expect 1 "not divisible" -- "$bin" train "$work/tiny.yaml" --set loop.steps=4 --set model.heads=3 \
  --out "$work/retry"
expect 0 "done: 4 steps" -- "$bin" train "$work/tiny.yaml" --set loop.steps=4 --out "$work/retry"
# A warmup longer than a short trial run is cut to it, with a warning.
expect 0 "warmup of 5 steps, longer than this run's 4 steps: the warmup is cut to 4" -- \
  "$bin" train "$work/tiny.yaml" --set loop.steps=4 --out "$work/short"

# ---- small things a user meets first ----
expect 0 "^attnforge [0-9]+[.][0-9]+[.][0-9]+ [(]" -- "$bin" --version
expect 2 "unknown command 'bench'" -- "$bin" bench
printf 'model:\n  attention:\n    knd: favor\n' >"$work/typo.yaml"
expect 1 "Did you mean 'model.attention.kind'" -- "$bin" train "$work/typo.yaml"
expect 1 "Did you mean 'optimizer.lr'" -- "$bin" train "$work/tiny.yaml" --set model.lr=1
printf 'model:\n  dim: 64\n  dim: 32\n' >"$work/dup.yaml"
expect 1 "'model.dim' is given twice in one mapping [(]first at line 2[)]" -- "$bin" train "$work/dup.yaml"
# User-facing errors carry no source location; ATTNFORGE_DEBUG=1 adds it.
out="$("$bin" train "$work/typo.yaml" 2>&1)"
grep -qE '[(][a-z_]+/[a-z_]+[.](cpp|h):[0-9]+[)]' <<<"$out" && fail "a user error shows a source location: $out"
expect 1 "[(]train/recipe[.]cpp:[0-9]+[)]" -- env ATTNFORGE_DEBUG=1 "$bin" train "$work/typo.yaml"

# ---- --dump-config: every check a start makes, then the recipe resolved ----
expect 0 "kind: linformer" -- "$bin" train "$work/tiny.yaml" --set model.attention.kind=linformer --dump-config
dump="$("$bin" train "$work/tiny.yaml" --dump-config 2>&1)"
for want in "classes: 10" "channels: 1" "head_dim: 16" "mlp_dim: 64" "norm_eps: 1e-06"; do
  grep -q "$want" <<<"$dump" || fail "--dump-config does not resolve '$want': $dump"
done
expect 1 "model.dim = 32 is not divisible by model.heads = 5" -- \
  "$bin" train "$work/tiny.yaml" --set model.heads=5 --dump-config
expect 1 "model.patch_size = 5 does not divide model.image_size = 28" -- \
  "$bin" train "$work/tiny.yaml" --set model.patch_size=5 --dump-config
expect 1 "per_layer has 2 entries but model.depth is 1" -- \
  "$bin" train "$work/tiny.yaml" --set "model.attention.per_layer=[softmax, linear]" --dump-config

# ---- run directories: runs/<name>-<N> when none is given ----
(cd "$work" && "$bin" train tiny.yaml --set loop.steps=2 --set schedule.warmup_steps=1 >versions.log 2>&1 &&
  "$bin" train tiny.yaml --set loop.steps=2 --set schedule.warmup_steps=1 >>versions.log 2>&1) ||
  fail "versioned runs: $(cat "$work/versions.log")"
[ -f "$work/runs/cli-1/checkpoints/latest" ] && [ -f "$work/runs/cli-2/checkpoints/latest" ] ||
  fail "two runs of one recipe did not go to runs/cli-1 and runs/cli-2: $(ls "$work/runs")"

# ---- SIGINT writes a checkpoint; --resume finishes the run ----
run="$work/run"
"$bin" train "$work/tiny.yaml" --out "$run" >"$work/train1.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  grep -q "step .*/400" "$work/train1.log" 2>/dev/null && break
  sleep 0.1
done
kill -INT "$pid"
wait "$pid"
status=$?
[ "$status" -eq 130 ] || fail "SIGINT: exit status $status, expected 130; log: $(cat "$work/train1.log")"
grep -q "continue with: attnforge train --resume" "$work/train1.log" || fail "SIGINT: no resume hint"
# The progress line gives its rate's unit; a line comes after the first step,
# before the first log_every steps; a ViT's tokens are its 16 patches and class token.
grep -q "step 1 done in .*; progress every 5 steps (loop.log_every), ETA" "$work/train1.log" ||
  fail "nothing said after the first step: $(head -20 "$work/train1.log")"
grep -q "step .*/400 .* img/s  [0-9]* ms/step" "$work/train1.log" || fail "the progress line has no img/s"
python3 - "$run/metrics.jsonl" <<'PY' || fail "a ViT's tokens_per_s is not 17 tokens a picture"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r["split"] == "train"][0]
assert abs(r["tokens_per_s"] / r["samples_per_s"] - 17) < 1e-9, r
PY
[ -f "$run/checkpoints/latest" ] || fail "SIGINT: no checkpoint written"
expect 0 "done: steps [0-9]+ to 400 of 400" -- "$bin" train --resume "$run"
expect 1 "already holds a run" -- "$bin" train "$work/tiny.yaml" --out "$run"

expect 0 "nothing to train, the run had finished [(]step 400 of 400[)]" -- "$bin" train --resume "$run"
[ -f "$run/metrics.csv" ] && head -1 "$run/metrics.csv" | grep -q "^step,split,epoch,loss,accuracy,lr" ||
  fail "no metrics.csv with a header: $(head -2 "$run/metrics.csv")"
[ "$(grep -c ',eval,' "$run/metrics.csv")" -eq 2 ] || fail "metrics.csv: expected 2 eval rows"
# TensorBoard: one event file after the stop and the resume, with every logged step.
events=("$run"/events.out.tfevents.*)
[ "${#events[@]}" -eq 1 ] || fail "expected one TensorBoard event file, found ${#events[@]}"
[ "$(/usr/bin/python3 "$src/tests/train/read_tfevents.py" "${events[0]}" | grep -c '"tag": "train/loss"')" -eq 80 ] ||
  fail "the event file does not hold the 80 logged train losses"

# ---- eval prints and writes JSON; it takes a run, latest, best or a step ----
ckpt="$run/checkpoints/$(cat "$run/checkpoints/latest")"
expect 0 '"accuracy"' -- "$bin" eval "$ckpt" --split test
ls "$run"/eval-step-00000400-test.json >/dev/null 2>&1 || fail "eval wrote no JSON file"
# The whole split, not the training run's data.limit_eval of 128, unless told.
expect 0 '"examples": 10000' -- "$bin" eval "$run"
expect 0 '"examples": 64' -- "$bin" eval "$run/checkpoints/latest" --set data.limit_eval=64
expect 0 '"step": (200|400)' -- "$bin" eval "$run/checkpoints/best" --set data.limit_eval=64
expect 0 '"step": 300' -- "$bin" eval "$run/checkpoints/step-00000300" --set data.limit_eval=64
expect 1 "nope: no such file or directory.*; $work holds the run[s]? .*run" -- "$bin" eval "$work/nope"
# A checkpoint that is not there: the error lists those that are.
expect 1 "step-00000301: no such file or directory.*$run/checkpoints holds: best, latest, .*step-00000400" -- \
  "$bin" eval "$run/checkpoints/step-00000301"
expect 1 "neither a checkpoint .* nor a run directory" -- "$bin" eval "$work"

# Classifiers also get top-5, per-class accuracy and the confusion matrix (JSON and SVG).
expect 0 '"top5_accuracy"' -- "$bin" eval "$run" --set data.limit_eval=200 --out "$work/ev.json"
grep -q '"per_class"' "$work/ev.json" && grep -q '"name": "Ankle boot"' "$work/ev.json" ||
  fail "eval: no per-class accuracy with class names"
grep -q 'data-cell="9 9"' "$work/ev-confusion.svg" 2>/dev/null || fail "eval: no confusion matrix SVG"

# ---- predict: new inputs through a trained model ----
fmnist=/usr/share/datasets/fashion-mnist
"$bin" predict "$run" "$fmnist/t10k-images-idx3-ubyte.gz" --out "$work/pred.jsonl" 2>"$work/pred.log" ||
  fail "predict on an IDX file: $(cat "$work/pred.log")"
"$bin" eval "$run" --out "$work/ev_all.json" >/dev/null 2>&1
python3 - "$work/pred.jsonl" "$fmnist/t10k-labels-idx1-ubyte.gz" "$work/ev_all.json" <<'PY' || fail "predict disagrees with eval"
import gzip, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
labels = gzip.open(sys.argv[2]).read()[8:]
acc = sum(r["top_k"][0]["class"] == labels[i] for i, r in enumerate(rows)) / len(rows)
want = json.load(open(sys.argv[3]))["accuracy"]
assert len(rows) == 10000 and rows[3]["input"].endswith("#3"), (len(rows), rows[3]["input"])
assert len(rows[0]["top_k"]) == 5 and len(rows[0]["probabilities"]) == 10
assert abs(sum(rows[0]["probabilities"]) - 1) < 1e-9
assert acc == want, (acc, want)
PY
# A PNG (gray 28x28, written here with zlib) goes through the same path.
python3 - "$work/shirt.png" <<'PY'
import struct, sys, zlib
w = h = 28
raw = b"".join(b"\x00" + bytes((x * 9 + y * 5) % 256 for x in range(w)) for y in range(h))
def chunk(t, d): return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
open(sys.argv[1], "wb").write(png + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
PY
expect 0 '"input":"[^"]*shirt.png","top_k":\[\{"class":[0-9],"name":"[^"]+","probability"' -- \
  "$bin" predict "$run" "$work/shirt.png" --top-k 2
expect 1 "takes pictures" -- "$bin" predict "$run" "$work/tiny.yaml"
expect 1 "no such file" -- "$bin" predict "$run" "$work/nothing.png"
expect 1 "input .*: a directory; give the files in it" -- "$bin" predict "$run" "$work/"
# The first N images of an IDX file.
[ "$("$bin" predict "$run" "$fmnist/t10k-images-idx3-ubyte.gz" --limit 7 2>/dev/null | grep -c '"top_k"')" -eq 7 ] ||
  fail "predict --limit 7 did not give 7 lines"
expect 2 "predict: --limit must be 1 or more" -- "$bin" predict "$run" "$work/shirt.png" --limit 0
expect 2 "predict: --batch-size must be 1 or more" -- "$bin" predict "$run" "$work/shirt.png" --batch-size 0
# A sequence classifier (ListOps, generated into the cache) on a TSV of expressions.
lo="$work/listops"
expect 0 "done: 2 steps" -- "$bin" train "$src/recipes/lra/listops.yaml" --set data.synthetic=true --set data.generate_train=64 \
  --set data.generate_eval=16 --set data.generate_min_length=5 --set data.generate_max_length=40 \
  --set model.dim=16 --set model.depth=1 --set model.heads=2 --set loop.steps=2 --set loop.batch_size=8 \
  --set schedule.warmup_steps=1 --set threads=2 --out "$lo"
grep -q "step .* seq/s  [0-9]* ms/step" "$lo/train.log" || fail "a sequence classifier's progress line has no seq/s"
# Generated stand-ins are said at warning level at the start and the end.
[ "$(grep -c "warning.*data.synthetic: this run trains and evaluates on generated stand-in data" "$lo/train.log")" -eq 2 ] ||
  fail "a data.synthetic run did not warn at its start and end: $(cat "$lo/train.log")"
printf 'Source\tTarget\n[MAX 2 9 [MIN 4 7 ] 0 ]\t9\n\n[SM 1 2 3 ]\n' >"$work/exprs.tsv"
out="$("$bin" predict "$lo" "$work/exprs.tsv" --top-k 3 2>&1)"
[ "$(grep -c '"top_k"' <<<"$out")" -eq 2 ] && grep -q 'exprs.tsv:4"' <<<"$out" ||
  fail "predict on a TSV of ListOps expressions: $out"
# The generated data's own files predict as they are (header skipped).
expect 0 "basic_val.tsv:2\"" -- "$bin" predict "$lo" "$ATTNFORGE_CACHE"/listops-*/basic_val.tsv
printf '[MAX 2 bogus ]\n' >"$work/bad_exprs.tsv"
expect 1 "bad_exprs.tsv:1" -- "$bin" predict "$lo" "$work/bad_exprs.tsv"

# ---- attention maps of a checkpoint on one input ----
expect 0 "#2: 5 images of 1 layer[(]s[)] [(]1 with explicit maps[)], rollout included" -- \
  "$bin" attention-maps "$run" "$fmnist/t10k-images-idx3-ubyte.gz" --index 2 --out "$work/maps"
[ -f "$work/maps/rollout.png" ] && [ -f "$work/maps/layer00_head01_image.png" ] ||
  fail "attention-maps: missing images: $(ls "$work/maps")"
expect 1 "--index 10000: .* holds 10000 example" -- \
  "$bin" attention-maps "$run" "$fmnist/t10k-images-idx3-ubyte.gz" --index 10000

# ---- no command writes into a checkpoint, or over what it was not told to replace ----
ck3="$run/checkpoints/step-00000300"
sums() { (cd "$1" && find . -type f -exec md5sum {} + | sort); }
before="$(sums "$run/checkpoints")"
expect 1 "inside the checkpoint directory .*step-00000300; no command writes into a checkpoint" -- \
  "$bin" eval "$run" --set data.limit_eval=64 --out "$ck3/model.safetensors"
expect 1 "inside the checkpoint directory" -- \
  "$bin" eval "$run" --set data.limit_eval=64 --out "$ck3/model.safetensors" --overwrite
expect 1 "inside the checkpoint directory" -- "$bin" predict "$run" "$work/shirt.png" --out "$ck3/state.json"
expect 1 "inside the checkpoint directory" -- "$bin" predict "$run" "$work/shirt.png" --out "$run/checkpoints/latest"
expect 1 "inside the checkpoint directory" -- "$bin" export "$run" --out "$run/checkpoints/exported"
expect 1 "inside the checkpoint directory" -- "$bin" attention-maps "$run" "$work/shirt.png" --out "$ck3/maps"
expect 1 "inside the checkpoint directory" -- "$bin" train "$work/tiny.yaml" --set loop.steps=1 \
  --out "$run/checkpoints/new_run"
[ "$(sums "$run/checkpoints")" = "$before" ] || fail "a refused command changed the checkpoints"
echo keep >"$work/keep.json"
expect 1 "keep.json: exists [(]a file of 5 bytes[)]; nothing was written. Give a new path, or add --overwrite" -- \
  "$bin" eval "$run" --set data.limit_eval=64 --out "$work/keep.json"
expect 1 "keep.json: exists .* add --overwrite" -- "$bin" predict "$run" "$work/shirt.png" --out "$work/keep.json"
[ "$(cat "$work/keep.json")" = keep ] || fail "a refused --out changed the file"
expect 0 '"accuracy"' -- "$bin" eval "$run" --set data.limit_eval=64 --out "$work/keep.json" --overwrite
mkdir -p "$work/maps_taken"
expect 1 "maps_taken: exists [(]a directory[)]; nothing was written" -- \
  "$bin" attention-maps "$run" "$work/shirt.png" --out "$work/maps_taken"
expect 0 "rollout included" -- "$bin" attention-maps "$run" "$work/shirt.png" --out "$work/maps_taken" --overwrite
# A subset's evaluation gets its own default file, beside the whole split's.
expect 0 '"examples": 64' -- "$bin" eval "$run" --set data.limit_eval=64
[ -f "$run/eval-step-00000400-test-first64.json" ] && [ -f "$run/eval-step-00000400-test.json" ] ||
  fail "eval: a subset's default file name is the whole split's: $(ls "$run")"

# ---- a damaged checkpoint is never replaced by another one ----
cp -r "$run" "$work/damaged"
python3 - "$work/damaged/checkpoints/step-00000400/model.safetensors" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-3] ^= 0x10; open(p, "wb").write(bytes(b))
PY
dmg="step-00000400, which is damaged.*No other checkpoint is used in its place: the newest intact one is .*step-00000300"
expect 1 "$dmg" -- "$bin" eval "$work/damaged" --set data.limit_eval=64
expect 1 "$dmg" -- "$bin" eval "$work/damaged/checkpoints/latest" --set data.limit_eval=64
expect 1 "$dmg" -- "$bin" predict "$work/damaged" "$work/shirt.png"
expect 1 "$dmg" -- "$bin" export "$work/damaged" --out "$work/pt_damaged"
expect 1 "$dmg" -- "$bin" attention-maps "$work/damaged" "$work/shirt.png" --out "$work/maps_damaged"
expect 1 "$dmg" -- "$bin" train "$work/tiny.yaml" --set model.init_from="$work/damaged" --dump-config
expect 1 "latest checkpoint is damaged" -- "$bin" train --resume "$work/damaged"
[ ! -e "$work/pt_damaged" ] && [ ! -e "$work/maps_damaged" ] || fail "a refused command wrote its output"
expect 0 '"step": 300' -- "$bin" eval "$work/damaged/checkpoints/step-00000300" --set data.limit_eval=64

# ---- --resume from an older checkpoint: a new run from it, the old one kept ----
expect 1 "not the latest checkpoint .* --out NEWDIR" -- "$bin" train --resume "$run/checkpoints/step-00000300"
expect 0 "done: steps 301 to 400 of 400" -- "$bin" train --resume "$run/checkpoints/step-00000300" \
  --out "$work/fork"
cmp -s "$work/fork/checkpoints/step-00000400/model.safetensors" \
  "$run/checkpoints/step-00000400/model.safetensors" ||
  fail "the run continued from step 300 does not end with the original's weights"
[ -d "$run/checkpoints/step-00000300" ] || fail "the fork changed the run it came from"

# ---- fine-tuning: model.init_from a checkpoint, with a frozen patch embedding ----
expect 0 "init_from .*step-00000[0-9]+: 24 tensors loaded" -- "$bin" train "$work/tiny.yaml" \
  --set model.init_from="$run/checkpoints/best" --set "optimizer.freeze=[patch_embed]" \
  --set loop.steps=20 --set loop.eval_every=20 --set schedule.warmup_steps=1 --out "$work/finetune"
grep -q "optimizer.freeze: not trained: 'patch_embed': 2 tensors of [0-9]* values (patch_embed.proj.bias, patch_embed.proj.weight)" \
  "$work/finetune/train.log" || fail "the log does not say what optimizer.freeze froze"
# It starts where the source ended: far above the 10% a fresh model starts at.
python3 - "$work/finetune/metrics.jsonl" <<'PY' || fail "the fine-tuned run did not start from the weights"
import json, sys
evals = [r for r in map(json.loads, open(sys.argv[1])) if r["split"] == "eval"]
assert evals and evals[-1]["accuracy"] > 0.5, evals
PY
cmp -s <(python3 -c "
import json, struct, sys
for p in sys.argv[1:]:
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
    o = h['patch_embed.proj.weight']['data_offsets']; f.seek(8 + n + o[0]); print(f.read(o[1] - o[0]).hex())
" "$run/checkpoints/$(cat "$run/checkpoints/best")/model.safetensors" \
  "$work/finetune/checkpoints/step-00000020/model.safetensors" | uniq | wc -l) <(echo 1) ||
  fail "optimizer.freeze: the frozen patch embedding moved during fine-tuning"
# ---- export --format pytorch: plain PyTorch that gives predict's logits ----
# (Debian's python3-torch; tests/export/check_export.py compares every logit, 1e-5 relative.)
check_export() {  # RUN INPUT NAME
  "$bin" export "$1" --out "$work/pt_$3" >/dev/null 2>&1 &&
    "$bin" predict "$1" "$2" --out "$work/pt_$3.jsonl" 2>/dev/null &&
    /usr/bin/python3 "$src/tests/export/check_export.py" "$work/pt_$3" "$2" "$work/pt_$3.jsonl" \
      >"$work/pt_$3.log" 2>&1 || fail "export $3: the PyTorch model disagrees: $(cat "$work/pt_$3.log")"
}
# The first 500 test images as a plain IDX file.
python3 -c "
import gzip, struct, sys
raw = gzip.open(sys.argv[1]).read()
open(sys.argv[2], 'wb').write(struct.pack('>IIII', 0x803, 500, 28, 28) + raw[16:16 + 500 * 784])
" "$fmnist/t10k-images-idx3-ubyte.gz" "$work/t500.idx"
check_export "$run" "$work/t500.idx" softmax_vit
expect 0 "done: 30 steps" -- "$bin" train "$work/tiny.yaml" --set model.attention.kind=favor \
  --set loop.steps=30 --set schedule.warmup_steps=1 --out "$work/favor"
check_export "$work/favor" "$work/t500.idx" favor_vit
printf '[MAX 2 9 [MIN 4 7 ] 0 ]\n[SM 1 2 3 ]\n[MED 5 [MAX 1 8 ] 3 0 ]\n' >"$work/exprs1.tsv"
check_export "$lo" "$work/exprs1.tsv" listops
# Token shift (the default recipe's 3x3 neighbourhood of patches; a padded
# sequence classifier with the default shifts).
expect 0 "done: 20 steps" -- "$bin" train "$work/tiny.yaml" --set model.dim=36 --set model.shift_tokens=true \
  --set "model.token_shifts=[0,1,-1,4,-4,3,-3,5,-5]" --set loop.steps=20 --set schedule.warmup_steps=1 \
  --out "$work/shift"
check_export "$work/shift" "$work/t500.idx" shift_vit
expect 1 "model.shift_tokens is true" -- "$bin" export "$work/shift" --format timm --out "$work/timm_shift"
expect 0 "done: 2 steps" -- "$bin" train "$lo/recipe.yaml" --set model.shift_tokens=true --out "$work/lo_shift"
check_export "$work/lo_shift" "$work/exprs1.tsv" shift_listops
[ -f "$work/pt_softmax_vit/model.py" ] && grep -q '"card"' "$work/pt_softmax_vit/config.json" ||
  fail "export: no model.py or no card in config.json"
expect 0 "done: 2 steps" -- "$bin" train "$work/tiny.yaml" --set model.reversible=true \
  --set model.norm=scale --set model.attention.local_heads=2 --set model.attention.local_window=4 \
  --set loop.steps=2 --set schedule.warmup_steps=1 --out "$work/reversible"
check_export "$work/reversible" "$work/t500.idx" reversible_vit

# ---- export --format timm: timm's VisionTransformer names, and back in through init_from ----
expect 0 "20 tensors" -- "$bin" export "$run" --format timm --out "$work/timm"
# The state dict timm.create_model(**kwargs) builds, written from timm's
# VisionTransformer (patch_embed.proj, cls_token, pos_embed, blocks.L.{norm1,
# attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}, norm, head), against the file.
python3 - "$work/timm" <<'PY' || fail "export --format timm: not timm's names and shapes"
import json, struct, sys
d = sys.argv[1]
k = json.load(open(d + "/config.json"))["timm"]["kwargs"]
f = open(d + "/model.safetensors", "rb"); n = struct.unpack("<Q", f.read(8))[0]
got = {name: t["shape"] for name, t in json.loads(f.read(n)).items() if name != "__metadata__"}
D, C, p, s = k["embed_dim"], k["in_chans"], k["patch_size"], k["img_size"]
H = int(D * k["mlp_ratio"])
want = {"patch_embed.proj.weight": [D, C, p, p], "patch_embed.proj.bias": [D],
        "cls_token": [1, 1, D], "pos_embed": [1, 1 + (s // p) ** 2, D],
        "norm.weight": [D], "norm.bias": [D], "head.weight": [k["num_classes"], D], "head.bias": [k["num_classes"]]}
for l in range(k["depth"]):
    b = "blocks.%d." % l
    want.update({b + "norm1.weight": [D], b + "norm1.bias": [D], b + "attn.qkv.weight": [3 * D, D],
                 b + "attn.proj.weight": [D, D], b + "attn.proj.bias": [D], b + "norm2.weight": [D],
                 b + "norm2.bias": [D], b + "mlp.fc1.weight": [H, D], b + "mlp.fc1.bias": [H],
                 b + "mlp.fc2.weight": [D, H], b + "mlp.fc2.bias": [D]})
    if k["qkv_bias"]: want[b + "attn.qkv.bias"] = [3 * D]
assert got == want, (sorted(set(got) ^ set(want)), [x for x in want if got.get(x) != want[x]])
PY
expect 0 "init_from .*timm/model.safetensors [(]timm names[)]: 24 tensors loaded" -- "$bin" train \
  "$work/tiny.yaml" --set model.init_from="$work/timm/model.safetensors" --set loop.steps=1 \
  --set schedule.warmup_steps=1 --out "$work/from_timm"
expect 1 "format timm: model.type is sequence_classifier" -- "$bin" export "$work/listops" --format timm \
  --out "$work/timm_lo"
expect 1 "exists; nothing was written. Export into a new directory, or add --overwrite" -- \
  "$bin" export "$run" --out "$work/timm"
expect 1 "model.init_from .*no such file or directory" -- "$bin" train "$work/tiny.yaml" \
  --set model.init_from="$work/nowhere" --dump-config

# ---- a language model from the shipped demo recipe (shrunk), then generate ----
lm="$work/lm"
expect 0 "bpb" -- "$bin" train "$src/recipes/lm/fortunes_tiny.yaml" --set loop.steps=30 \
  --set schedule.warmup_steps=5 --set loop.eval_every=30 --set data.limit_eval=4 \
  --set model.dim=64 --set model.depth=1 --set threads=2 --out "$lm"
expect 0 '"bits_per_byte"' -- "$bin" eval "$lm/checkpoints/$(cat "$lm/checkpoints/latest")"
grep -q "step .* tok/s  [0-9]* ms/step" "$lm/train.log" || fail "a language model's progress line has no tok/s"
expect 0 "20 generated.*decoding state" -- "$bin" generate "$lm" --prompt "The " --length 20 --seed 3
# Past the model's 256 positions the state is rebuilt from the last 128 tokens
# (at 257, 386 and 515 tokens); --exact-window recomputes the window per token.
expect 0 "600 generated.*decoding state, rebuilt 3 times from the last 128 tokens when the model's 256 positions were full" -- \
  "$bin" generate "$lm" --prompt "The " --length 600 --seed 3
expect 0 "300 generated.*the last 256 tokens recomputed for every token: --exact-window" -- \
  "$bin" generate "$lm" --prompt "The " --length 300 --seed 3 --exact-window
a="$("$bin" generate "$lm" --prompt "The " --length 20 --seed 3 2>/dev/null)"
b="$("$bin" generate "$lm" --prompt "The " --length 20 --seed 3 2>/dev/null)"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "generate: a seed must give one output ('$a' vs '$b')"
printf 'Once upon' >"$work/prompt.txt"
expect 0 "9 prompt tokens" -- "$bin" generate "$lm" --prompt-file "$work/prompt.txt" --length 5 --top-k 5
expect 2 "one of --top-k and --filter-thres" -- "$bin" generate "$lm" --prompt x --top-k 3 --filter-thres 0.9
expect 2 "--length: expected a number" -- "$bin" generate "$lm" --prompt x --length many
expect 1 "give a prompt" -- "$bin" generate "$lm"
expect 1 "holds a vit model" -- "$bin" generate "$run"
cp -r "$lm" "$work/lm_damaged"
: >"$work/lm_damaged/checkpoints/$(cat "$lm/checkpoints/latest")/state.json"
expect 1 "is damaged.*No other checkpoint is used in its place" -- "$bin" generate "$work/lm_damaged" --prompt x
expect 1 "LM corpus: '.*nothing' does not exist" -- "$bin" train "$src/recipes/lm/fortunes_tiny.yaml" \
  --set data.root="$work/nothing" --out "$work/lm_missing"
[ ! -e "$work/lm_missing" ] || fail "a missing corpus created its run directory"

# ---- export of language models and encoder-decoders: model.py gives the
# distribution of every draw of generate --logits (teacher-forced, 1e-5 relative) ----
check_generate() {  # RUN NAME GENERATE-ARGS...
  local run="$1" name="$2"
  shift 2
  "$bin" export "$run" --out "$work/pt_$name" >/dev/null 2>&1 &&
    "$bin" generate "$run" --logits "$work/pt_$name.jsonl" "$@" >/dev/null 2>&1 &&
    /usr/bin/python3 "$src/tests/export/check_generate.py" "$work/pt_$name" "$work/pt_$name.jsonl" \
      >"$work/pt_$name.log" 2>&1 || fail "export $name: the PyTorch model disagrees: $(cat "$work/pt_$name.log")"
}
check_generate "$lm" fortunes --prompt "The " --length 40   # linear, rotary_only
lm_small=(--set loop.steps=2 --set loop.eval_every=30 --set data.limit_eval=2 --set precision=fp32
  --set model.dim=32 --set model.heads=4 --set model.head_dim=8 --set data.seq_len=64 --set threads=1)
# enwik8_performer's options: FAVOR+ with local heads (local rotary) per layer,
# ScaleNorm, token shifts, reversible, rotary; then linear-attention-transformer's:
# causal efficient attention, axial positions, token shift, tied and factorised embeddings.
expect 0 "done: 2 steps" -- "$bin" train "$src/recipes/lm/enwik8_performer.yaml" "${lm_small[@]}" \
  --set data.root=/usr/share/games/fortunes --set "data.exclude=[\"*.dat\", \"*.u8\"]" --set "data.split_fractions=[0.95,1.0,1.0]" \
  --set model.depth=3 --set model.attention.nb_features=16 --set "model.attention.per_layer_local_heads=[4,2,1]" \
  --set model.attention.local_window=16 --out "$work/lm_performer"
check_generate "$work/lm_performer" performer --prompt "The " --length 56
expect 0 "done: 2 steps" -- "$bin" train "$src/recipes/lm/enwik8_linear_transformer.yaml" "${lm_small[@]}" \
  --set data.root=/usr/share/games/fortunes --set "data.exclude=[\"*.dat\", \"*.u8\"]" --set "data.split_fractions=[0.95,1.0,1.0]" \
  --set model.depth=2 --set model.attention.local_window=16 --set model.axial_shape=[4,16] \
  --set model.tie_embedding=true --set model.emb_dim=16 --out "$work/lm_lintrans"
check_generate "$work/lm_lintrans" lintrans --prompt "The " --length 56
# The copy recipe's encoder-decoder (FAVOR+, rotary, reversible, cross-attention).
expect 0 "done: 2 steps" -- "$bin" train "$src/recipes/seq2seq/copy_performer_reference.yaml" --set loop.steps=2 \
  --set model.dim=32 --set model.heads=4 --set model.head_dim=8 --set model.attention.nb_features=16 \
  --set data.copy_length=8 --set data.generate_train=32 --set data.generate_eval=8 --set loop.batch_size=8 \
  --set threads=1 --out "$work/copy"
check_generate "$work/copy" copy --source "2 3 4 5 6 7 8 9" --length 12
expect 1 "generate --logits .*pt_copy.jsonl: exists" -- "$bin" generate "$work/copy" --source "2 3" \
  --logits "$work/pt_copy.jsonl"
expect 0 "2 prompt tokens" -- "$bin" generate "$work/copy" --source "2 3" --prompt 2 --length 2 \
  --logits "$work/pt_copy.jsonl" --overwrite
[ "$(wc -l <"$work/pt_copy.jsonl")" -eq 2 ] || fail "generate --logits --overwrite: not the new run's 2 lines"
# What model.py does not rebuild is refused, naming the key, and leaves nothing.
expect 0 "done: 2 steps" -- "$bin" train "$src/recipes/lm/fortunes_tiny.yaml" "${lm_small[@]}" \
  --set model.depth=1 --set model.attend_axially=true --set model.attention.local_window=16 --out "$work/lm_axially"
expect 1 "model.attend_axially = true is not rebuilt" -- "$bin" export "$work/lm_axially" --out "$work/pt_axially"
[ ! -e "$work/pt_axially" ] || fail "a refused export left its directory"

# fp16 is mixed precision on GPUs only: the CPU run says it is fp32, and never the other.
expect 0 "model: vit fp32 [(]the recipe's precision fp16 does not apply here[)] on cpu" -- \
  "$bin" train "$work/tiny.yaml" --set precision=fp16 --set loop.steps=1 --out "$work/fp16_on_cpu"
# attention-maps of a model whose mechanism forms no attention matrix: an error, no folder.
expect 1 "model.attention.kind favor forms no attention matrix in any of its 1 layers.*nothing was written" -- \
  "$bin" attention-maps "$work/favor" "$work/shirt.png" --out "$work/maps_favor"
[ ! -e "$work/maps_favor" ] || fail "attention-maps of a FAVOR+ model left a folder"
# ---- real data or a clear refusal; attnforge data prepares LRA's releases ----
mkdir -p "$work/fresh"
before_cache="$(ls "$ATTNFORGE_CACHE" 2>/dev/null | sort)"
for task in listops pathfinder text retrieval image; do
  expect 1 "data.root 'data/lra/$task' does not exist.*attnforge data $task --from" -- \
    bash -c "cd '$work/fresh' && '$bin' train '$src/recipes/lra/$task.yaml' --out '$work/fresh/run_$task'"
  [ ! -e "$work/fresh/run_$task" ] || fail "lra/$task without its data created its run directory"
done
expect 1 "data.root 'data/lra/listops' does not exist.*--set data.synthetic=true" -- \
  bash -c "cd '$work/fresh' && '$bin' train '$src/recipes/lra/listops.yaml'"
# (In fp32: the recipe's bf16 is refused first on a CPU without AVX512-BF16 or AMX.)
expect 1 "data.dataset image_folder needs data.root: .*one folder of pictures per class.*USER_GUIDE.md, 'ImageNet-style training'.*data.synthetic=true" -- \
  "$bin" train "$src/recipes/vit/imagenet_vit_ti16.yaml" --set precision=fp32 --out "$work/fresh/imagenet"
[ "$(ls "$ATTNFORGE_CACHE" 2>/dev/null | sort)" = "$before_cache" ] ||
  fail "a recipe refused for want of data generated some into the cache"
expect 1 "data.dataset text has no generated stand-in" -- \
  "$bin" train "$src/recipes/lra/text.yaml" --set data.synthetic=true --out "$work/fresh/text_syn"
# IMDb's layout (aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt) to LRA Text, then a step of its recipe.
for split in train test; do
  for label in neg pos; do
    mkdir -p "$work/aclImdb/$split/$label"
    for i in 0 1 2 3; do
      printf '%s review %s of %s: %s<br /><br />the end.' "$label" "$i" "$split" "$(head -c 200 /dev/zero | tr '\0' x)" \
        >"$work/aclImdb/$split/$label/${i}_$((i + 5)).txt"
    done
  done
done
expect 2 "unknown LRA task 'imdb'" -- "$bin" data imdb --from "$work/aclImdb"
expect 0 "prepared LRA text from .*aclImdb into .*lra_text: train 8, test 8 examples" -- \
  "$bin" data text --from "$work" --out "$work/lra_text"
expect 1 "already exists and is not an empty folder" -- "$bin" data text --from "$work" --out "$work/lra_text"
expect 0 "done: 1 steps" -- "$bin" train "$src/recipes/lra/text.yaml" --set data.root="$work/lra_text" \
  --set model.dim=16 --set model.depth=1 --set model.heads=2 --set model.mlp_dim=16 --set loop.steps=1 \
  --set loop.batch_size=4 --set threads=2 --out "$work/lra_text_run"
# A trial shorter than the rsqrt warmup says how far it gets.
grep -q "warning.*schedule.warmup_steps makes a warmup of 8000 steps, longer than this run's 1 steps: the rsqrt" \
  "$work/lra_text_run/train.log" || fail "a trial run shorter than its rsqrt warmup did not say so"
# ---- gradcheck, info ----
expect 0 "cases: [0-9]+ passed, 0 failed" -- "$bin" gradcheck linear/plain linear/causal
expect 0 "TaylorShift direct vs efficient" -- "$bin" gradcheck taylorshift/direct
expect 2 "no case matches" -- "$bin" gradcheck nosuchop
expect 0 "BLAS" -- "$bin" info
# Whether precision: bf16 runs on this CPU (oneDNN's bf16 GEMMs need AVX512-BF16 or AMX).
if grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  expect 0 "bf16 GEMMs +oneDNN [0-9.]+, (AVX512-BF16|AMX) on this CPU: precision: bf16 runs here" -- "$bin" info
else
  expect 0 "bf16 GEMMs +oneDNN [0-9.]+; this CPU has neither AVX512-BF16 nor AMX" -- "$bin" info
fi
# OpenBLAS's kernels (ops/blas_core.h): a generic core OpenBLAS chose on a CPU
# with AVX2 or AVX-512 is replaced by re-executing with OPENBLAS_CORETYPE;
# ATTNFORGE_BLAS_TEST pretends OpenBLAS chose Prescott (and with ",broken"
# fails the self-check, which must bring OpenBLAS's choice back).
if grep -qwE 'avx2|avx512f' /proc/cpuinfo; then
  expect 0 "BLAS kernels .* kernels \\(corrected by attnforge: OpenBLAS chose Prescott .*self-checked" -- \
    env ATTNFORGE_BLAS_TEST=Prescott "$bin" info
  expect 0 "BLAS kernels +Prescott kernels \\(OpenBLAS's choice, slow .* failed its self-check: sgemm" -- \
    env ATTNFORGE_BLAS_TEST=Prescott,broken "$bin" info
  expect 0 "BLAS kernels +Prescott kernels \\(OPENBLAS_CORETYPE\\): slow on this CPU" -- \
    env OPENBLAS_CORETYPE=Prescott "$bin" info
  expect 0 "CPU: OpenBLAS's .* kernels \\(corrected by attnforge: OpenBLAS chose Prescott" -- \
    env ATTNFORGE_BLAS_TEST=Prescott "$bin" train "$work/tiny.yaml" --set loop.steps=2 --out "$work/blas_run"
else
  echo "skipped: the BLAS kernel choice checks need a CPU with AVX2 or AVX-512"
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
