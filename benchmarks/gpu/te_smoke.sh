#!/usr/bin/env bash
# One H200, under 10 minutes: Transformer Engine's path on one rank, then several ranks sharing the one GPU
# over NCCL (two encoder modules with a bridge each into LLM PP 2; a gated MoE at TP 2 / EP 2 / ETP 2), then
# dense-1b on TE with megatron-core's torch.compile'd fusions on and off (the configuration production runs).
# Usage, from the repository root with the wheels benchmarks/gpu/prepare_te.sh writes under .whl/ (carried
# with the run):  bash benchmarks/gpu/te_smoke.sh WORK
# WORK holds the scratch (studies, logs, exported weights); runs/ is written at the repository root. Every step
# has its own time limit and a failed step does not stop the next; the summary says which passed.
set -u
out=$(realpath -m "${1:-te-smoke}")
mkdir -p "$out/studies"
here=$(pwd)
# the smoke steps run eager (torch.compile's cold start is not what they test); dense-1b runs both ways
export TORCHDYNAMO_DISABLE=1 PYTHONUNBUFFERED=1
mj() { python3 -m mimo_jobs.cli.app "$@"; }
export -f mj
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

# 0. the carried wheels (no index) beside the image's torch 2.11; mimo-jobs from this tree
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="$here/.site:$here"

# 1. what the node offers; TE's own kernels from the sm_90-only core library
step node 60 python3 - <<'EOF'
import torch, megatron.core as mc, transformer_engine as te, transformer_engine.pytorch as tep
from megatron.core.extensions.transformer_engine import HAVE_TE
from megatron.core.optimizer import Adam
from mimo_jobs.trainer.model.kernels import installed, kernels_for
print("torch", torch.__version__, torch.cuda.get_device_name(0), "nccl", torch.cuda.nccl.version(),
      "cudnn", torch.backends.cudnn.version(), "| te", te.__version__, "HAVE_TE", HAVE_TE, "| mcore", mc.__version__,
      "| Adam", Adam.__module__)
print(kernels_for(True, installed()).describe())
x = torch.randn(256, 2, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
qkv = tep.LayerNormLinear(512, 3 * 512, params_dtype=torch.bfloat16, normalization="RMSNorm")(x)
q, k, v = (t.contiguous() for t in qkv.view(256, 2, 3, 8, 64).unbind(2))
o = tep.DotProductAttention(8, 64, attn_mask_type="causal", qkv_format="sbhd")(q, k, v)
y = tep.GroupedLinear(4, 512, 1024, params_dtype=torch.bfloat16)(o.reshape(-1, 512), [128, 128, 128, 128])
y.float().square().mean().backward()
lin = tep.Linear(256, 256)
lin(torch.randn(64, 256, device="cuda")).square().mean().backward()
opt = tep.optimizers.FusedAdam(lin.parameters(), lr=1e-3)
opt.step()
print("TE kernels ok (LayerNormLinear, DotProductAttention, GroupedLinear, FusedAdam); grad finite:",
      bool(torch.isfinite(x.grad).all()), "| FusedAdam's step in its param group:", opt.param_groups[0].get("step"))
EOF

# 2. one rank under TE: the packaged smoke study, rendered and launched without the store
rm -rf runs/gpu_smoke_tiny runs/gpu_smoke_continue runs/gpu_smoke_resume runs/cpu_local
step tiny 120 bash -c 'mj render benchmarks/gpu/smoke_tiny.yaml -o runs >/dev/null && bash runs/gpu_smoke_tiny/*/launch.sh'
tiny=$(run_dir gpu_smoke_tiny 1n-colo-l1x1x1-g8-m2)
[ -n "$tiny" ] && ln -sfn "$(basename "$tiny")" runs/gpu_smoke_tiny/source

# 3. several ranks on ONE GPU (one_gpu_rank.sh): each its own NCCL host (NCCL 2.28 refuses two ranks of one host
# on one device),
# socket transport on loopback, the LL protocol off and 64 KiB buffers, so that a message above 64 KiB needs its
# receive posted (close to the ordering tests' rendezvous model)
cat > "$out/studies/gpu_te_omni.yaml" <<'EOF'
name: gpu_te_omni
description: vision + audio on ranks of their own into LLM PP 2, bf16, one GPU shared by 4 ranks
cluster: {executor: local, accelerator: gpu, gpus_per_node: 4, time_limit: "00:05:00", exclusive: false, requeue: false, max_retries: 0, hardware: {gpu: H200}}
trainer:
  model:
    name: te-omni
    encoders:
      vision: {preset: tiny, image_size: 64}
      audio: {preset: tiny-audio, max_source_positions: 512}
    llm: {preset: tiny-swiglu, hidden_size: 512, num_attention_heads: 8, ffn_hidden_size: 1024}
  seq_length: 1024
  train_iters: 3
  log_interval: 1
  seed: 1234
  precision: bf16
  timeout_s: 120
  data: {text_only_fraction: 0.25, image_sizes: [32, 64], audio_fraction: 0.5, audio_frames: [256, 1024]}
matrix:
  points:
    - {nodes: 1, gbs: 4, mbs: 1, encoders: {vision: {tp: 1, dp: 1}, audio: {tp: 1, dp: 1}}, llm: {pp: 2}}
EOF
cat > "$out/studies/gpu_te_moe_etp2.yaml" <<'EOF'
name: gpu_te_moe_etp2
description: gated tiny MoE at TP 2 EP 2 ETP 2 in fp32 on one GPU shared by 4 ranks
cluster: {executor: local, accelerator: gpu, gpus_per_node: 4, time_limit: "00:05:00", exclusive: false, requeue: false, max_retries: 0, hardware: {gpu: H200}}
trainer:
  model: tiny-moe-shared
  seq_length: 64
  train_iters: 3
  log_interval: 1
  seed: 1234
  precision: fp32
  timeout_s: 120
  data: {image_sizes: [8, 16]}
matrix:
  points:
    - {nodes: 1, gbs: 8, mbs: 2, colocated: true, llm: {tp: 2, ep: 2, etp: 2}}
EOF
cat > "$out/shared.sh" <<'EOF'
# shared.sh STUDY PORT WORK: render; 4 ranks on GPU 0 under torchrun; the one-process reference; losses side by side
s=$1 port=$2 out=$3
rm -rf "runs/$s"
python3 -m mimo_jobs.cli.app render "$out/studies/$s.yaml" -o runs >/dev/null || exit 2
d=$(find "runs/$s" -maxdepth 1 -mindepth 1 -type d | head -n 1)
MIMO_JOBS_RUN_DIR="$PWD/$d" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_P2P_LL_THRESHOLD=0 NCCL_BUFFSIZE=65536 \
  python3 -m torch.distributed.run --nnodes 1 --nproc-per-node 4 --master-addr 127.0.0.1 --master-port "$port" \
  --no-python bash benchmarks/gpu/one_gpu_rank.sh "$d/run.yaml" > "$out/$s.log" 2>&1
rc=$?
grep -E "mimo-jobs trainer: run|iteration|finished|failed|rror|Duplicate" "$out/$s.log" | cut -c1-300 | head -40
python3 -m mimo_jobs.trainer "$d/run.yaml" --reference 2>&1 | grep -E "iteration|finished|failed|rror" | cut -c1-200
python3 - "$d" <<'PY'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
def it(p):
    return {r["iteration"]: r for r in map(json.loads, p.read_text().splitlines()) if r.get("kind") == "iteration"}
h, r = it(d / "metrics.jsonl"), it(d / "metrics.reference.jsonl")
for i in sorted(h):
    print(f"iteration {i}: loss {h[i]['loss']:.6f} ref {r[i]['loss']:.6f} rel {abs(h[i]['loss'] / r[i]['loss'] - 1):.2e}"
          f" | grad norm {h[i]['grad_norm']:.5f} ref {r[i]['grad_norm']:.5f}")
PY
exit $rc
EOF
step omni-4-ranks 150 bash "$out/shared.sh" gpu_te_omni 29541 "$out"
step moe-etp2-4-ranks 120 bash "$out/shared.sh" gpu_te_moe_etp2 29542 "$out"

# 4. the TE checkpoint: manifest, export to HF, a resharded continuation (mbs 1), and the same layout continued on
# the local layers (TE hidden): the name rule across backends and FusedAdam's group step both ways
step manifest 10 bash -c "grep -h -o '\"layers\": *\"[a-z]*\"' $tiny/checkpoints/iter_*/manifest.json | sort | uniq -c"
step export 60 python3 -m mimo_jobs.cli.app export "$tiny/checkpoints" "$out/exported" --to hf
step continue 100 bash -c 'mj render benchmarks/gpu/smoke_continue.yaml -o runs >/dev/null && bash runs/gpu_smoke_continue/*/launch.sh'
mkdir -p "$out/noTE/transformer_engine"
# megatron-core 0.19.2 catches ModuleNotFoundError, not ImportError, in places (tensor_parallel/random.py)
echo 'raise ModuleNotFoundError("Transformer Engine hidden for the backend switch", name="transformer_engine")' \
  > "$out/noTE/transformer_engine/__init__.py"
step resume-local 100 env PYTHONPATH="$out/noTE:$here/.site:$here" bash -c \
  'mj render benchmarks/gpu/smoke_resume.yaml -o runs >/dev/null && bash runs/gpu_smoke_resume/*/launch.sh'
step losses 20 python3 benchmarks/gpu/losses.py "$tiny" "$(run_dir gpu_smoke_resume 1n-colo-l1x1x1-g8-m2)" \
  "$(run_dir gpu_smoke_continue 1n-colo-l1x1x1-g8)"

# 5. a CPU study on this node now that TE is installed
step cpu-study-with-te 45 bash -c 'mj render studies/cpu_local.yaml -o runs >/dev/null &&
  python3 -m mimo_jobs.trainer "$(find runs/cpu_local -mindepth 1 -maxdepth 1 -type d | head -n 1)/run.yaml" \
  --reference --iters 1 2>&1 | grep -E "trainer: run|iteration|failed|fused_adam" | cut -c1-220'

# 6. dense-1b on TE, compiled fusions (as launch.sh runs it) and eager: step time, MFU, memory against predict
dense=runs/gpu_one_gpu_presets  # dense_1b.yaml's study
launch_all='mj render benchmarks/gpu/dense_1b.yaml -o runs >/dev/null && for l in runs/gpu_one_gpu_presets/*/launch.sh; do bash "$l"; done'
rm -rf "$dense" "$out/dense_1b_compiled"
step dense-1b-compiled 150 env -u TORCHDYNAMO_DISABLE bash -c "$launch_all"
mv "$dense" "$out/dense_1b_compiled" 2>/dev/null
step dense-1b-eager 150 bash -c "$launch_all"
step dense-1b-predict 30 bash -c 'mj predict benchmarks/gpu/dense_1b.yaml'
step dense-1b-times 10 bash -c "grep -h -E 'iteration|peak' $out/dense_1b_compiled/*/logs/* $dense/*/logs/* | tail -n 12"

# 7. the operator tables (GEMM and attention by shape; copy into benchmarks/measured/ when they come back)
step ops 180 python3 benchmarks/gpu/ops.py --budget-s 150 --out "$out/ops_h200.yaml"

tar czf "$out/runs.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.distcp' runs 2>/dev/null
echo "=== summary"
printf '%s\n' "${summary[@]}"
