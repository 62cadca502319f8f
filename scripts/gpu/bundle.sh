#!/usr/bin/env bash
# Builds the GPU test and benchmark programs here (CUDA for sm_90) and packs
# them with the shared libraries the GPU machine lacks (OpenBLAS, yaml-cpp,
# spdlog, fmt, libpng, libjpeg, gfortran, gomp) into one archive, for
# scripts/gpu/run.sh on a machine with a GPU but without our Debian packages.
# The CUDA libraries (cudart, cuBLAS, cuDNN, NCCL) are NOT packed: run.sh finds
# the GPU machine's own (its toolkit's, or those of PyTorch's wheels). See docs/GPU.md.
#
#   scripts/gpu/bundle.sh [BUILD_DIR=build-gpu] [ARCHIVE=.gpu/attnforge-gpu.tar.xz]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
archive=${2:-.gpu/attnforge-gpu.tar.xz}
targets=(test_cuda bench_train_step bench_attention bench_cuda_matmul bench_loader bench_generate attnforge)

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA=ON -DFORGE_PORTABLE=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/attnforge-gpu/bin" "$stage/attnforge-gpu/lib"
for t in "${targets[@]}"; do
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -n1)
  [[ -n "$bin" ]] || { echo "bundle: $t was not built" >&2; exit 1; }
  strip -o "$stage/attnforge-gpu/bin/$t" "$bin"
done
# Every shared library the programs load, except glibc's, the C++ runtime's
# and CUDA's (the GPU machine has newer ones of those).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libmvec\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcudnn|libnccl)'
for bin in "$stage"/attnforge-gpu/bin/*; do
  ldd "$bin" | awk '/=> \// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" "$stage/attnforge-gpu/lib/$name"; fi
done
cp scripts/gpu/run.sh "$stage/attnforge-gpu/"
git rev-parse HEAD > "$stage/attnforge-gpu/COMMIT" 2>/dev/null || true
mkdir -p "$(dirname "$archive")"
tar -C "$stage" -cJf "$archive" attnforge-gpu
echo "bundle: $archive ($(du -h "$archive" | cut -f1)): ${targets[*]} + $(ls "$stage/attnforge-gpu/lib" | wc -l) libraries"
