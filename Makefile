# The two commands a new user runs (see README.md):
#   make train   install missing packages, build, train the default recipe
#   make test    install missing packages, build, run every test
BUILD    ?= build
SANITIZE ?= build-sanitize
JOBS     ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps configure build test train test-sanitize soak fuzz gpu-bundle bench bench-attention bench-stack bench-generate bench-distributed bench-torch bench-vit bench-loader format clean

all: build

deps:
	@bash scripts/install-deps.sh

# What only the tests need on top (PyTorch and PIL, which tests compare with).
test-deps:
	@bash scripts/install-deps.sh test

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# ctest runs $(JOBS) test programs at once, each with an OpenMP thread per
# core: threads that spin while they wait (libgomp's default) then take the
# cores from the other programs' threads. Waiting passively, the whole suite
# ran in 87 s instead of 509 s on 2 cores (issue 28); one training process
# alone is faster spinning, so only the tests wait passively.
CTEST_ENV = OMP_WAIT_POLICY=passive
test: build test-deps
	$(CTEST_ENV) ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# The default recipe (a small ViT on Fashion-MNIST) into runs/fmnist_tiny-<N>
# (the next free N); RECIPE=... and ARGS="--set key=value ..." choose another.
# Without a visible GPU it builds attnforge without the CUDA kernels, in its
# own folder (nvcc would double the build of a fresh machine for a backend
# that cannot run there); with one, the full build in $(BUILD).
RECIPE ?= recipes/vit/fmnist_tiny.yaml
ARGS   ?=
GPU_VISIBLE := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TRAIN_BUILD ?= $(if $(GPU_VISIBLE),$(BUILD),build-cpu)
TRAIN_CMAKE_FLAGS = $(if $(GPU_VISIBLE),,-DFORGE_CUDA=OFF)
train: deps
	cmake -S . -B $(TRAIN_BUILD) -DCMAKE_BUILD_TYPE=Release $(TRAIN_CMAKE_FLAGS) $(CMAKE_FLAGS)
	cmake --build $(TRAIN_BUILD) -j$(JOBS) --target attnforge
	$(TRAIN_BUILD)/apps/attnforge train $(RECIPE) $(ARGS)

# The CPU code under AddressSanitizer + UndefinedBehaviorSanitizer. The CUDA
# backend is left out: the CUDA runtime maps memory where ASan keeps its
# shadow, and no GPU is visible here to run its code (test_cuda is not built).
# Data parallelism runs its reducer tests here, in one process: under mpirun
# OpenMPI's runtime leaks by design (from plugins it unloads, which no leak
# suppression can name), so the mpirun tests of test_dist run in `make test`.
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-sanitize: deps test-deps
	cmake -S . -B $(SANITIZE) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFORGE_SANITIZE=ON -DFORGE_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(SANITIZE) -j$(JOBS) --target test_core test_autograd test_ops test_attention test_nn test_optim test_data test_train test_dist attnforge
	$(SANITIZE_ENV) $(CTEST_ENV) ctest --test-dir $(SANITIZE) --output-on-failure -j$(JOBS) -E '^(test_cuda|test_dist)$$'
	$(SANITIZE_ENV) $(CTEST_ENV) $(SANITIZE)/tests/test_dist --gtest_filter='GradReducer.*'

# kill -9 soak of a small run (scripts/soak.sh): SOAK_KILLS kills at random
# instants and inside checkpoint writes, each resumed; every checkpoint must
# load, every run resume, and the final weights match an uninterrupted run's.
# Then a small language model and a 2-process mpirun job (a rank killed) the same way.
SOAK_KILLS ?= 40
soak: configure
	cmake --build $(BUILD) -j$(JOBS) --target attnforge
	SOAK_KILLS=$(SOAK_KILLS) bash scripts/soak.sh $(BUILD)/apps/attnforge

# libFuzzer on every parser of untrusted input (scripts/fuzz.sh, tests/fuzz/README.md):
# replays the regression inputs and seeds, then fuzzes each target for
# FUZZ_SECONDS (0: replay only); FUZZ_TARGETS="json idx" picks some.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?=
fuzz:
	@bash scripts/install-deps.sh fuzz
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_TARGETS="$(FUZZ_TARGETS)" JOBS=$(JOBS) bash scripts/fuzz.sh

# The GPU tests and benchmarks packed for a machine with a GPU but without our
# packages (docs/GPU.md): .gpu/attnforge-gpu.tar.xz, run there by scripts/gpu/run.sh.
gpu-bundle: deps
	bash scripts/gpu/bundle.sh

bench: build
	$(BUILD)/bench/bench_core

bench-attention: build
	$(BUILD)/bench/bench_attention

# One training step of a depth-12 stack at N = 4096 under C0, C1, C2 and reversible.
bench-stack: build
	$(BUILD)/bench/bench_stack

# Tokens/s of language-model generation against the context length, per mechanism.
bench-generate: build
	$(BUILD)/bench/bench_generate

# One training step of the default recipe's ViT, ours against eager PyTorch, same run.
# Data parallelism: 1 process x all cores against 2 processes sharing them, and
# the all-reduce bandwidth (bench/distributed.sh; docs/DISTRIBUTED.md).
bench-distributed: build
	bash bench/distributed.sh $(BUILD)

bench-vit: build
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch)
	/usr/bin/python3 bench/torch_train_step.py --ours $(BUILD)/bench/bench_train_step --threads $(JOBS)

# Images/s of the training data pipeline (recipes/vit/imagenet_vit_s16.yaml's
# transforms) with 1 and 2 loader workers, ours against torchvision's DeiT
# pipeline (Debian's python3-torchvision) on the same synthetic JPEGs.
bench-loader: build
	@bash scripts/install-deps.sh bench
	$(BUILD)/bench/bench_loader --workers 1,2
	/usr/bin/python3 bench/torch_loader.py "$$($(BUILD)/bench/bench_loader --print-root)" --workers 1,2

# Our attention ops against eager PyTorch (Debian's python3-torch), same run.
bench-torch: build
	@dpkg-query -W -f='$${Status}' python3-torch 2>/dev/null | grep -q "install ok installed" || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch)
	/usr/bin/python3 bench/torch_attention.py --ours $(BUILD)/bench/bench_attention --threads $(JOBS)

format:
	find core autograd ops apps bench tests -name '*.h' -o -name '*.cpp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-cpu $(SANITIZE) build-fuzz
