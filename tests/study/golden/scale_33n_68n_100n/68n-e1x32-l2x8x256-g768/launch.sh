#!/bin/bash
# torchrun launch of ONE node for run 68n-e1x32-l2x8x256-g768 (4688177e3836) of study scale_33n_68n_100n.
# Rendered by mimo-jobs 0.1.0 from templates/launch.sh.j2; re-render instead of editing.
#   under srun (sbatch.sh): node rank = $SLURM_NODEID, master = $MASTER_ADDR:$MASTER_PORT from sbatch.sh
#                           (or the first host of the node list and a port from the job id)
#   alone (local executor): node rank 0 of 1 node, master 127.0.0.1:$MASTER_PORT (or a free port);
#                           MIMO_JOBS_LOCAL=1 forces this mode inside a SLURM allocation.
# Static rendezvous: global rank = node rank * 8 + local rank, so the encoder's ranks land
# on the first nodes exactly as planned.
# Values are single-quoted on purpose (literal, never expanded):
# shellcheck disable=SC2016
set -euo pipefail

RUN_DIR=/runs/scale_33n_68n_100n/68n-e1x32-l2x8x256-g768-4688177e3836
RUN_YAML=/runs/scale_33n_68n_100n/68n-e1x32-l2x8x256-g768-4688177e3836/run.yaml
PYTHON=python3
NNODES=68
NPROC_PER_NODE=8
export MIMO_JOBS_RUN_DIR="$RUN_DIR"

# cluster.env
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_DEBUG=WARN
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1

if [[ -n "${SLURM_JOB_ID:-}" && -n "${SLURM_NODEID:-}" && "${MIMO_JOBS_LOCAL:-}" != 1 ]]; then
  MODE=slurm
  NODE_RANK="$SLURM_NODEID"
  if [[ -n "${SLURM_JOB_NUM_NODES:-}" && "$SLURM_JOB_NUM_NODES" != "$NNODES" ]]; then
    echo "launch.sh: run 68n-e1x32-l2x8x256-g768 is planned for $NNODES node(s) but job $SLURM_JOB_ID has $SLURM_JOB_NUM_NODES" >&2
    exit 2
  fi
  if [[ -z "${MASTER_ADDR:-}" ]]; then
    hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"  # no `| head`: SIGPIPE + pipefail
    MASTER_ADDR="${hosts%%$'\n'*}"
  fi
  MASTER_PORT="${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 20000 ))}"
  MIMO_JOBS_JOB_ID="$SLURM_JOB_ID"
  MIMO_JOBS_ATTEMPT="${SLURM_RESTART_COUNT:-${MIMO_JOBS_ATTEMPT:-0}}"
else
  if [[ "$NNODES" != 1 ]]; then
    echo "launch.sh: run 68n-e1x32-l2x8x256-g768 needs $NNODES nodes; submit it to SLURM (sbatch.sh) instead of running it alone" >&2
    exit 2
  fi
  MODE=local
  NODE_RANK=0
  MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
  if [[ -z "${MASTER_PORT:-}" ]]; then
    # a free port below the kernel's ephemeral range (mimo_jobs/contract/ports.py says why)
    MASTER_PORT="$("$PYTHON" -c 'def free_port() -> int:
    import random
    import socket

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = list(range(10000, min(20000, low)))
    random.shuffle(ports)
    for port in [*ports[:200], 0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free port on 127.0.0.1")


print(free_port())
')"
  fi
  MIMO_JOBS_JOB_ID="${MIMO_JOBS_JOB_ID:-local}"
  MIMO_JOBS_ATTEMPT="${MIMO_JOBS_ATTEMPT:-0}"
fi
export MASTER_ADDR MASTER_PORT MIMO_JOBS_JOB_ID MIMO_JOBS_ATTEMPT

LOG_DIR="$RUN_DIR/logs/job-$MIMO_JOBS_JOB_ID/node-$NODE_RANK"
mkdir -p "$LOG_DIR"
echo "mimo-jobs: run 68n-e1x32-l2x8x256-g768 job $MIMO_JOBS_JOB_ID attempt $MIMO_JOBS_ATTEMPT node $NODE_RANK/$NNODES on ${SLURMD_NODENAME:-$(hostname)}, $NPROC_PER_NODE ranks, master $MASTER_ADDR:$MASTER_PORT"

# Requeue contract (mimo_jobs/trainer/signals.py): a trainer stopped by a signal or its deadline saves a
# checkpoint, rank 0 writes this marker and every rank exits 75; torchrun turns that into exit 1.
REQUEUE_MARKER=/runs/scale_33n_68n_100n/68n-e1x32-l2x8x256-g768-4688177e3836/checkpoints/requeue.json
if [[ "$MODE" == local ]]; then
  rm -f "$REQUEUE_MARKER"  # left by an attempt killed before it was handled (sbatch.sh does this on SLURM)
fi

# The warning signals (cluster.signal) reach every process of the SLURM step; torchrun would die of them,
# so it ignores them (inherited by its workers) and the trainer installs its own handler to checkpoint.
trap '' USR1 USR2
# SIGTERM (time limit, preemption): torchrun forwards it to the trainer, which may still save and write the
# marker; this shell waits for torchrun instead of dying first, so the marker is still read below.
trap 'echo "launch.sh: SIGTERM: waiting for torchrun to stop" >&2' TERM
rc=0
"$PYTHON" -m torch.distributed.run \
  --nnodes "$NNODES" \
  --nproc-per-node "$NPROC_PER_NODE" \
  --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" \
  --master-port "$MASTER_PORT" \
  --log-dir "$LOG_DIR" \
  --redirects 3 \
  --tee 3 \
  -m mimo_jobs.trainer "$RUN_YAML" || rc=$?

if [[ -f "$REQUEUE_MARKER" ]]; then
  echo "launch.sh: the trainer saved a checkpoint and asks for a requeue: $(cat "$REQUEUE_MARKER")"
  if [[ "$MODE" == local ]]; then
    rm -f "$REQUEUE_MARKER"  # under SLURM sbatch.sh removes it once every node has ended
  fi
  exit 75
fi
exit "$rc"
