# Sourced by the quick device scripts (matmul_speed.sh, submit_check.sh) from the repository
# root: $OUT made, the Vulkan loader from .gl/ installed where an NVIDIA driver is (the lent
# machine has none), wgpu told to use Vulkan, a private runtime directory for Mesa and NVIDIA.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if command -v nvidia-smi >/dev/null; then
  for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null 2>&1; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export WGPU_BACKEND=vulkan
export XDG_RUNTIME_DIR=/tmp/xdg && mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
