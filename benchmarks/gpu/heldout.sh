#!/usr/bin/env bash
# Runs the studies held out from the local-layer fit (heldout_*.yaml) on one GPU and prints, for each, the
# report's predicted-against-measured time and memory. Usage as smoke.sh: bash benchmarks/gpu/heldout.sh OUT
set -u
out=$(realpath -m "${1:-gpu-heldout}")
mkdir -p "$out"
export TORCHDYNAMO_DISABLE=1 PYTHONUNBUFFERED=1 MIMO_JOBS_DB="$out/store.duckdb"
for s in heldout_dense_s1024 heldout_dense_s4096 heldout_moe_s1024; do
  echo "=== $s ($(date +%T))"
  timeout --kill-after=10 200 mimo-jobs submit "benchmarks/gpu/$s.yaml" --executor local --wait
  echo "=== $s: rc=$?"
done
for s in gpu_heldout_dense_s1024 gpu_heldout_dense_s4096 gpu_heldout_moe_s1024; do
  timeout 60 mimo-jobs report "$s" --format json > "$out/$s.json" 2>&1
  timeout 60 mimo-jobs report "$s" 2>&1 | grep -A 6 "Predicted vs measured"
done
tar czf "$out/runs.tgz" --exclude='*.pt' --exclude='*.distcp' runs/gpu_heldout_*
