#!/usr/bin/env bash
# The README's test command. Installs everything the tests need (Debian + Python packages), then runs
# pytest. Locally the fast default skips tests marked slow; CI=true (or --all) runs everything.
#   bash tests/run.sh            fast default
#   bash tests/run.sh --all      everything (what CI runs)
#   bash tests/run.sh -k topo    extra args go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

all=0
if [[ "${CI:-}" == "true" ]]; then all=1; fi
args=()
for a in "$@"; do
  if [[ "$a" == "--all" ]]; then all=1; else args+=("$a"); fi
done

# Debian packages the tests use (the SLURM cluster and container tests install their own daemons).
need=()
for pkg_cmd in shellcheck:shellcheck chromium:chromium gcc:cc; do
  command -v "${pkg_cmd#*:}" >/dev/null 2>&1 || need+=("${pkg_cmd%%:*}")
done
if ((${#need[@]})); then
  echo "== apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# .venv on Python >= 3.12 (install.sh finds one), first on PATH: every `python3` the tests start (torchrun,
# launch.sh, SLURM jobs) is that environment
bash install.sh train,dev
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"

echo "== ruff format --check, ruff check"
python3 -m ruff format --check . || { echo "ruff format would change the files above: run 'ruff format'"; exit 1; }
python3 -m ruff check --quiet .

# ingest's compiled scanner is optional for users (no compiler: a slower pure-Python path), not here
export MIMO_JOBS_REQUIRE_EXT=1
python3 -c "import mimo_jobs.ingest._logscan" || { echo "mimo_jobs.ingest._logscan was not built (see pip's output)"; exit 1; }
export TORCHDYNAMO_DISABLE=1  # torch.compile paths in megatron-core are slow and flaky on CPU CI
# --durations: the slowest tests are listed at the end, so a test that belongs under `slow` is seen (the fast
# default must stay under 5 minutes on a 2-core machine). Everything (CI) lists every test's time and writes
# out/junit.xml: the suite's time is measured, not estimated.
if ((all)); then
  mkdir -p out
  exec python3 -m pytest -q --durations=0 --junitxml=out/junit.xml "${args[@]}"
else
  exec python3 -m pytest -q --durations=25 -m "not slow" "${args[@]}"
fi
