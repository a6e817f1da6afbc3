#!/usr/bin/env bash
# The one-GPU smoke run of docs/gpu-checklist.md in one go: what the node offers, the CPU guards with a GPU
# visible, the tiny model in bf16 under torchrun (NCCL world of one, distributed optimizer, checkpoints),
# export to HuggingFace, a same-layout resume and a resharded continuation, a one-process reference, and the dense-1b and 4-layer
# MoE presets with their report (tokens/s, MFU, peak memory) beside `mimo-jobs predict`. First it measures the
# GEMM and attention tables (benchmarks/gpu/ops.py, OUT/ops.yaml); last it prices its own runs with
# `cluster.hardware.ops: OUT/ops.yaml` and prints predicted against measured per run (benchmarks/gpu/ops_check.py).
# Usage (repository root, the project importable, `mimo-jobs` on PATH): bash benchmarks/gpu/smoke.sh OUT
# Every step runs under its own time limit and a failed step does not stop the next; the summary at the end
# says which passed. Studies: $SMOKE_STUDIES (default benchmarks/gpu).
set -u
out=$(realpath -m "${1:-gpu-smoke}")
studies=${SMOKE_STUDIES:-benchmarks/gpu}
mkdir -p "$out"
export TORCHDYNAMO_DISABLE=1 PYTHONUNBUFFERED=1 MIMO_JOBS_DB="$out/store.duckdb"
declare -a summary=()
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "=== $name ($(date +%T), limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  summary+=("$name: rc=$rc in $((SECONDS - t0))s")
  echo "=== $name: rc=$rc in $((SECONDS - t0))s"
}
run_dir() { find "runs/$1" -maxdepth 1 -mindepth 1 -type d -name "$2-*" | head -n 1; }

step node 60 bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1;
  python3 -c "import torch, megatron.core as mc; print(\"torch\", torch.__version__, \"cuda\", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"\", \"megatron-core\", mc.__version__)";
  python3 -c "from mimo_jobs.trainer.model.kernels import installed, kernels_for; h = installed(); print(h); print(kernels_for(True, h).describe())"'
step ops 200 python3 benchmarks/gpu/ops.py --out "$out/ops.yaml"
step guards 240 python3 -m pytest -q -x -p no:cacheprovider tests/trainer/test_gpu_readiness.py tests/trainer/test_phase_timing.py
step tiny 180 mimo-jobs submit "$studies/smoke_tiny.yaml" --executor local --wait
tiny=$(run_dir gpu_smoke_tiny 1n-colo-l1x1x1-g8-m2)
# smoke_continue.yaml names the checkpoint through this link (a run directory's name ends in its id)
[ -n "$tiny" ] && ln -sfn "$(basename "$tiny")" runs/gpu_smoke_tiny/source
step tiny-manifest 20 bash -c "ls $tiny/checkpoints; find $tiny/checkpoints -name manifest.json | head -n 1 | xargs head -c 1500; echo; find $tiny/logs -type f -exec tail -n 12 {} +"
step export 90 mimo-jobs export "$tiny/checkpoints" "$out/exported" --to hf
step continue 180 mimo-jobs submit "$studies/smoke_continue.yaml" --executor local --wait
step resume 180 mimo-jobs submit "$studies/smoke_resume.yaml" --executor local --wait
step losses 30 python3 benchmarks/gpu/losses.py "$tiny" "$(run_dir gpu_smoke_resume 1n-colo-l1x1x1-g8-m2)" \
  "$(run_dir gpu_smoke_continue 1n-colo-l1x1x1-g8)"
step reference 120 python3 -m mimo_jobs.trainer "$tiny/run.yaml" --reference --iters 3
step dense-1b 240 mimo-jobs submit "$studies/dense_1b.yaml" --executor local --wait
step moe-4l 240 mimo-jobs submit "$studies/moe_4l.yaml" --executor local --wait
for s in gpu_smoke_tiny gpu_smoke_continue gpu_smoke_resume gpu_one_gpu_presets gpu_one_gpu_moe; do
  step "report-$s" 90 mimo-jobs report "$s"
done
for s in dense_1b moe_4l; do
  step "predict-$s" 60 mimo-jobs predict "$studies/$s.yaml"
done
if [ -s "$out/ops.yaml" ]; then
  step ops-check 120 python3 benchmarks/gpu/ops_check.py "$out/ops.yaml" "$studies/smoke_tiny.yaml" \
    "$studies/smoke_resume.yaml" "$studies/smoke_continue.yaml" "$studies/dense_1b.yaml" "$studies/moe_4l.yaml"
fi
step logs 30 bash -c "tar czf '$out/runs.tgz' --exclude='*.pt' --exclude='*.distcp' --exclude='*.safetensors' --exclude='*.npy' runs"
echo "=== summary"
printf '%s\n' "${summary[@]}"
