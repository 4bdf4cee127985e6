#!/usr/bin/env bash
# Prepares .gl/ (git-ignored) for tools/device/h100.sh on a lent NVIDIA machine, which has no
# Vulkan loader, no Rust toolchain and no network: the loader and glvnd packages (.deb, amd64),
# the release `tensormem` and the native op-suite test binary (tests/gpu_ops.rs), stripped; the wheel.
# Carry [".gl"] to the machine. Rerun after changing the code: the binaries are copies.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gl/bin
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  (cd .gl && apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
cargo build --release --locked -p native-runner
exe=$(cargo test --release --locked --test gpu_ops --no-run --message-format=json \
  | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_ops":
        print(m["executable"])' | tail -1)
[ -x "$exe" ] || { echo "no gpu_ops executable found" >&2; exit 1; }
cp "$exe" .gl/bin/gpu_ops
cp target/release/tensormem .gl/bin/tensormem
strip .gl/bin/gpu_ops .gl/bin/tensormem
# tensormem.watch()'s check (tools/device/watch_check.py) installs the wheel there.
bash scripts/build-wheel.sh
rm -rf .gl/wheel && mkdir -p .gl/wheel && cp target/wheels/tensormem-*.whl .gl/wheel/
# The test writes under the CARGO_TARGET_TMPDIR compiled into it: h100.sh creates it there.
echo "$(pwd)/target/tmp" > .gl/target_tmpdir
du -sh .gl
ls -la .gl .gl/bin
