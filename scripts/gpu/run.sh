#!/usr/bin/env bash
# Runs the GPU tests and benchmarks from the archive scripts/gpu/bundle.sh made,
# on a machine with a GPU, the CUDA driver and PyTorch (for cuDNN / cuBLAS and
# the comparison), but without our Debian dependencies. Logs go to OUT_DIR.
#
#   scripts/gpu/run.sh [ARCHIVE=.gpu/attnforge-gpu.tar.xz] [OUT_DIR=${OUT:-gpu-out}] [WHAT=all]
# WHAT (comma-separated): tests | matmul | attention | attention64 | attention128 | steps |
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
if want tests; then
  echo "== test_cuda"
  "$root/bin/test_cuda" --gtest_output="xml:$out/test_cuda.xml" 2>&1 | tee "$out/test_cuda.log"
  status=${PIPESTATUS[0]}
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\] [0-9]+ test|tests? from .* ran' "$out/test_cuda.log"
fi
if want matmul bench; then
  echo "== bench_cuda_matmul"
  "$root/bin/bench_cuda_matmul" 2>&1 | tee "$out/bench_cuda_matmul.log"
fi
for d in 64 128; do
  if want "attention$d" || want attention bench; then
    echo "== attention ops, d = $d, bf16, ours vs eager PyTorch vs SDPA"
    (cd "$src" && python3 bench/torch_cuda_attention.py --ours "$root/bin/bench_attention" --dims "$d" \
        --raw "$out/attention_d$d.csv") 2>&1 | tee "$out/bench_attention_d$d.log"
  fi
done
if want steps bench; then
  for model in s16 listops; do
    batch=$([[ $model == s16 ]] && echo 128 || echo 32)
    for att in softmax favor taylorshift; do
      echo "== $model training step, $att attention, bf16, ours vs PyTorch"
      (cd "$src" && python3 bench/torch_train_step.py --ours "$root/bin/bench_train_step" --model "$model" \
          --attention "$att" --device cuda --precision bf16 --batches "$batch" --steps 10) 2>&1 |
        tee "$out/bench_step_${model}_$att.log"
    done
  done
fi
exit "$status"
