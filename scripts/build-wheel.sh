#!/usr/bin/env bash
# Builds the Python wheel (python/): the page's wasm (scripts/build-web.sh), then maturin (whose
# build of python/ copies the page into the package), linked by zig for manylinux2014. Prints the
# wheel's path last. Installs maturin and zig into target/python-venv (a virtual environment of its
# own) when they are not there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/python-venv
if [ ! -x "$venv/bin/maturin" ] || ! "$venv/bin/python" -c 'import ziglang' 2>/dev/null; then
  echo "== installing maturin and zig into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin==1.16.0" "ziglang==0.17.1"
fi
# The page's wasm, fresh: python/build.rs copies the page into the package.
bash scripts/build-web.sh
echo "== building the wheel (maturin, release)"
rm -rf target/wheels
# Linked by zig against glibc 2.17 (manylinux2014): the wheel installs on any Linux of the last
# decade, not only on one as new as this machine; maturin checks the symbols it uses. (maturin
# finds zig as `python -m ziglang` with the first python on PATH: the venv's.)
PATH="$PWD/$venv/bin:$PATH" maturin build --release --locked --zig --compatibility manylinux2014 \
  --manifest-path python/Cargo.toml --out target/wheels >&2
ls target/wheels/tensormem-*.whl
