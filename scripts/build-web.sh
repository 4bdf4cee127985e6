#!/usr/bin/env bash
# Builds the web page's wasm: the library for wasm32 (release), wasm-bindgen --target web into
# www/pkg/, wasm-opt when it is on PATH. Prints the gzipped size of what the page loads.
# Installs what it needs: the wasm32 target and wasm-bindgen-cli at the wasm-bindgen crate's version.
set -euo pipefail
cd "$(dirname "$0")/.."

rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
  echo "== installing wasm-bindgen-cli $version (a few minutes, once)"
  cargo install wasm-bindgen-cli --version "$version" --force >/dev/null
fi

echo "== building the page's wasm (release)"
cargo build --locked --profile wasm-release --lib --target wasm32-unknown-unknown
rm -rf www/pkg
# Without the name section (10% of the wasm): a panic's message and place reach the page and the
# console through the panic hook instead. TENSORMEM_WASM_NAMES=1 keeps it, for a profiler.
names=--remove-name-section
[ "${TENSORMEM_WASM_NAMES:-}" = 1 ] && names=""
wasm-bindgen --target web --no-typescript $names --out-dir www/pkg "${CARGO_TARGET_DIR:-target}/wasm32-unknown-unknown/wasm-release/tensormem.wasm"
if command -v wasm-opt >/dev/null; then
  wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext --enable-mutable-globals \
    www/pkg/tensormem_bg.wasm -o www/pkg/tensormem_bg.wasm.opt && mv www/pkg/tensormem_bg.wasm.opt www/pkg/tensormem_bg.wasm
else
  echo "   (wasm-opt not found: skipping the size optimisation)"
fi

# What the page loads: the wasm, its JS glue and the page's own files, gzipped.
total=0
for f in www/pkg/tensormem_bg.wasm www/pkg/tensormem.js www/*.html www/*.js www/*.css; do
  [ -f "$f" ] || continue
  total=$((total + $(gzip -9 -c "$f" | wc -c)))
done
printf '== page size: %s bytes gzipped (wasm %s bytes raw); budget 1572864\n' "$total" "$(wc -c < www/pkg/tensormem_bg.wasm)"
if [ "$total" -gt 1572864 ]; then
  echo "error: the page is over its 1.5 MB gzipped budget" >&2
  exit 1
fi
