#!/usr/bin/env bash
# Runs the GPU tests and benchmarks from the archive scripts/gpu/bundle.sh made,
# on a machine with a GPU, the CUDA driver and PyTorch (for cuDNN / cuBLAS and
# the comparison), but without our Debian dependencies. Logs go to OUT_DIR.
#
#   scripts/gpu/run.sh [ARCHIVE=.gpu/attnforge-gpu.tar.xz] [OUT_DIR=${OUT:-gpu-out}] [WHAT=all]
# WHAT (comma-separated): tests | mma | linear | optim | generate | train | resume | deit | loader | matmul | attention | attention64 | attention128 | steps |
#   bench (= matmul, attention, steps) | all (= tests, bench). Each part fits in one
#   10-minute call of the device tool; raw CSV goes to OUT_DIR too.
# Exit status: that of the tests (benchmarks report only).
set -uo pipefail
archive=${1:-.gpu/attnforge-gpu.tar.xz}
out=${2:-${OUT:-gpu-out}}
what=${3:-all}
src=$(pwd)
mkdir -p "$out"
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
tar -C "$dest" -xJf "$archive" || { echo "run: cannot unpack $archive" >&2; exit 1; }
root="$dest/attnforge-gpu"

# CUDA libraries: the toolkit's, then those PyTorch's wheels bring (cuDNN lives there).
libs="$root/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d $d ]] && libs="$libs:$d"; done
py_libs=$(python3 - <<'PY' 2>/dev/null
import glob, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(base + "/nvidia/*/lib")) + sorted(glob.glob(base + "/nvidia/cu*/lib"))
print(":".join(dict.fromkeys(dirs)))
PY
)
[[ -n "$py_libs" ]] && libs="$libs:$py_libs"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1

{
  echo "commit $(cat "$root/COMMIT" 2>/dev/null)"
  nvidia-smi -L 2>&1
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  "$root/bin/attnforge" info 2>&1
} | tee "$out/environment.txt"

status=0
# want PART [GROUP]: WHAT names the part, its group, or all.
want() {
  local w=",$what,"
  [[ $w == *",$1,"* || $w == *",all,"* || (-n ${2:-} && $w == *",$2,"*) ]]
}
# Each part runs under `timeout`, never past DEADLINE seconds after the start
# (default 540: one 10-minute call of the device tool, with time to pack the logs).
# ATTN_NS (e.g. 4096,16384) limits the attention parts' sequence lengths;
# FLASH_ENGINE (tiled | mma) picks our softmax / local kernels there.
deadline=$((SECONDS + ${DEADLINE:-540}))
left() { local l=$((deadline - SECONDS)); ((l > ${1:-0})) && echo "$l" || echo 0; }
limited() { # limited SECONDS CMD...: CMD under timeout, capped by the deadline
  local t=$1; shift
  local l; l=$(left); ((l < t)) && t=$l
  ((t > 5)) || { echo "skipped (deadline): $*"; return 124; }
  timeout -k 5 "$t" "$@"
}
# cuda_tests NAME SECONDS FILTER: test_cuda's tests matching FILTER into
# $out/NAME_tests.log, their verdicts printed; a failure fails the run.
cuda_tests() {
  limited "$2" "$root/bin/test_cuda" --gtest_filter="$3" > "$out/$1_tests.log" 2>&1
  local rc=$?
  echo "$1 tests rc=$rc"; grep -E '^\[  (FAILED|PASSED) ' "$out/$1_tests.log" | sort -u
  ((rc == 0)) || status=1
}
if want tests; then
  # One process per suite, four at a time: a kernel that faults poisons its CUDA
  # context, so it fails its own suite, not every test after it. XML per suite.
  echo "== test_cuda"
  mkdir -p "$out/test_cuda"
  "$root/bin/test_cuda" --gtest_list_tests | awk '/^[A-Za-z0-9_]+\.$/ {sub(/\.$/, ""); print}' > "$out/test_cuda/suites.txt"
  export root out
  run_suite() {
    local s=$1 t0=$SECONDS
    OMP_NUM_THREADS=4 timeout -k 5 "${SUITE_TIMEOUT:-300}" "$root/bin/test_cuda" --gtest_filter="$s.*" \
      --gtest_output="xml:$out/test_cuda/$s.xml" > "$out/test_cuda/$s.log" 2>&1
    local rc=$?
    echo "$s rc=$rc $((SECONDS - t0))s $(grep -cE '^\[       OK \]' "$out/test_cuda/$s.log") ok" \
      "$(grep -cE '^\[  FAILED  \] [A-Za-z]' "$out/test_cuda/$s.log") failed"
    return $rc
  }
  export -f run_suite
  SUITE_TIMEOUT=$(left 0); ((SUITE_TIMEOUT > ${TESTS_BUDGET:-$SUITE_TIMEOUT})) && SUITE_TIMEOUT=$TESTS_BUDGET
  export SUITE_TIMEOUT
  xargs -P "${SUITE_JOBS:-4}" -I{} bash -c 'run_suite {}' < "$out/test_cuda/suites.txt" | tee "$out/test_cuda.summary"
  grep -h '^\[  FAILED  \] [A-Za-z]' "$out"/test_cuda/*.log | sort -u | tee -a "$out/test_cuda.summary"
  if grep -q 'rc=[^0]' "$out/test_cuda.summary"; then status=1; fi
fi
if want mma; then
  # Issue 29's engines (FlashEngine::mma and ::cudnn; docs/GPU.md lists them
  # as not yet run): their tests and the tiled kernels' first, then softmax
  # attention under each engine, bf16, 16k tokens a step (B = 16384 / N),
  # width 1024 (H = 1024 / d): ms forward and forward + backward, and the
  # forward's TFLOP/s (4 B H N^2 d).
  echo "== mma: test_cuda CudaFlashMma, CudaFlashCudnn, CudaAttentionSoftmax, CudaAttentionLocal"
  cuda_tests mma 240 'CudaFlashMma.*:CudaFlashCudnn.*:CudaAttentionSoftmax.*:CudaAttentionLocal.*'
  echo "engine d N fwd_ms fwdbwd_ms fwd_TFLOP/s" | tee "$out/mma_bench.txt"
  for d in 64 128; do
    for n in 1024 4096 16384; do
      for e in tiled mma cudnn; do
        limited 60 "$root/bin/bench_attention" --one softmax/plain "$n" --device cuda --dtype bf16 --dim "$d" \
          --heads $((1024 / d)) --tokens 16384 --flash-engine "$e" 2>>"$out/mma_bench.err" | tail -n 1 |
          awk -F, -v e="$e" -v d="$d" -v n="$n" '{ b = 16384 / n; h = 1024 / d;
            printf "%s %d %d %s %s %.1f\n", e, d, n, $3, $4, 4 * b * h * n * n * d / ($3 * 1e-3) / 1e12 }' |
          tee -a "$out/mma_bench.txt"
      done
    done
  done
  echo "engine ViT-S/16 step (bf16, batch 128): ours,batch,ms,images/s,peak MB" | tee -a "$out/mma_bench.txt"
  for e in tiled mma cudnn; do
    echo "$e $(limited 90 "$root/bin/bench_train_step" --model s16 --device cuda --precision bf16 --batch 128 \
      --steps 10 --flash-engine "$e" 2>>"$out/mma_bench.err" | tail -n 1)" | tee -a "$out/mma_bench.txt"
  done
fi
if want linear; then
  # Issue 30's tensor-core core of the linear family (LinearEngine::mma; docs/GPU.md
  # lists it as not yet run): its tests and the fma core's first, then linear
  # and efficient (non-causal) under each engine, bf16, 16k tokens a step
  # (B = 16384 / N), H = 16, d = 64: ms forward and forward + backward, peak MB.
  echo "== linear: test_cuda CudaLinearMma, CudaAttentionLinear"
  cuda_tests linear 200 'CudaLinearMma.*:CudaAttentionLinear*'
  echo "engine mechanism N fwd_ms fwdbwd_ms peak_MB" | tee "$out/linear_bench.txt"
  for m in linear/plain efficient/plain; do
    for n in 1024 8192 65536; do
      for e in fma mma; do
        limited 60 "$root/bin/bench_attention" --one "$m" "$n" --device cuda --dtype bf16 --dim 64 \
          --heads 16 --tokens 16384 --linear-engine "$e" 2>>"$out/linear_bench.err" | tail -n 1 |
          awk -F, -v e="$e" -v m="$m" -v n="$n" '{ printf "%s %s %d %s %s %.1f\n", e, m, n, $3, $4, $5 / 1048576 }' |
          tee -a "$out/linear_bench.txt"
      done
    done
  done
fi
if want optim; then
  # Issue 31's multi-tensor AdamW (optim::set_multi_tensor; docs/GPU.md lists it
  # as not yet run): the optimizer tests, then the ViT-S/16 step (bf16, batch
  # 256) with one launch per tensor and with launches of many tensors.
  echo "== optim: test_cuda CudaOptim"
  cuda_tests optim 120 'CudaOptim.*'
  echo "multi-tensor ViT-S/16 step (bf16, batch 256): ours,batch,ms,images/s,peak MB" | tee "$out/optim_bench.txt"
  for mt in off on; do
    echo "$mt $(limited 120 "$root/bin/bench_train_step" --model s16 --device cuda --precision bf16 --batch 256 \
      --steps 10 --multi-tensor "$mt" 2>>"$out/optim_bench.err" | tail -n 1)" | tee -a "$out/optim_bench.txt"
  done
fi
if want generate; then
  # Issue 30's decoding on the GPU: tokens/s of the linear-family language
  # models recomputing their window for every token (today's default there)
  # against their state kept on the GPU (--state-on-gpu); then the test that
  # the tokens equal the CPU's.
  echo "== generate on the GPU: recomputing, then the state on the GPU"
  cuda_tests generate 60 'CudaGeneration.*'
  for flag in "" --state-on-gpu; do
    limited 150 "$root/bin/bench_generate" --device cuda --mechanisms linear,favor,efficient \
      --max-len 8192 --new-tokens 16 $flag 2>&1 | tee -a "$out/generate.log"
  done
fi
if want train; then
  # The default recipe of `make train` on the GPU, fp32, bf16 then fp16. Its data:
  # FMNIST_ROOT (the Fashion-MNIST files), carried beside the bundle.
  for p in fp32 bf16 fp16; do
    echo "== train recipes/vit/fmnist_tiny.yaml, device cuda, $p"
    t0=$SECONDS
    limited "${TRAIN_TIMEOUT:-240}" "$root/bin/attnforge" train "$src/recipes/vit/fmnist_tiny.yaml" \
      --out "$dest/run-$p" --set device=cuda --set precision=$p --set data.root="${FMNIST_ROOT:-/usr/share/datasets/fashion-mnist}" \
      > "$out/train_$p.log" 2>&1
    echo "train $p rc=$? $((SECONDS - t0))s" | tee -a "$out/train.summary"
    tail -n 4 "$out/train_$p.log" | tee -a "$out/train.summary"
  done
fi
if want resume; then
  # On the GPU: a run stopped after its checkpoint at step 150 (ATTNFORGE_FAULT)
  # and resumed must end bit-identical to the uninterrupted run; then `eval`
  # of its last checkpoint.
  echo "== resume and eval on the GPU"
  r=(--set device=cuda --set data.root="${FMNIST_ROOT:-/usr/share/datasets/fashion-mnist}"
     --set loop.steps=300 --set checkpoint.every=150 --set loop.eval_every=150)
  limited 90 "$root/bin/attnforge" train "$src/recipes/vit/fmnist_tiny.yaml" --out "$dest/whole" "${r[@]}" > "$out/resume_whole.log" 2>&1
  ATTNFORGE_FAULT=step:151 limited 90 "$root/bin/attnforge" train "$src/recipes/vit/fmnist_tiny.yaml" --out "$dest/cut" "${r[@]}" > "$out/resume_cut.log" 2>&1
  echo "stopped run rc=$? (1 expected: the injected fault)" | tee "$out/resume.summary"
  limited 90 "$root/bin/attnforge" train --resume "$dest/cut" >> "$out/resume_cut.log" 2>&1
  echo "resume rc=$?" | tee -a "$out/resume.summary"
  python3 - "$dest/whole/checkpoints/step-00000300/model.safetensors" "$dest/cut/checkpoints/step-00000300/model.safetensors" <<'PY' 2>&1 | tee -a "$out/resume.summary"
import sys
from safetensors.numpy import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
same = a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
print(f"resumed weights bit-identical to the uninterrupted run's: {same} ({len(a)} tensors)")
PY
  limited 90 "$root/bin/attnforge" eval "$dest/whole/checkpoints/step-00000300" --out "$out/eval.json" > "$out/eval.log" 2>&1
  echo "eval rc=$?" | tee -a "$out/resume.summary"
  cat "$out/eval.json" >> "$out/resume.summary" 2>/dev/null
fi
if want deit; then
  # Issue 20's pipeline on the GPU: the tiny image-folder recipe (RandAugment,
  # random erasing, repeated augmentation, drop path, EMA) trained, stopped
  # after its step-120 checkpoint and resumed: the weights and the EMA at the
  # end must be bit-identical to the uninterrupted run's. Then issue 19's
  # commands on the GPU with its checkpoint: eval (top-5, confusion), predict,
  # attention-maps, and export --format timm loaded by timm itself.
  echo "== deit: imagefolder_tiny on the GPU"
  export ATTNFORGE_CACHE="$dest/cache"
  r=(--set device=cuda --set loop.epochs=0 --set loop.steps=240 --set checkpoint.every=120 --set loop.eval_every=120)
  limited 120 "$root/bin/attnforge" train "$src/recipes/vit/imagefolder_tiny.yaml" --out "$dest/tiny" "${r[@]}" > "$out/deit_tiny.log" 2>&1
  echo "tiny rc=$?" | tee "$out/deit.summary"; grep -E "eval  step|done" "$out/deit_tiny.log" | tail -3 | tee -a "$out/deit.summary"
  ATTNFORGE_FAULT=step:121 limited 90 "$root/bin/attnforge" train "$src/recipes/vit/imagefolder_tiny.yaml" --out "$dest/tiny_cut" "${r[@]}" > "$out/deit_cut.log" 2>&1
  echo "stopped run rc=$? (1 expected: the injected fault)" | tee -a "$out/deit.summary"
  limited 90 "$root/bin/attnforge" train --resume "$dest/tiny_cut" >> "$out/deit_cut.log" 2>&1
  echo "resume rc=$?" | tee -a "$out/deit.summary"
  python3 - "$dest/tiny/checkpoints/step-00000240" "$dest/tiny_cut/checkpoints/step-00000240" <<'PY' 2>&1 | tee -a "$out/deit.summary"
import sys
from safetensors.numpy import load_file
for f in ("model.safetensors", "optimizer.safetensors"):
    a, b = load_file(f"{sys.argv[1]}/{f}"), load_file(f"{sys.argv[2]}/{f}")
    same = a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    ema = sum(k.startswith("ema.") for k in a)
    print(f"{f}: resumed run bit-identical to the uninterrupted one: {same} ({len(a)} tensors, {ema} EMA)")
PY
  ck="$dest/tiny/checkpoints/step-00000240"
  limited 60 "$root/bin/attnforge" eval "$ck" --out "$out/deit_eval.json" > "$out/deit_eval.log" 2>&1
  echo "eval rc=$?" | tee -a "$out/deit.summary"
  val=$(ls -d "$ATTNFORGE_CACHE"/images-*/val | head -n1)
  imgs=$(find "$val" -name '*.jpg' | sort | head -n 16)
  limited 60 "$root/bin/attnforge" predict "$ck" $imgs --out "$out/deit_predict.jsonl" > "$out/deit_predict.log" 2>&1
  echo "predict rc=$?" | tee -a "$out/deit.summary"
  limited 60 "$root/bin/attnforge" attention-maps "$ck" $(echo $imgs | cut -d' ' -f1) --out "$dest/maps" > "$out/deit_maps.log" 2>&1
  echo "attention-maps rc=$? $(ls "$dest/maps" 2>/dev/null | wc -l) files" | tee -a "$out/deit.summary"
  limited 60 "$root/bin/attnforge" export "$ck" --format timm --out "$dest/timm" > "$out/deit_timm.log" 2>&1
  echo "export timm rc=$?" | tee -a "$out/deit.summary"
  (cd "$src" && limited 120 python3 tests/export/check_timm.py "$dest/timm" "$out/deit_predict.jsonl" $imgs) 2>&1 | tee -a "$out/deit.summary"
fi
if want loader; then
  # bench/loader: images/s of the DeiT train transform per worker count, and
  # torchvision's pipeline on the same pictures; then ViT-S/16 trained with the
  # DeiT recipe from those pictures (bf16, batch 256, 16 workers).
  echo "== loader"
  export ATTNFORGE_CACHE="$dest/cache"
  (cd "$src" && limited 240 "$root/bin/bench_loader" --workers 1,2,4,8,16 --batches 24 --batch-size 128 --out "$out/loader.jsonl") 2>&1 | tee "$out/loader.log"
  imgroot=$("$root/bin/bench_loader" --print-root 2>/dev/null | tail -n1)
  (cd "$src" && limited 150 python3 bench/torch_loader.py "$imgroot" --workers 16,1 --batches 24 --batch-size 128) 2>&1 | tee "$out/torch_loader.log"
  echo "== ViT-S/16, DeiT recipe, images from $imgroot"
  limited 150 "$root/bin/attnforge" train "$src/recipes/vit/imagenet_vit_s16.yaml" --out "$dest/s16" --set data.root="$imgroot" \
    --set device=cuda --set loop.epochs=0 --set loop.steps=60 --set loop.accumulation=1 --set loop.log_every=20 \
    --set loop.eval_every=1000 --set checkpoint.every=1000 --set data.limit_eval=256 > "$out/deit_s16.log" 2>&1
  echo "s16 rc=$?" | tee -a "$out/loader.log"; grep -E "step |done" "$out/deit_s16.log" | tail -4 | tee -a "$out/loader.log"
fi
if want matmul bench; then
  echo "== bench_cuda_matmul"
  limited "${MATMUL_TIMEOUT:-120}" "$root/bin/bench_cuda_matmul" 2>&1 | tee "$out/bench_cuda_matmul.log"
fi
for d in 64 128; do
  if want "attention$d" || want attention bench; then
    echo "== attention ops, d = $d, bf16, ours vs eager PyTorch vs SDPA"
    (cd "$src" && limited 300 python3 bench/torch_cuda_attention.py --ours "$root/bin/bench_attention" --dims "$d" ${ATTN_NS:+--ns "$ATTN_NS"} \
        ${FLASH_ENGINE:+--flash-engine "$FLASH_ENGINE"} --raw "$out/attention_d$d.csv") 2>&1 | tee "$out/bench_attention_d$d.log"
  fi
done
if want steps bench; then
  for model in s16 listops; do
    batch=$([[ $model == s16 ]] && echo 128 || echo 32)
    for att in softmax favor taylorshift; do
      echo "== $model training step, $att attention, bf16, ours vs PyTorch"
      (cd "$src" && limited 120 python3 bench/torch_train_step.py --ours "$root/bin/bench_train_step" --model "$model" \
          --attention "$att" --device cuda --precision bf16 --batches "$batch" --steps 10 \
          --flash-engine "${FLASH_ENGINE:-tiled}") 2>&1 |
        tee "$out/bench_step_${model}_$att.log"
    done
  done
fi
exit "$status"
