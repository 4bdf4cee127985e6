#!/usr/bin/env bash
# The Python package's tests (tests/python/): builds the wheel once (scripts/build-wheel.sh),
# installs it into a fresh virtual environment, and compares its command and API with the
# cargo-built command line; then PyTorch's own reader of snapshots on the files tensormem writes
# (tests/python/test_memory_viz.py).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(bash scripts/build-wheel.sh | tail -n 1)
# Portable: linked against glibc 2.17 (maturin refuses symbols newer than the tag it gives).
case "$wheel" in
  *manylinux_2_17_x86_64*) echo "== the wheel: $wheel" ;;
  *) echo "error: the wheel is not tagged manylinux2014 (glibc 2.17): $wheel" >&2; exit 1 ;;
esac
echo "== the cargo-built command line, to compare with"
cargo build --release --locked -p native-runner --quiet
venv=target/python-test-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "$wheel"
# PyTorch's own reader of snapshots (torch/cuda/_memory_viz.py), one file out of the torch
# wheel that tests/python/memory-viz-requirements.txt pins by hash; kept between runs, under
# that file's hash (a new pin fetches anew).
pin=$(sha256sum tests/python/memory-viz-requirements.txt | cut -c1-16)
memory_viz="target/pytorch-memory-viz/$pin/_memory_viz.py"
if [ ! -f "$memory_viz" ]; then
  echo "== fetching torch/cuda/_memory_viz.py from PyPI's torch wheel"
  download=$(mktemp -d)
  trap 'rm -rf "$download"' EXIT
  if "$venv/bin/python" -m pip download -q --timeout 20 --retries 1 --no-deps --only-binary=:all: \
      --platform macosx_11_0_arm64 --python-version 3.11 -r tests/python/memory-viz-requirements.txt \
      -d "$download"; then
    python3 - "$download" "$memory_viz" <<'PY'
import glob, os, sys, zipfile
(wheel,) = glob.glob(os.path.join(sys.argv[1], "torch-*.whl"))
with zipfile.ZipFile(wheel) as z:
    text = z.read("torch/cuda/_memory_viz.py")
os.makedirs(os.path.dirname(sys.argv[2]), exist_ok=True)
with open(sys.argv[2] + ".part", "wb") as f:
    f.write(text)
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
  else
    echo "could not fetch it: its tests are skipped (and fail under CI=true)" >&2
  fi
  rm -rf "$download"
fi
# Run from elsewhere, so that `import tensormem` finds the installed package, not python/. Both
# files run, whatever the first's result.
cd target
status=0
TENSORMEM_CLI="$PWD/release/tensormem" "python-test-venv/bin/python" ../tests/python/test_package.py || status=1
TENSORMEM_CLI="$PWD/release/tensormem" MEMORY_VIZ="$PWD/pytorch-memory-viz/$pin/_memory_viz.py" \
  "python-test-venv/bin/python" ../tests/python/test_memory_viz.py || status=1
exit $status
