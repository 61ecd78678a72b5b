#!/usr/bin/env bash
# The GPU producer (transport/csrc/sr_gpu.cu) for a Spark: aarch64 host code, sm_121 device code,
# built by the project's own build code (transport/_native.py) with this machine's x86 nvcc.
#
#   tests/arm64/gpu_cross.sh OUT
#
# nvcc cross-compiles with `-ccbin aarch64-linux-gnu-g++ --target-directory sbsa-linux`, which
# needs <cuda>/targets/sbsa-linux (the aarch64 headers and libcudart); a toolkit installed for x86
# has only targets/x86_64-linux. NVIDIA's aarch64 wheels of the same CUDA release carry them:
# nvidia-cuda-runtime (cuda_runtime.h, cuda.h, libcudart_static.a), nvidia-cuda-cccl,
# nvidia-cuda-crt and nvidia-cuda-nvcc (fatbinary_section.h). They are unpacked into OUT/cuda, a
# private toolkit tree (this nvcc, its tools linked, the sbsa-linux target from the wheels), so
# the machine's CUDA is left alone. Exit 0 with libsr_gpu.so in OUT/transport, 2 where it cannot
# be tried (no nvcc, no aarch64 g++), 1 on a failed build.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:?usage: gpu_cross.sh OUT}
if [[ -x $REPO/.venv/bin/pip ]]; then PIP=("$REPO/.venv/bin/pip"); else PIP=(python3 -m pip); fi
ARCH=sm_121

log() { printf '[arm64 %s] gpu: %s\n' "$(date -u +%H:%M:%S)" "$*"; }

NVCC=$(command -v "${NVCC:-nvcc}" || true)
[[ -n $NVCC ]] || { log "no nvcc on this machine: install the CUDA toolkit (13.x) to cross-compile sr_gpu.cu"; exit 2; }
command -v aarch64-linux-gnu-g++ >/dev/null || {
	log "no aarch64-linux-gnu-g++ (nvcc's host compiler for aarch64): apt-get install g++-aarch64-linux-gnu"
	exit 2
}
# /usr/local/bin/nvcc may be a wrapper script: the toolkit is where the real binary lives.
HERE_BIN=$(cd /tmp && "$NVCC" -dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)
TOOLKIT=$(cd "$HERE_BIN/.." && pwd)
RELEASE=$("$TOOLKIT/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
log "nvcc $RELEASE at $TOOLKIT; target files from the aarch64 wheels of CUDA $RELEASE"

WHEELS=$OUT/wheels/$RELEASE
TREE=$OUT/cuda
if [[ ! -d $WHEELS ]]; then
	mkdir -p "$WHEELS.tmp"
	"${PIP[@]}" download -q --no-deps -d "$WHEELS.tmp" --only-binary=:all: \
		--platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
		"nvidia-cuda-runtime==$RELEASE.*" "nvidia-cuda-cccl==$RELEASE.*" "nvidia-cuda-crt==$RELEASE.*" \
		"nvidia-cuda-nvcc==$RELEASE.*"
	mv "$WHEELS.tmp" "$WHEELS"
fi
rm -rf "$TREE"
mkdir -p "$TREE/bin" "$TREE/targets/sbsa-linux" "$TREE/unpacked"
cp "$TOOLKIT/bin/nvcc" "$TOOLKIT/bin/nvcc.profile" "$TREE/bin/" # nvcc finds its tree from its own place
for tool in "$TOOLKIT"/bin/*; do
	[[ -e $TREE/bin/$(basename "$tool") ]] || ln -s "$tool" "$TREE/bin/"
done
ln -s "$TOOLKIT/nvvm" "$TREE/nvvm"
ln -s "$TOOLKIT/targets/x86_64-linux" "$TREE/targets/x86_64-linux"
for wheel in "$WHEELS"/*.whl; do
	python3 -m zipfile -e "$wheel" "$TREE/unpacked"
	log "target files from $(basename "$wheel")"
done
mkdir -p "$TREE/targets/sbsa-linux/include" "$TREE/targets/sbsa-linux/lib"
cp -r "$TREE/unpacked/nvidia/cu13/include/." "$TREE/targets/sbsa-linux/include/"
cp -r "$TREE/unpacked/nvidia/cu13/lib/." "$TREE/targets/sbsa-linux/lib/"

# The project's build of the GPU producer for sm_121 (gpu_library), with the cross host compiler.
SPARKRING_TRANSPORT_CACHE=$OUT/transport NVCC=$TREE/bin/nvcc PYTHONPATH=$REPO python3 - "$ARCH" <<'EOF'
import subprocess
import sys

from transport import _native

arch = sys.argv[1]
lib = _native.gpu_library(arch)
cross = _native.NativeLib(lib.name, lib.sources, lib.extra,
                          (*lib.cc, "-ccbin", "aarch64-linux-gnu-g++", "--target-directory", "sbsa-linux"))
path = cross.build()
kind = subprocess.run(["file", "-b", str(path)], capture_output=True, text=True, check=True).stdout.strip()
if "aarch64" not in kind:
    sys.exit(f"{path} is not an aarch64 object: {kind}")
print(f"[arm64] gpu: {path} (built, or cached by its key): {', '.join(kind.split(', ')[:2])}, {arch}")
EOF
