#!/usr/bin/env bash
# Installs the Debian packages that the build and training need (and with
# `test`, `bench` or `fuzz` what those need too), and nothing when they are
# all present already. Safe to run any number of times.
set -euo pipefail

packages=(
  build-essential cmake pkg-config  # build-essential brings libc6-dev, whose libmvec vectorises the CPU kernels' exp, tanh, erf (core/vmath.h)
  libopenblas-openmp-dev   # OpenBLAS built with OpenMP: BLAS and our kernels share one thread pool
  libdnnl-dev              # oneDNN's matmul: the bf16 GEMMs of precision: bf16 on the CPU (ops/blas.h)
  libyaml-cpp-dev
  libspdlog-dev libfmt-dev
  libgtest-dev
  zlib1g-dev libpng-dev libjpeg62-turbo-dev
  libxxhash-dev            # XXH3-64 checksums of checkpoint tensors and files
  libprotobuf-dev protobuf-compiler  # TensorBoard event files (train/tensorboard.h): Event messages
  libisal-dev              # ISA-L's CRC-32C (SSE4.2 / ARM CRC) for the event files' TFRecord framing
  libopenmpi-dev openmpi-bin  # data-parallel training under mpirun (dist/, docs/DISTRIBUTED.md)
  dataset-fashion-mnist
  fortunes                 # the demo corpus of recipes/lm/fortunes_tiny.yaml (/usr/share/games/fortunes)
)

# `install-deps.sh test`: also what only the tests need (make test); `make
# train` installs the list above alone.
if [ "${1:-}" = test ]; then
  packages+=(
    python3-torch            # the tests load exported models in PyTorch (attnforge export, docs/USER_GUIDE.md)
    python3-pil              # the tests compare RandAugment's operations with PIL's, pixel for pixel (data/augment.h)
  )
fi

# `install-deps.sh bench`: also torchvision, the pipeline bench/torch_loader.py
# times against bench/loader (make bench-loader).
if [ "${1:-}" = bench ]; then
  packages+=(python3-torchvision)
fi

# `install-deps.sh fuzz`: also what scripts/fuzz.sh needs (make fuzz).
if [ "${1:-}" = fuzz ]; then
  packages+=(
    clang-14 libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes
    libomp-14-dev                # OpenMP under clang
    llvm-14                      # llvm-symbolizer: readable sanitizer reports
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
