#!/usr/bin/env bash
# The engine's speed against PyTorch on the same NVIDIA card, in one run: `tensormem bench
# --json` (Vulkan through wgpu) and tools/bench/torch_bench.py (cuBLAS fp32 with TF32 off, add,
# sums, device copy, a tiny op's launch), then a table of ratios with the targets of issue 33
# (tools/bench/compare.py). Needs Python with PyTorch and CUDA; without them it says why and
# exits 0.
#
#   bash scripts/bench-vs-torch.sh [SIZES]      (default 1024,2048,4096; PYTHON=... to pick one)
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="${1:-1024,2048,4096}"
python="${PYTHON:-python3}"
out=target/bench-vs-torch
if ! why=$("$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "PyTorch " + torch.__version__ + " sees no CUDA device")' 2>&1); then
  echo "bench-vs-torch: nothing to compare on this machine: $(echo "$why" | tail -n 1) (needs PyTorch with CUDA and an NVIDIA GPU)"
  exit 0
fi
mkdir -p "$out"
cargo build --locked --release -p native-runner --quiet
echo "== tensormem bench --json --sizes $sizes"
# Each report written whole or not at all: a stopped run leaves the previous one.
target/release/tensormem bench --json --sizes "$sizes" > "$out/tensormem.json.tmp" && mv "$out/tensormem.json.tmp" "$out/tensormem.json"
echo "== PyTorch (tools/bench/torch_bench.py --sizes $sizes)"
"$python" tools/bench/torch_bench.py --sizes "$sizes" > "$out/torch.json.tmp" && mv "$out/torch.json.tmp" "$out/torch.json"
"$python" tools/bench/compare.py "$out/tensormem.json" "$out/torch.json"
