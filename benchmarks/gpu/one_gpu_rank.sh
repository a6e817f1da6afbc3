#!/usr/bin/env bash
# One trainer rank of several sharing one GPU (torchrun --no-python bash one_gpu_rank.sh RUN_YAML): NCCL 2.28
# refuses two ranks of one host on one device ("Duplicate GPU detected"), and takes NCCL_HOSTID as the host's
# identity, so each rank names a host of its own; the trainer sets its device from LOCAL_RANK, so every rank
# says 0. For testing on one GPU only.
export NCCL_HOSTID="mimo-rank-$RANK" LOCAL_RANK=0
exec python3 -m mimo_jobs.trainer "$@"
