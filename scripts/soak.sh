#!/usr/bin/env bash
# kill -9 soak: kills a small training run SOAK_KILLS times, at random instants
# (startup, training, evaluation, checkpoint writes) and inside checkpoint
# writes (ATTNFORGE_FAULT=checkpoint:n:kill: the n-th checkpoint write step SIGKILLs the
# process), resumes it each time and checks that
#   - every checkpoint directory left after a kill loads (attnforge eval), and
#     checkpoints/latest and checkpoints/best name existing checkpoints,
#   - the run can always be resumed and finishes (exit status 0),
#   - once it has finished, no leftover *.tmp-* / *.old-* / *.del-* remains and
#     checkpoints/ holds what an uninterrupted run's holds (keep_last 1, so the
#     last save prunes after its commit and kills land there too),
#   - the final model.safetensors is byte-identical to that of an uninterrupted
#     run of the same recipe (also for a small language model and for a
#     2-process mpirun job whose killed rank is drawn at random, each killed
#     SOAK_OTHER_KILLS times); so are optimizer.safetensors' tensors and
#     __metadata__ apart from state_json_xxh3_64 (the checksum of a state.json
#     holding wall times), and state.json apart from those wall times
#     (elapsed_s, window.seconds).
# Kills go SOAK_PER_RUN to a run directory (kill, resume, kill, ..., finish).
#
#   scripts/soak.sh [PATH/TO/attnforge]      (or ATTNFORGE=...; default build/apps/attnforge)
#
# Environment: SOAK_KILLS (40), SOAK_SEED (1), SOAK_PER_RUN (4), SOAK_HOOK_MAX
# (20: the hook's n is drawn in 1..SOAK_HOOK_MAX), SOAK_SPAN_MS (the
# random-instant window; default: the uninterrupted run's wall time), SOAK_KEEP=1
# (keep the work directory on success too; it is always kept on failure).
# The schedule comes from a fixed LCG seeded with SOAK_SEED, so the k-th kill
# always gets the same kind and draw; a random instant's effect still depends
# on timing, so a failure names the delay it used.
set -uo pipefail

bin="${1:-${ATTNFORGE:-build/apps/attnforge}}"
kills="${SOAK_KILLS:-40}"
seed="${SOAK_SEED:-1}"
per_run="${SOAK_PER_RUN:-4}"
hook_max="${SOAK_HOOK_MAX:-20}"
keep="${SOAK_KEEP:-0}"

[ -x "$bin" ] || { echo "soak: $bin is not an executable (give the attnforge path as \$1 or ATTNFORGE=)"; exit 2; }
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
for v in kills seed per_run hook_max; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "soak: $v must be a non-negative integer, found '${!v}'"; exit 2; }
done
if [ "$per_run" -lt 1 ] || [ "$hook_max" -lt 1 ]; then
  echo "soak: SOAK_PER_RUN and SOAK_HOOK_MAX must be >= 1"
  exit 2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/attnforge_soak.XXXXXX")"
failed=0
finish() {
  if [ "$failed" -eq 0 ] && [ "$keep" != 1 ]; then
    rm -rf "$work"
  else
    echo "soak: work directory kept: $work"
  fi
}
trap finish EXIT

# ---- the schedule: a 31-bit LCG (same numbers on every machine and bash) ----
rng_state=$(( (seed * 2654435761 + 1) % 2147483648 ))
# rand N: sets $r to a number in 0..N-1.
rand() {
  rng_state=$(( (rng_state * 1103515245 + 12345) % 2147483648 ))
  r=$(( (rng_state >> 8) % $1 ))
}

total_steps=60
cat >"$work/soak.yaml" <<'EOF'
name: soak
threads: 1
model: {type: vit, image_size: 28, patch_size: 7, dim: 32, depth: 1, heads: 2, mlp_ratio: 2}
data: {dataset: fashion_mnist, limit_train: 1024, limit_eval: 128, workers: 1}
schedule: {kind: cosine, warmup_steps: 5}
loop: {epochs: 0, steps: 60, batch_size: 32, log_every: 5, eval_every: 20}
checkpoint: {every: 10, keep_last: 1}
EOF
final_name="$(printf 'step-%08d' "$total_steps")"

now_ms() { date +%s%3N; }
fail() {
  echo "FAIL: $*"
  failed=$((failed + 1))
}

# ---- the uninterrupted reference ----
ref="$work/ref"
t0=$(now_ms)
if ! timeout -s KILL 600 "$bin" train "$work/soak.yaml" --out "$ref" >"$work/ref.log" 2>&1; then
  echo "soak: the uninterrupted reference run failed; log:"
  cat "$work/ref.log"
  failed=1
  exit 1
fi
ref_ms=$(( $(now_ms) - t0 ))
span_ms="${SOAK_SPAN_MS:-$ref_ms}"
ref_ckpt="$ref/checkpoints/$final_name"
[ "$(cat "$ref/checkpoints/latest" 2>/dev/null)" = "$final_name" ] ||
  { echo "soak: the reference run's latest is not $final_name"; failed=1; exit 1; }

hook=0
if grep -q ATTNFORGE_FAULT "$bin"; then hook=1; fi
echo "soak: $kills kills, seed $seed, $per_run per run directory; reference run ${ref_ms} ms, random instants over the rest of a ${span_ms} ms run (SOAK_SPAN_MS; shrunk when a run ends before its kill)"
[ "$hook" -eq 1 ] || echo "soak: NOTE: $bin has no ATTNFORGE_FAULT hook; every kill is at a random instant"

# ---- checks ----
n_random=0 n_write=0 n_missed=0
n_loaded=0 n_corrupt=0 n_noresume=0 n_leftover=0 n_identical=0 n_differ=0
n_restart=0 n_nockpt=0
declare -A verified=()  # checkpoint fingerprint -> loaded before
declare -A hist=()      # run directory -> the attempts it went through

# check_checkpoints RUN WHAT: every step-NNNNNNNN directory loads; the pointers name existing ones.
check_checkpoints() {
  local run="$1" what="$2" dir="$1/checkpoints" ck fp out st p name bad=0
  [ -d "$dir" ] || return 0
  for ck in "$dir"/step-????????; do
    [ -d "$ck" ] || continue
    [[ "$(basename "$ck")" =~ ^step-[0-9]{8}$ ]] || continue
    # A checkpoint directory is never modified in place: skip one already loaded.
    fp="$(stat -c '%n %i %s %y' "$ck" "$ck"/* 2>/dev/null | md5sum)"
    [ -n "${verified[$fp]:-}" ] && continue
    out="$(timeout -s KILL 300 "$bin" eval "$ck" --set data.limit_eval=64 --out "$work/eval.json" --overwrite 2>&1)"
    st=$?
    if [ "$st" -eq 0 ]; then
      verified[$fp]=1
      n_loaded=$((n_loaded + 1))
    else
      fail "$what: checkpoint $ck does not load (eval exit $st): $out"
      n_corrupt=$((n_corrupt + 1))
      bad=1
    fi
  done
  for p in latest best; do
    [ -e "$dir/$p" ] || continue
    name="$(cat "$dir/$p")"
    if ! [[ "$name" =~ ^step-[0-9]{8}$ ]] || [ ! -d "$dir/$name" ]; then
      fail "$what: checkpoints/$p holds '$name', not an existing checkpoint ($(ls "$dir" | tr '\n' ' '))"
      n_corrupt=$((n_corrupt + 1))
      bad=1
    fi
  done
  return $bad
}

# The step of RUN's latest checkpoint (as the manager picks it: `latest`, or the
# newest checkpoint directory when a kill came before `latest` was written); 0 for none.
latest_step() {
  local name newest
  name="$(cat "$1/checkpoints/latest" 2>/dev/null)"
  newest="$(cd "$1/checkpoints" 2>/dev/null && compgen -G "step-????????" | sort | tail -n 1)"
  [[ "$name" =~ ^step-[0-9]{8}$ ]] || name="$newest"
  [[ "$name" =~ ^step-([0-9]{8})$ ]] && echo $((10#${BASH_REMATCH[1]})) || echo 0
}

# The command that continues RUN: --resume once the first start has recorded
# the recipe; before that (killed within its first milliseconds) the first start again.
start_cmd() {
  if [ -f "$1/recipe.yaml" ]; then
    cmd=("$bin" train --resume "$1")
  else
    cmd=("$bin" train "$work/soak.yaml" --out "$1")
  fi
}

# same_apart_from_state_checksum A B: two safetensors files with the same tensor
# bytes and the same __metadata__ except the state_json_* keys
# (optimizer.safetensors holds the checksum of state.json, which holds wall times).
same_apart_from_state_checksum() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def parse(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = {k: v for k, v in header.pop("__metadata__", {}).items() if not k.startswith("state_json")}
    return header, meta, raw[8 + n:]
(ha, ma, da), (hb, mb, db) = parse(sys.argv[1]), parse(sys.argv[2])
if ha != hb: print("the tensor headers differ"); sys.exit(1)
if da != db:
    bad = [k for k, v in ha.items() if da[v["data_offsets"][0]:v["data_offsets"][1]] != db[v["data_offsets"][0]:v["data_offsets"][1]]]
    print("tensor bytes differ:", " ".join(bad)); sys.exit(1)
if ma != mb:
    print("__metadata__ differs:", " ".join(sorted(k for k in set(ma) | set(mb) if ma.get(k) != mb.get(k)))); sys.exit(1)
PY
}

# finish_run RUN: resume it to the end; compare its final checkpoint with the reference.
finish_run() {
  local run="$1" st left name f same
  start_cmd "$run"
  local what
  what="seed $seed $(basename "$run") (finishing after${hist[$run]:- no kill}; ${cmd[*]:1})"
  timeout -s KILL 600 "${cmd[@]}" >"$run.final.log" 2>&1
  st=$?
  if [ "$st" -ne 0 ]; then
    fail "$what: the final resume exited $st: $(tail -n 3 "$run.final.log")"
    n_noresume=$((n_noresume + 1))
    return
  fi
  check_checkpoints "$run" "$what"
  left="$(find "$run" \( -name '*.tmp-*' -o -name '*.old-*' -o -name '*.del-*' \) -printf '%P ' 2>/dev/null)"
  local untidy=0
  if [ -n "$left" ]; then
    fail "$what: leftovers after the run finished: $left"
    untidy=1
  fi
  # keep_last 1: the last save prunes after its commit, so kills land there too.
  local have want
  have="$(cd "$run/checkpoints" && ls -A | tr '\n' ' ')"
  want="$(cd "$ref/checkpoints" && ls -A | tr '\n' ' ')"
  if [ "$have" != "$want" ]; then
    fail "$what: checkpoints/ holds [$have] after the run finished; the uninterrupted run's holds [$want]"
    untidy=1
  fi
  n_leftover=$((n_leftover + untidy))
  name="$(cat "$run/checkpoints/latest" 2>/dev/null)"
  if [ "$name" != "$final_name" ]; then
    fail "$what: checkpoints/latest is '$name', expected $final_name"
    return
  fi
  same=1
  if ! cmp -s "$ref_ckpt/model.safetensors" "$run/checkpoints/$name/model.safetensors"; then
    same=0
    fail "$what: model.safetensors is not byte-identical to the uninterrupted run's: $(same_apart_from_state_checksum "$ref_ckpt/model.safetensors" "$run/checkpoints/$name/model.safetensors" || true)"
  fi
  f=optimizer.safetensors
  if ! out="$(same_apart_from_state_checksum "$ref_ckpt/$f" "$run/checkpoints/$name/$f")"; then
    same=0
    fail "$what: $f differs from the uninterrupted run's: $out"
  fi
  if out="$(python3 - "$ref_ckpt/state.json" "$run/checkpoints/$name/state.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
for s in (a, b):
    s.pop("elapsed_s", None)
    s.get("window", {}).pop("seconds", None)
if a != b:
    print(json.dumps(a, sort_keys=True), "vs", json.dumps(b, sort_keys=True))
    sys.exit(1)
PY
)"; then :; else
    same=0
    fail "$what: state.json differs from the uninterrupted run's (elapsed_s aside): $out"
  fi
  if [ "$same" -eq 1 ]; then
    n_identical=$((n_identical + 1))
  else
    n_differ=$((n_differ + 1))
  fi
}

# ---- the kills ----
# Attempt k draws the same two numbers whatever happens. Odd attempts kill at a
# random instant, even ones inside a checkpoint write. A run directory takes
# SOAK_PER_RUN kills, then is finished and compared; one that ends before its
# kill (a miss, not counted) is compared at once; one that fails is kept.
runs=0 run="" run_kills=0 attempt=0
while [ $((n_random + n_write)) -lt "$kills" ] && [ "$attempt" -lt $((3 * kills)) ]; do
  if [ -z "$run" ]; then
    runs=$((runs + 1))
    run="$work/run$runs"
    run_kills=0
  fi
  attempt=$((attempt + 1))
  rand 1000000; frac=$r
  rand "$hook_max"; n=$((r + 1))
  start_cmd "$run"
  log="$run.attempt$attempt.log"
  was_first=$([ -f "$run/recipe.yaml" ] && echo 0 || echo 1)
  before=$(latest_step "$run")
  if [ "$was_first" -eq 1 ] && [ -n "${hist[$run]:-}" ]; then
    n_restart=$((n_restart + 1))  # killed before it wrote recipe.yaml: started again
  elif [ "$was_first" -eq 0 ] && ! compgen -G "$run/checkpoints/step-????????" >/dev/null; then
    n_nockpt=$((n_nockpt + 1))    # --resume of a run without a checkpoint
  fi
  t_start=$(now_ms)
  if [ "$hook" -eq 1 ] && [ $((attempt % 2)) -eq 0 ]; then
    kind="inside a checkpoint write, ATTNFORGE_FAULT=checkpoint:$n:kill"
    st=$( (ATTNFORGE_FAULT=checkpoint:$n:kill timeout -s KILL 600 "${cmd[@]}" >"$log" 2>&1; echo $?) 2>/dev/null)
    is_write=1
  else
    # The window: the rest of the run (from its latest checkpoint) plus a tenth for startup.
    window=$(( span_ms * (total_steps - before) / total_steps + span_ms / 10 ))
    delay=$(( window * frac / 1000000 ))
    kind="at a random instant, $delay ms after the start (window $window ms)"
    st=$( ( "${cmd[@]}" >"$log" 2>&1 &
            pid=$!
            sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
            kill -9 "$pid" 2>/dev/null
            wait "$pid"
            echo $? ) 2>/dev/null)
    is_write=0
  fi
  what="seed $seed attempt $attempt ($(basename "$run"), from step $before, $kind; ${cmd[*]:1}; log $log)"
  case "$st" in
    137)
      if [ "$is_write" -eq 1 ]; then n_write=$((n_write + 1)); else n_random=$((n_random + 1)); fi
      run_kills=$((run_kills + 1))
      ;;
    0)
      n_missed=$((n_missed + 1))
      # The run was faster than the window: shrink the window to what it took.
      took=$(( $(now_ms) - t_start ))
      if [ "$before" -lt "$total_steps" ] && [ -z "${SOAK_SPAN_MS:-}" ]; then
        full=$(( took * total_steps / (total_steps - before) ))
        [ "$full" -lt "$span_ms" ] && span_ms=$full
      fi
      ;;
    *)
      if [ "$was_first" -eq 0 ]; then
        why="could not resume"
        if grep -q "no checkpoint to resume from" "$log"; then
          why="could not resume a run killed before its first checkpoint"
        fi
      else
        why="the first start failed"
      fi
      fail "$what: $why (exit $st): $(tail -n 3 "$log")"
      n_noresume=$((n_noresume + 1))
      echo "soak: $(basename "$run") abandoned (kept in $run)"
      run=""
      continue
      ;;
  esac
  case "$st" in
    137) outcome="killed" ;;
    0) outcome="ended before the kill" ;;
  esac
  echo "soak: attempt $attempt: $(basename "$run") from step $before, $kind: $outcome"
  hist[$run]="${hist[$run]:-} [attempt $attempt from step $before, $kind: $outcome]"
  if ! check_checkpoints "$run" "$what"; then
    echo "soak: $(basename "$run") abandoned (kept in $run)"
    run=""
    continue
  fi
  if [ "$st" -eq 0 ] || [ "$run_kills" -ge "$per_run" ]; then
    finish_run "$run"
    run=""
  fi
done
[ -z "$run" ] || finish_run "$run"

if [ "$n_differ" -gt 0 ]; then
  # Tell a resume bug from a nondeterministic run: does a second uninterrupted run match?
  "$bin" train "$work/soak.yaml" --out "$work/ref2" >"$work/ref2.log" 2>&1
  if cmp -s "$ref_ckpt/model.safetensors" "$work/ref2/checkpoints/$final_name/model.safetensors"; then
    echo "soak: a second uninterrupted run matches the first: the differences come from the kills"
  else
    echo "soak: a second uninterrupted run differs from the first too: the run itself is not deterministic"
  fi
fi

# ---- a language model, and a 2-process job with one rank killed ----
# Each: an uninterrupted reference, then SOAK_OTHER_KILLS (3) kills at random
# instants of the rest of the run, each followed by --resume, until it
# finishes; its final model.safetensors must equal the reference's byte for
# byte (a job resumed with the same number of processes sums in the same
# order: docs/DISTRIBUTED.md). SOAK_OTHERS=0 skips them.
cat >"$work/lm.yaml" <<'EOF2'
name: soak_lm
threads: 1
model: {type: language_model, dim: 32, depth: 1, heads: 2, mlp_ratio: 2, causal: true, positional: rotary_only, attention: {kind: linear}}
data: {dataset: lm_text, root: /usr/share/games/fortunes, exclude: ["*.dat", "*.u8"], split_fractions: [0.95, 1.0, 1.0], eval_split: valid, seq_len: 64, limit_eval: 8, workers: 1}
schedule: {kind: cosine, warmup_steps: 5}
loop: {steps: 60, batch_size: 8, log_every: 5, eval_every: 20}
checkpoint: {every: 10, keep_last: 1}
EOF2
other_kills="${SOAK_OTHER_KILLS:-3}"
n_other=0 n_other_identical=0 n_other_killed=0
# other_run NAME RECIPE PROCS: PROCS 1 runs attnforge, 2 runs it under mpirun (one rank killed).
other_run() {
  local name="$1" recipe="$2" procs="$3" launch=() t0 ms k st
  local out="$work/$name" ref_o="$work/$name.ref"
  if [ "$procs" -gt 1 ]; then
    command -v mpirun >/dev/null || { echo "soak: $name skipped: no mpirun"; return 0; }
    launch=(mpirun --allow-run-as-root --oversubscribe -np "$procs")
  fi
  n_other=$((n_other + 1))
  t0=$(now_ms)
  if ! timeout -s KILL 600 "${launch[@]}" "$bin" train "$recipe" --out "$ref_o" >"$ref_o.log" 2>&1; then
    fail "$name: the uninterrupted reference run failed (log $ref_o.log)"
    return 0
  fi
  ms=$(( $(now_ms) - t0 ))
  for ((k = 0; k <= other_kills; k++)); do
    local cmd_o=("${launch[@]}" "$bin" train "$recipe" --out "$out")
    [ -f "$out/recipe.yaml" ] && cmd_o=("${launch[@]}" "$bin" train --resume "$out")
    if [ "$k" -eq "$other_kills" ]; then  # the last start runs to the end
      timeout -s KILL 600 "${cmd_o[@]}" >"$out.last.log" 2>&1 ||
        { fail "$name: the final resume failed (log $out.last.log)"; return 0; }
      break
    fi
    rand 1000000
    local delay=$(( ms * r / 1000000 ))
    "${cmd_o[@]}" >"$out.kill$k.log" 2>&1 &
    local pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    if [ "$procs" -gt 1 ]; then
      # One rank, drawn at random, of the job's attnforge processes.
      mapfile -t ranks < <(pgrep -f "$bin train" | grep -v "^$pid\$")
      if [ "${#ranks[@]}" -gt 0 ]; then
        rand "${#ranks[@]}"
        kill -9 "${ranks[$r]}" 2>/dev/null && n_other_killed=$((n_other_killed + 1))
      fi
    else
      kill -9 "$pid" 2>/dev/null && n_other_killed=$((n_other_killed + 1))
    fi
    st=0
    timeout -s KILL 120 tail --pid="$pid" -f /dev/null || st=$?
    [ "$st" -eq 0 ] || { kill -9 "$pid" 2>/dev/null; fail "$name: the job did not end after its kill ($out.kill$k.log)"; }
    wait "$pid" 2>/dev/null
    pkill -9 -f "$bin train --resume $out\$" 2>/dev/null
    pkill -9 -f "$bin train $recipe --out $out\$" 2>/dev/null
    check_checkpoints "$out" "$name after kill $k" || fail "$name: a checkpoint left by kill $k does not load"
  done
  if cmp -s "$ref_o/checkpoints/$final_name/model.safetensors" "$out/checkpoints/$final_name/model.safetensors"; then
    n_other_identical=$((n_other_identical + 1))
  else
    fail "$name: the resumed run's final model.safetensors differs from the uninterrupted one's"
  fi
}
if [ "${SOAK_OTHERS:-1}" != 0 ]; then
  if [ -d /usr/share/games/fortunes ]; then
    other_run lm "$work/lm.yaml" 1
  else
    echo "soak: the language model skipped: no /usr/share/games/fortunes (Debian's fortunes package)"
  fi
  other_run mpi "$work/soak.yaml" 2
  echo "soak: other runs: $n_other (a language model, a 2-process job), $n_other_killed kills, $n_other_identical byte-identical at the end"
fi

echo "soak: kills done: $((n_random + n_write)) ($n_random at random instants, $n_write inside checkpoint writes; $n_missed more attempts ended before their kill) in $runs run directories"
echo "soak: resumes of a run killed before its first checkpoint: $n_nockpt; first starts repeated (killed before recipe.yaml was written): $n_restart"
echo "soak: checkpoints loaded: $n_loaded; corrupt checkpoints or pointers: $n_corrupt"
echo "soak: runs that could not resume: $n_noresume"
echo "soak: finished runs with leftovers or extra checkpoints: $n_leftover"
echo "soak: byte-identical final model.safetensors: $n_identical/$runs run directories (optimizer tensors and state equal too, wall times aside)"
if [ $((n_random + n_write)) -lt "$kills" ]; then
  fail "only $((n_random + n_write)) of $kills kills happened in $attempt attempts (the runs ended first)"
fi
if [ "$failed" -ne 0 ] || [ "$n_identical" -ne "$runs" ]; then
  [ "$failed" -ne 0 ] || failed=1
  echo "soak: FAILED ($failed failure(s)); reproduce with SOAK_SEED=$seed SOAK_KILLS=$kills SOAK_PER_RUN=$per_run (a random instant acts by timing: each FAIL line gives its delay)"
  exit 1
fi
echo "soak: passed"
