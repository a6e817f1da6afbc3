#!/usr/bin/env bash
# Prepare, on a CPU machine with the package registry, every wheel a device run needs to import Transformer
# Engine 2.18.0 (megatron-core 0.19.2's development pin) beside the device image's torch 2.11.0+cu130, in
# .whl/ at the repository root (git-ignored through .git/info/exclude; a device run carries it):
#   1. the pure-Python wheels the image lacks (megatron-core, pydantic and its dependencies, TE's Python part)
#   2. TE's CUDA 13 core, its fatbins cut to sm_90 (H100/H200) and repacked (te_carry.py; 279 MB -> ~37 MiB)
#   3. TE's torch extension (published as a source distribution only), compiled with g++ against the device's
#      torch: about 10 minutes on 2 CPUs, no GPU or nvcc needed
#   4. the check: every wheel installed offline, as on the device, and `import transformer_engine.pytorch`
#      with a stand-in libcuda.so.1 (this machine has no driver), then the total against the carry limit
# Usage: bash benchmarks/gpu/prepare_te.sh [WORK]   (WORK: downloads and build venv, default ../te-work)
# PYTHON names a Python 3.12 (the image's); STEPS (default "1 2 3 4") runs a subset.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "${1:-$here/../te-work}")
py=${PYTHON:-python3.12}
steps=${STEPS:-1 2 3 4}
te=2.18.0
torch_v=2.11.0
carry_limit=$((64 * 1024 * 1024))
whl=$here/.whl
mkdir -p "$whl" "$work"
exclude=$(git -C "$here" rev-parse --path-format=absolute --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
binary=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

has() { [[ " $steps " == *" $1 "* ]]; }

if has 1; then
  "$py" -m pip download -q --no-deps "${binary[@]}" -d "$whl" megatron-core==0.19.2 pydantic==2.14.4 \
    pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 \
    nvdlfw-inspect==0.2.2 "transformer-engine==$te"
fi

if has 2; then
  "$py" -m pip download -q --no-deps "${binary[@]}" -d "$work/core" "transformer-engine-cu13==$te"
  rm -rf "$work/core/tree"
  unzip -q "$work"/core/transformer_engine_cu13-"$te"-*.whl -d "$work/core/tree"
  "$py" "$here/benchmarks/gpu/te_carry.py" cut "$work/core/tree/transformer_engine/wheel_lib/libtransformer_engine.so" 90
  "$py" "$here/benchmarks/gpu/te_carry.py" repack "$work/core/tree" \
    "$whl/transformer_engine_cu13-$te-py3-none-manylinux_2_28_x86_64.whl"
fi

if has 3; then
  if [ ! -x "$work/build/bin/python" ]; then
    "$py" -m venv "$work/build"
    "$work/build/bin/pip" install -q "torch==$torch_v" "setuptools<82" wheel packaging pybind11 ninja
    # the CUDA, cuDNN, NCCL and NVRTC headers torch 2.11.0 was built with, as pip packages
    "$work/build/bin/pip" install -q --no-deps nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 \
      nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cudnn-cu13==9.19.0.56 nvidia-nccl-cu13==2.28.9
  fi
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$work/src" "transformer-engine-torch==$te"
  NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_BUILD_USE_NVIDIA_WHEELS=1 NVTE_WITH_NCCL_EP=0 NVTE_FRAMEWORK=pytorch \
    MAX_JOBS=$(nproc) nice "$work/build/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$whl" \
    "$work/src/transformer_engine_torch-$te.tar.gz"
fi

if has 4; then
  # a stand-in driver library exporting the cu* symbols TE's two libraries import (objdump -T), each
  # returning an error: enough to load them, never to run a kernel
  syms="cuCtxGetCurrent cuFuncSetAttribute cuGetErrorName cuGetErrorString cuInit cuLaunchKernel cuLaunchKernelEx
    cuModuleGetFunction cuModuleLoadDataEx cuModuleUnload"
  mkdir -p "$work/fake_driver"
  for s in $syms; do echo "int $s(void) { return 100; }"; done >"$work/fake_driver/cuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/fake_driver/libcuda.so.1" "$work/fake_driver/cuda.c"
  rm -rf "$work/site"
  "$work/build/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$whl"/*.whl
  LD_LIBRARY_PATH="$work/fake_driver" PYTHONPATH="$work/site:$here" CUDA_VISIBLE_DEVICES="" \
    "$work/build/bin/python" - <<'EOF'
import importlib.metadata as md
import transformer_engine as te, transformer_engine.pytorch  # noqa: F401  the extension and the cut core load
from megatron.core.extensions.transformer_engine import HAVE_TE
from megatron.core.optimizer import Adam
from mimo_jobs.trainer.model.kernels import installed, kernels_for
versions = {d: md.version(d) for d in ("transformer-engine", "transformer-engine-cu13", "transformer-engine-torch")}
assert len(set(versions.values())) == 1, f"TE's distributions must be one version: {versions}"
assert HAVE_TE, "megatron-core does not see Transformer Engine"
print("te", te.__version__, versions, "| Adam", Adam.__module__, "|", kernels_for(True, installed()).describe())
EOF
  total=$(du -cb "$whl"/*.whl | tail -n 1 | cut -f1)
  echo "carry: $(find "$whl" -name "*.whl" | wc -l) wheels, $total bytes (limit $carry_limit with the working tree)"
  [ "$total" -lt "$carry_limit" ] || { echo "the wheels exceed the carry limit"; exit 1; }
fi
echo "prepare_te: steps $steps done; the device installs them with: bash benchmarks/gpu/te_smoke.sh"
