#!/usr/bin/env bash
# Build the project's Dockerfile daemonless (Debian's podman + runc) on a locally bootstrapped Debian+Python
# base: registries (nvcr.io, Docker Hub) are unreachable here, so BASE_IMAGE is swapped for that base.
#
#   bash tests/container/build_image.sh            # prints the image name on its last line
#
# Environment:
#   MIMO_IMAGE            image to build (default localhost/mimo-jobs:ci)
#   MIMO_CONTAINER_CACHE  cache dir for the base tar (default ~/.cache/mimo-jobs-container)
#   MIMO_JOBS_GIT_SHA     commit recorded in the image (default: the checkout's HEAD, "-dirty" if modified)
#   CONTAINERS_CONF       podman settings; default: this dir's containers.conf (runc, cgroupfs, ulimits)
# Installs its Debian packages when missing.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
image="${MIMO_IMAGE:-localhost/mimo-jobs:ci}"
cache="${MIMO_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mimo-jobs-container}"
suite=trixie  # Python 3.13: megatron-core 0.19 needs >= 3.12 (bookworm has 3.11)
base="localhost/mimo-jobs-ci-base:${suite}-py3"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
mkdir -p "$cache"

say() { printf '== [%3ds] %s\n' "$((SECONDS - t0))" "$*" >&2; }
t0=$SECONDS

# 1. Tools (Debian packages). crun is not used: it refuses this host kind's hybrid cgroup layout.
need=()
for pc in podman:podman runc:runc conmon:conmon mmdebstrap:mmdebstrap fuse-overlayfs:fuse-overlayfs \
          netavark:/usr/lib/podman/netavark aardvark-dns:/usr/lib/podman/aardvark-dns iptables:iptables \
          uidmap:newuidmap containernetworking-plugins:/usr/lib/cni/bridge; do
  pkg="${pc%%:*}" cmd="${pc#*:}"
  if [[ "$cmd" == /* ]]; then [[ -e "$cmd" ]] || need+=("$pkg"); else command -v "$cmd" >/dev/null || need+=("$pkg"); fi
done
if ((${#need[@]})); then
  say "apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. The stand-in base: Debian minbase + python3 + pip + CA certificates (no compilers), as a cached tar.
#    Docs/man/locales are left out: nothing in the image reads them.
base_tar="$cache/base-${suite}-py3.tar"
if [[ ! -s "$base_tar" ]]; then
  say "mmdebstrap $suite -> $base_tar"
  mmdebstrap --quiet --format=tar --variant=minbase \
    --include=python3,python3-pip,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$base_tar.part"
  mv "$base_tar.part" "$base_tar"
fi
if ! podman image exists "$base"; then
  say "podman import $base"
  podman import --quiet "$base_tar" "$base" >/dev/null
fi

# 3. torch for a base without it comes from the registry inside the build, in train's range (on PyPI the
#    CUDA build, which runs on the CPU); pip's cache is the Dockerfile's build-time cache mount.

# 4. The build. The host's CA bundle is bind-mounted for pip's HTTPS (not baked into the image).
sha="${MIMO_JOBS_GIT_SHA:-}"
if [[ -z "$sha" ]]; then
  sha="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then sha="$sha-dirty"; fi
fi
ca=/etc/ssl/certs/ca-certificates.crt
say "podman build $image (BASE_IMAGE=$base, git $sha)"
podman build --quiet --format docker \
  --build-arg "BASE_IMAGE=$base" \
  --build-arg "MIMO_JOBS_GIT_SHA=$sha" \
  --build-arg "IMAGE_NAME=$image" \
  --volume "$ca:$ca:ro" \
  --tag "$image" --file "$repo/Dockerfile" "$repo" >/dev/null
say "built $image"
echo "$image"
