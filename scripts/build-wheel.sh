#!/usr/bin/env bash
# Builds the Python wheel (python/): the page's wasm (scripts/build-web.sh), then maturin (whose
# build of python/ copies the page into the package). Prints the wheel's path last. Installs
# maturin into target/python-venv (a virtual environment of its own) when it is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python-venv
if [ ! -x "$venv/bin/maturin" ]; then
  echo "== installing maturin into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin==1.16.0"
fi
# The page's wasm, fresh: python/build.rs copies the page into the package.
bash scripts/build-web.sh
echo "== building the wheel (maturin, release)"
rm -rf target/wheels
"$venv/bin/maturin" build --release --locked --manifest-path python/Cargo.toml --out target/wheels >&2
ls target/wheels/tensormem-*.whl
