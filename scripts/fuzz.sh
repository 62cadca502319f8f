#!/usr/bin/env bash
# Fuzzes the parsers of untrusted input with libFuzzer (tests/fuzz/README.md):
# builds the targets into build-fuzz (clang-14, ASan + UBSan, CUDA off), then
# for each target replays its regression inputs and seed corpus, one process
# per input, and fuzzes it for FUZZ_SECONDS. Exits non-zero when any input
# crashes, leaks, runs out of memory (2 GB) or time (10 s per input), naming
# it; what fuzzing finds is saved under build-fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh                           replay, then 60 s of fuzzing per target
#   FUZZ_SECONDS=0 scripts/fuzz.sh            replay only (what CI runs)
#   FUZZ_TARGETS="json idx" scripts/fuzz.sh   a subset of: safetensors json recipe
#                                             recipe_set idx listops text retrieval image
#                                             lm_text seq2seq tsv_inputs metrics timm_names
#   JOBS=2                                    build jobs (default: every core)
#
# Needs the Debian packages clang-14, libclang-rt-14-dev (libFuzzer and the
# sanitizer runtimes) and libomp-14-dev; llvm-14 gives symbolized reports. It
# installs nothing.
#
# One target by hand, after a run has built it:
#   build-fuzz/tests/fuzz/fuzz_json some-input              # replay one input
#   build-fuzz/tests/fuzz/fuzz_json -dict=tests/fuzz/dict/json.dict -max_total_time=300 \
#     -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 build-fuzz/corpus/json tests/fuzz/corpus/json
# New inputs go to the first directory: a scratch corpus, never the repository's.
#
# A regression input: once the code is fixed, copy the artifact (crash-<sha1>,
# leak-, oom-, timeout-) to tests/fuzz/regressions/<target>/<what-it-triggers>;
# every run replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_TARGETS="safetensors json recipe recipe_set idx listops text retrieval image lm_text seq2seq tsv_inputs metrics timm_names"
BUILD="${FUZZ_BUILD:-build-fuzz}"
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
TARGETS="${FUZZ_TARGETS:-$ALL_TARGETS}"
JOBS="${JOBS:-$(nproc)}"
CXX_FUZZ="${FUZZ_CXX:-clang++-14}"
LIMITS=(-rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10)

if ! [[ "$FUZZ_SECONDS" =~ ^[0-9]+$ ]]; then
  echo "fuzz.sh: FUZZ_SECONDS must be a whole number of seconds (0: replay only), got '$FUZZ_SECONDS'" >&2
  exit 2
fi
for t in $TARGETS; do
  if ! [[ " $ALL_TARGETS " == *" $t "* ]]; then
    echo "fuzz.sh: unknown target '$t' in FUZZ_TARGETS; the targets are: $ALL_TARGETS" >&2
    exit 2
  fi
done
if ! command -v "$CXX_FUZZ" > /dev/null; then
  echo "fuzz.sh: $CXX_FUZZ not found: install the Debian packages clang-14 and libclang-rt-14-dev" >&2
  exit 2
fi
runtime_dir="$("$CXX_FUZZ" --print-runtime-dir)"
if ! [ -f "$runtime_dir/libclang_rt.fuzzer-x86_64.a" ]; then
  echo "fuzz.sh: libFuzzer is not in $runtime_dir: install the Debian package libclang-rt-14-dev" >&2
  exit 2
fi

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX_FUZZ" \
  -DFORGE_FUZZ=ON -DFORGE_CUDA=OFF -DFORGE_PORTABLE=ON
cmake --build "$BUILD" -j"$JOBS" --target forge_fuzzers

export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && command -v llvm-symbolizer-14 > /dev/null; then
  ASAN_SYMBOLIZER_PATH="$(command -v llvm-symbolizer-14)"
  export ASAN_SYMBOLIZER_PATH
fi

# The lines of a libFuzzer log that say what went wrong.
why() {
  grep -m 4 -E 'ERROR: |SUMMARY: |property failed|terminate called|what\(\): |Timeout|out-of-memory' "$1" |
    sed 's/^/    /' || true
}

failures=()
summary=()
for t in $TARGETS; do
  bin="$BUILD/tests/fuzz/fuzz_$t"
  art="$BUILD/artifacts/$t"
  logs="$BUILD/logs/$t"
  work="$BUILD/corpus/$t"
  mkdir -p "$art" "$logs" "$work"
  rm -f "$logs"/*.log
  dict="tests/fuzz/dict/$t.dict"
  if [ "$t" = recipe_set ]; then dict=tests/fuzz/dict/recipe.dict; fi
  status=ok

  # Every regression input and seed in a process of its own, so that each
  # failing one is named.
  replayed=0
  for f in "tests/fuzz/regressions/$t"/* "tests/fuzz/corpus/$t"/*; do
    [ -f "$f" ] || continue
    replayed=$((replayed + 1))
    log="$logs/replay-$(basename "$f").log"
    if "$bin" "${LIMITS[@]}" "$f" > "$log" 2>&1; then
      rm -f "$log"
    else
      status=FAILED
      failures+=("$t: $f (log $log)")
      echo "fuzz.sh: $t FAILED on $f (log $log):"
      why "$log"
    fi
  done

  executions="-"
  if [ "$FUZZ_SECONDS" -gt 0 ]; then
    log="$logs/fuzz.log"
    dict_flag=()
    if [ -f "$dict" ]; then dict_flag=(-dict="$dict"); fi
    echo "fuzz.sh: fuzzing $t for ${FUZZ_SECONDS}s (log $log)"
    rc=0
    "$bin" "${LIMITS[@]}" "${dict_flag[@]}" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
      -artifact_prefix="$art/" "$work" "tests/fuzz/corpus/$t" > "$log" 2>&1 || rc=$?
    executions="$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')"
    executions="${executions:-?}"
    if [ "$rc" -ne 0 ]; then
      status=FAILED
      artifact="$(grep -o 'Test unit written to [^ ]*' "$log" | tail -n 1 | awk '{print $5}')"
      failures+=("$t: fuzzing found ${artifact:-an input (see the log)} (log $log)")
      echo "fuzz.sh: $t FAILED while fuzzing: ${artifact:-see $log}"
      why "$log"
    fi
  fi
  summary+=("$(printf '%-12s %8s %12s  %s' "$t" "$replayed" "$executions" "$status")")
done

echo
printf '%-12s %8s %12s  %s\n' target replayed executions result
printf '%s\n' "${summary[@]}"
if [ ${#failures[@]} -gt 0 ]; then
  echo
  echo "fuzz.sh: ${#failures[@]} failure(s):"
  printf '  %s\n' "${failures[@]}"
  exit 1
fi
