# Sourced by the tests that run a block of docs/USER_GUIDE.md as written:
#   source "$(dirname "$0")/walkthrough.sh" PATH/TO/attnforge MARKER
# sets bin (the attnforge under test, absolute), src (the repository) and work
# (a scratch directory, removed on exit, that sees the repository's recipes
# and has an empty bin/ for the attnforge the block is to find), and writes
# the block between <!-- MARKER --> and <!-- /MARKER --> to
# $work/walkthrough.sh. run_walkthrough then runs it there.
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/attnforge_$2.XXXXXX")"
trap 'rm -rf "$work"' EXIT

marker="$2"
awk -v start="<!-- $marker -->" -v stop="<!-- /$marker -->" \
  'index($0, start) {on = 1; next} index($0, stop) {on = 0} on' \
  "$src/docs/USER_GUIDE.md" | sed '/^```/d' >"$work/walkthrough.sh"
ln -s "$src/recipes" "$work/recipes"
mkdir "$work/bin"

# Runs the block in $work with $work/bin (then Debian's python3) first on the
# PATH, its output in $work/out.log; a failing step fails the test.
run_walkthrough() {
  (cd "$work" && PATH="$work/bin:/usr/bin:$PATH" bash -euo pipefail walkthrough.sh) \
    >"$work/out.log" 2>&1 ||
    {
      echo "FAIL: the $marker block of docs/USER_GUIDE.md stopped:"
      tail -40 "$work/out.log"
      exit 1
    }
}
