#!/usr/bin/env bash
# docs/USER_GUIDE.md's Long Range Arena steps, run as written: small files in
# the releases' formats and folders (LRA's lra_release archive, IMDb's aclImdb,
# CIFAR-10's binary batches) stand where the downloads would unpack, then the
# block between <!-- lra-walkthrough --> and <!-- /lra-walkthrough --> runs in
# a scratch directory that sees the repository's recipes. `attnforge train`
# is shrunk (a tiny model, one step) by the attnforge the block finds on the
# PATH; every other command runs unchanged. Also: without the data, each
# recipe refuses to start.
#   tests/cli/test_lra_guide.sh PATH/TO/attnforge
set -euo pipefail
source "$(dirname "$0")/walkthrough.sh" "$1" lra-walkthrough
for task in listops text retrieval image pathfinder; do
  grep -q "^attnforge data $task --from" "$work/walkthrough.sh" &&
    grep -q "^attnforge train recipes/lra/$task.yaml" "$work/walkthrough.sh" ||
    { echo "FAIL: the LRA walkthrough has no data and train step for $task"; exit 1; }
done
cat >"$work/bin/attnforge" <<WRAP
#!/usr/bin/env bash
if [ "\$1" = train ]; then
  exec "$bin" "\$@" --set model.dim=16 --set model.depth=1 --set model.heads=2 --set model.mlp_dim=16 \
    --set loop.epochs=0 --set loop.steps=1 --set loop.batch_size=2 --set loop.eval_batch_size=4 \
    --set threads=2
fi
exec "$bin" "\$@"
WRAP
chmod +x "$work/bin/attnforge"

# Without the data, every task's recipe refuses to start, naming the command that makes it.
for task in listops text retrieval image pathfinder; do
  if out="$(cd "$work" && "$bin" train "recipes/lra/$task.yaml" 2>&1)"; then
    echo "FAIL: recipes/lra/$task.yaml started without its data"; exit 1
  fi
  grep -q "attnforge data $task --from" <<<"$out" || { echo "FAIL: $task: $out"; exit 1; }
done
[ ! -e "$work/runs" ] || { echo "FAIL: a refused start wrote a run directory"; exit 1; }

# The releases in miniature, in their own formats.
python3 - "$work" <<'PY'
import os, struct, sys, zlib
root = sys.argv[1]
def write(path, data):
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(data if isinstance(data, bytes) else data.encode())
def png_gray(side, pixels):  # 8-bit gray PNG
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\0" + bytes(pixels[y * side:(y + 1) * side]) for y in range(side))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
lra = "lra_release/lra_release/"
exprs = ["( ( [MAX 2 9 ) 1 ] )\t9", "( ( [MIN 4 7 ) ] )\t4", "( [SM 1 2 ] )\t3", "( ( [MED 3 5 8 ) ] )\t5"]
for split, n in (("train", 8), ("val", 4), ("test", 4)):
    write(lra + "listops-1000/basic_%s.tsv" % split, "Source\tTarget\n" + "".join(exprs[i % 4] + "\n" for i in range(n)))
for split, n in (("train", 8), ("eval", 4), ("test", 4)):
    write(lra + "tsv_data/new_aan_pairs.%s.tsv" % split, "".join(
        "%d.0\tP%02d-1\tP%02d-2\tb'Paper %d cites.'\tb'Paper %d is cited.'\n" % (i % 2, i, i, i, i) for i in range(n)))
meta = ""
for i in range(20):
    pixels = [255 if (x + i) % 7 == 0 else 0 for x in range(32 * 32)]
    write(lra + "pathfinder32/curv_contour_length_14/imgs/0/sample_%d.png" % i, png_gray(32, pixels))
    meta += "imgs/0 sample_%d.png %d %d 4 1.5 2\n" % (i, i, i % 2)
write(lra + "pathfinder32/curv_contour_length_14/metadata/0.npy", meta)
for split in ("train", "test"):
    for label in ("neg", "pos"):
        for i in range(4):
            write("aclImdb/%s/%s/%d_%d.txt" % (split, label, i, 1 + i if label == "neg" else 7 + i),
                  "A %s review, number %d.<br /><br />The end." % (label, i))
write("aclImdb/train/unsup/0_0.txt", "unlabelled")
names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
write("cifar-10-batches-bin/batches.meta.txt", "\n".join(names) + "\n\n")
record = lambda label, seed: bytes([label]) + bytes((i * 7 + seed * 13) % 251 for i in range(3072))
for b in range(1, 6):
    write("cifar-10-batches-bin/data_batch_%d.bin" % b, b"".join(record(k % 10, b * 20 + k) for k in range(20)))
write("cifar-10-batches-bin/test_batch.bin", b"".join(record(k, 200 + k) for k in range(10)))
PY

run_walkthrough
fail=0
for task in listops text retrieval image pathfinder; do
  grep -q "prepared LRA $task from" "$work/out.log" || { echo "FAIL: attnforge data $task said nothing"; fail=1; }
  ls "$work"/runs/lra_"$task"-*/checkpoints >/dev/null 2>&1 ||
    { echo "FAIL: recipes/lra/$task.yaml did not train"; fail=1; }
done
[ "$(grep -c "done: 1 steps" "$work/out.log")" -eq 5 ] || { echo "FAIL: not every recipe trained its step"; fail=1; }
if [ "$fail" -ne 0 ]; then
  tail -60 "$work/out.log"
  exit 1
fi
echo "the user guide's LRA steps ran: $(grep -c '^attnforge ' "$work/walkthrough.sh") commands, five tasks trained from their release formats"
