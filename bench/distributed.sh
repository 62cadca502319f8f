#!/usr/bin/env bash
# Data parallelism on this machine (docs/DISTRIBUTED.md): the default recipe's
# training step with 1 process x T threads against N processes x T/N threads
# (the same cores), read from each run's metrics.jsonl, and the all-reduce
# bandwidth against message size (bench_allreduce). Each configuration runs
# alone, one after the other.
#
#   bench/distributed.sh [BUILD_DIR=build] [STEPS=200] [NP=2]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-200}
np=${3:-2}
threads=$(nproc)
recipe=recipes/vit/fmnist_tiny.yaml
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # NAME THREADS BUCKET_MB LAUNCH...
  local name=$1 t=$2 mb=$3
  shift 3
  "$@" "$build/apps/attnforge" train "$recipe" --out "$out/$name" --set loop.steps="$steps" \
    --set loop.log_every=$((steps / 4)) --set loop.eval_every="$steps" --set threads="$t" \
    --set distributed.bucket_mb="$mb" > "$out/$name.log" 2>&1
}

per=$((threads / np > 0 ? threads / np : 1))
run one "$threads" 25
run dp "$per" 25 "${mpirun[@]}" -np "$np"
# The model's 0.53 MiB of gradients fit one 25 MiB bucket, which can only
# start when the backward ends; 0.1 MiB buckets start during it.
run dp_small "$per" 0.1 "${mpirun[@]}" -np "$np"

echo "default recipe ($recipe), batch 128, $steps steps, $(nproc) cores; the last 3 log windows"
echo
echo "| processes x threads, bucket | step time | samples/s | all-reduce per step | exposed after the backward | buckets started in the backward | eval accuracy |"
echo "|---|---|---|---|---|---|---|"
for name in one dp dp_small; do
  python3 - "$out/$name/metrics.jsonl" "$name" "$np" "$threads" <<'PY'
import json, sys
path, name, np_, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
recs = [json.loads(l) for l in open(path)]
train = [r for r in recs if r["split"] == "train"][-3:]
ev = [r for r in recs if r["split"] == "eval"][-1]
mean = lambda k: sum(r[k] for r in train) / len(train)
procs = 1 if name == "one" else np_
t = threads if name == "one" else max(threads // np_, 1)
bucket = "" if name == "one" else (", 0.1 MiB" if name == "dp_small" else ", 25 MiB")
ar = f'{mean("allreduce_ms"):.2f} ms' if "allreduce_ms" in train[0] else "-"
ex = f'{mean("allreduce_exposed_ms"):.2f} ms' if "allreduce_exposed_ms" in train[0] else "-"
bk = f'{mean("buckets_started_in_backward"):.2f}' if "buckets_started_in_backward" in train[0] else "-"
print(f'| {procs} x {t}{bucket} | {mean("step_time_ms"):.1f} ms | {mean("samples_per_s"):.0f} | {ar} | {ex} | {bk} | {100 * ev["accuracy"]:.2f}% |')
PY
done
echo
"${mpirun[@]}" -np "$np" "$build/bench/bench_allreduce"
