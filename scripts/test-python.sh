#!/usr/bin/env bash
# The Python package's tests (tests/python/): builds the wheel once (scripts/build-wheel.sh),
# installs it into a fresh virtual environment, and compares its command and API with the
# cargo-built command line.
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
# Run from elsewhere, so that `import tensormem` finds the installed package, not python/.
cd target
TENSORMEM_CLI="$PWD/release/tensormem" "python-test-venv/bin/python" ../tests/python/test_package.py
