#!/usr/bin/env bash
# Runs the GPU tests and benchmarks from the archive scripts/gpu/bundle.sh made,
# on a machine with a GPU, the CUDA driver and PyTorch (for cuDNN / cuBLAS and
# the comparison), but without our Debian dependencies. Logs go to OUT_DIR.
#
#   scripts/gpu/run.sh [ARCHIVE=.gpu/attnforge-gpu.tar.xz] [OUT_DIR=${OUT:-gpu-out}] [WHAT=all]
# WHAT: tests | bench | all. Exit status: that of the tests (benchmarks report only).
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
if [[ $what == tests || $what == all ]]; then
  echo "== test_cuda"
  "$root/bin/test_cuda" --gtest_output="xml:$out/test_cuda.xml" 2>&1 | tee "$out/test_cuda.log"
  status=${PIPESTATUS[0]}
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\] [0-9]+ test|tests? from .* ran' "$out/test_cuda.log"
fi
if [[ $what == bench || $what == all ]]; then
  echo "== bench_cuda_matmul"
  "$root/bin/bench_cuda_matmul" 2>&1 | tee "$out/bench_cuda_matmul.log"
  echo "== ViT-S/16 training step, bf16, ours vs PyTorch"
  (cd "$src" && python3 bench/torch_vit_step.py --ours "$root/bin/bench_vit_step" --model s16 \
      --device cuda --precision bf16 --batches 128 --steps 20) 2>&1 | tee "$out/bench_vit_s16.log"
fi
exit "$status"
