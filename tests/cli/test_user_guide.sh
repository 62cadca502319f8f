#!/usr/bin/env bash
# The walkthrough of docs/USER_GUIDE.md, run exactly as written: the shell
# block between <!-- walkthrough --> and <!-- /walkthrough --> runs in a
# scratch directory that sees the repository's recipes, with attnforge (and
# Debian's python3, for the PyTorch step) first on the PATH. Then its results
# are checked: what each step claims it made is there.
#   tests/cli/test_user_guide.sh PATH/TO/attnforge
set -euo pipefail
source "$(dirname "$0")/walkthrough.sh" "$1" walkthrough
[ "$(grep -c '^attnforge ' "$work/walkthrough.sh")" -ge 6 ] ||
  { echo "FAIL: the walkthrough block of docs/USER_GUIDE.md was not found"; exit 1; }
ln -s "$bin" "$work/bin/attnforge"
run_walkthrough

fail=0
check() { "$@" || { echo "FAIL: $*"; fail=1; }; }
check grep -q '"top5_accuracy"' "$work/runs/guide/eval.json"
check test "$(wc -l <"$work/runs/guide/predictions.jsonl")" -eq 10000
# The exported model gave attnforge's logits (the walkthrough prints the gap).
gap="$(sed -n 's/^largest difference from attnforge predict: //p' "$work/out.log")"
check python3 -c "import sys; sys.exit(0 if float('$gap') < 1e-4 else 1)"
check grep -q "init_from .*tensors loaded" "$work/runs/guide-finetuned/train.log"
check test -s "$work/runs/guide-maps/rollout.png"
if [ "$fail" -ne 0 ]; then
  tail -40 "$work/out.log"
  exit 1
fi
echo "the user guide's walkthrough ran ($(grep -c '^attnforge ' "$work/walkthrough.sh") commands; exported model within $gap of predict)"
