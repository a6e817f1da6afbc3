#!/bin/bash
# STAND-IN for `srun` + pyxis/enroot on one machine (neither can be installed here; see the closing notes in
# README). It takes the job step exactly as the rendered sbatch.sh hands it to srun and runs the command once
# per node of the (fake, one-machine) allocation inside a podman container of --container-image:
#   --container-image=IMG        podman image IMG (pyxis would import it with enroot)
#   --container-mounts=a:b[:o],c a:b[:o] and c:c as bind mounts
#   --container-workdir=DIR      the container's working directory
#   --no-container-mount-home    without it, $HOME is mounted like pyxis does
# and pyxis's environment rule: every exported variable of the step reaches the container, but values the
# image sets itself (PATH, ...) win. Other srun flags (node/task counts) describe the allocation: skipped.
set -euo pipefail

image="" mounts="" workdir="" mount_home=1
while (($#)); do
  case "$1" in
    --container-image=*) image="${1#*=}" ;;
    --container-mounts=*) mounts="${1#*=}" ;;
    --container-workdir=*) workdir="${1#*=}" ;;
    --no-container-mount-home) mount_home=0 ;;
    --container-*) echo "pyxis stand-in: unsupported flag $1" >&2; exit 2 ;;
    --*) ;;
    *) break ;;
  esac
  shift
done
if [[ -z "$image" || $# -eq 0 ]]; then
  echo "pyxis stand-in: needs --container-image=IMAGE and a command" >&2
  exit 2
fi

args=(--rm --network none --shm-size 1g)
if [[ -n "$mounts" ]]; then
  IFS=, read -r -a list <<< "$mounts"
  for m in "${list[@]}"; do
    [[ "$m" == *:* ]] || m="$m:$m"
    args+=(--volume "$m")
  done
fi
if [[ -n "$workdir" ]]; then args+=(--workdir "$workdir"); fi
if ((mount_home)); then args+=(--volume "$HOME:$HOME"); fi

image_env="$(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | cut -d= -f1)"
while IFS= read -r -d '' kv; do
  key="${kv%%=*}"
  case "$key" in PWD | OLDPWD | SHLVL | _ | HOSTNAME) continue ;; esac
  if grep -qxF -- "$key" <<< "$image_env"; then continue; fi
  args+=(--env "$kv")
done < <(env -0)

# One task per node, all at once (torchrun's rendezvous waits for every node).
pids=()
for ((n = 0; n < ${SLURM_JOB_NUM_NODES:-1}; n++)); do
  podman run "${args[@]}" --env "SLURM_NODEID=$n" --env "SLURM_PROCID=$n" --env SLURM_LOCALID=0 \
    "$image" "$@" &
  pids+=("$!")
done
rc=0
for p in "${pids[@]}"; do
  wait "$p" || rc=$?
done
exit "$rc"
