#!/bin/bash
# SLURM batch script for run 2n-colo-l2x1x8-g256-m2 (9818d1957a6f) of study megatron_gpt_mock.
# Rendered by mimo-jobs 0.1.0 from templates/sbatch.sh.j2; re-render instead of editing.
#SBATCH --job-name=megatron_gpt_mock.2n-colo-l2x1x8-g256-m2
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=00:30:00
#SBATCH --partition=batch
#SBATCH --exclusive
#SBATCH --output=/runs/megatron_gpt_mock/2n-colo-l2x1x8-g256-m2-9818d1957a6f/logs/slurm-%j.out
#SBATCH --error=/runs/megatron_gpt_mock/2n-colo-l2x1x8-g256-m2-9818d1957a6f/logs/slurm-%j.out
#SBATCH --signal=TERM@120
#SBATCH --requeue
# Values are single-quoted on purpose (literal, never expanded):
# shellcheck disable=SC2016
set -euo pipefail

RUN_DIR=/runs/megatron_gpt_mock/2n-colo-l2x1x8-g256-m2-9818d1957a6f
LAUNCH=/runs/megatron_gpt_mock/2n-colo-l2x1x8-g256-m2-9818d1957a6f/launch.sh
export MIMO_JOBS_RUN_DIR="$RUN_DIR"

# Static torchrun rendezvous: node 0 of the allocation hosts the store; the port comes from the job id so
# jobs sharing a host (and requeued attempts of other jobs) do not collide.
# (no `| head -n 1`: with pipefail, scontrol's SIGPIPE on a long node list would fail the job)
hosts="$(scontrol show hostnames "$SLURM_JOB_NODELIST")"
MASTER_ADDR="${hosts%%$'\n'*}"
MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
export MASTER_ADDR MASTER_PORT
export MIMO_JOBS_JOB_ID="$SLURM_JOB_ID"
export MIMO_JOBS_ATTEMPT="${SLURM_RESTART_COUNT:-0}"
# The trainer stops, saves and asks for a requeue before the time limit even if no warning signal arrives.
MIMO_JOB_DEADLINE=$(( $(date +%s) + 1800 ))
export MIMO_JOB_DEADLINE
REQUEUE_MARKER=/runs/megatron_gpt_mock/2n-colo-l2x1x8-g256-m2-9818d1957a6f/checkpoints/requeue.json
rm -f "$REQUEUE_MARKER"  # left by an attempt killed before it was handled

# cluster.env
export CUDA_DEVICE_MAX_CONNECTIONS=1

# cluster.setup (runs once, here on the batch host; launch.sh skips it when MIMO_JOBS_SETUP_DONE=1)
set +u  # module/venv scripts often read unset variables
cd "$HOME/Megatron-LM"
set -u
export MIMO_JOBS_SETUP_DONE=1

echo "mimo-jobs: job ${SLURM_JOB_ID} attempt ${MIMO_JOBS_ATTEMPT} run 2n-colo-l2x1x8-g256-m2 on ${SLURM_JOB_NUM_NODES} node(s), master ${MASTER_ADDR}:${MASTER_PORT}"

# One task per node; each runs launch.sh, which starts torchrun with --node-rank=$SLURM_NODEID.
srun_cmd=(
  srun
  --nodes=2
  --ntasks=2
  --ntasks-per-node=1
  --kill-on-bad-exit=1
  bash "$LAUNCH"
)

# srun runs in the background so a batch-shell signal (--signal=B:...) can be forwarded to the tasks;
# without B: SLURM signals the step's processes directly and this trap never fires.
# (the trap is set first: a signal arriving while srun starts must not kill this shell)
srun_pid=
trap 'if [[ -n "$srun_pid" ]]; then kill -s TERM "$srun_pid" 2>/dev/null || true; fi' TERM
"${srun_cmd[@]}" &
srun_pid=$!
# wait returns early (status > 128) when a trapped signal arrives: keep waiting while srun lives, then
# wait once more for its real exit status (bash keeps it).
while kill -0 "$srun_pid" 2>/dev/null; do
  wait "$srun_pid" || true
done
rc=0
wait "$srun_pid" || rc=$?
echo "mimo-jobs: srun exited with status ${rc}"
# Requeue contract (mimo_jobs/trainer/signals.py): the checkpoint is complete once the marker exists. Handled
# here, once per job, after every node's launch.sh has ended.
if [[ -f "$REQUEUE_MARKER" ]]; then
  echo "mimo-jobs: the trainer saved a checkpoint and asks for a requeue: $(cat "$REQUEUE_MARKER")"
  rm -f "$REQUEUE_MARKER"
  # Same job id, SLURM_RESTART_COUNT + 1; the next attempt resumes from the checkpoint.
  scontrol requeue "$SLURM_JOB_ID" || echo "mimo-jobs: scontrol requeue failed; exit 75 lets mimo-jobs resubmit"
  exit 75
fi
exit "$rc"
