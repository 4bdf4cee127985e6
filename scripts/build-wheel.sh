#!/usr/bin/env bash
# Builds the Python wheel (python/): the page's wasm and files (scripts/build-web.sh) copied into
# the package, then maturin. Prints the wheel's path last. Installs maturin into target/python-venv
# (a virtual environment of its own) when it is not there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python-venv
if [ ! -x "$venv/bin/maturin" ]; then
  echo "== installing maturin into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin==1.16.0"
fi
bash scripts/build-web.sh
rm -rf python/tensormem/www
mkdir -p python/tensormem/www/pkg
cp www/*.html www/*.js www/*.css python/tensormem/www/
cp www/pkg/tensormem.js www/pkg/tensormem_bg.wasm python/tensormem/www/pkg/
echo "== building the wheel (maturin, release)"
rm -rf target/wheels
"$venv/bin/maturin" build --release --locked --manifest-path python/Cargo.toml --out target/wheels >&2
ls target/wheels/tensormem-*.whl
