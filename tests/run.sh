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

# Debian packages the tests use (the SLURM cluster and container tests install their own daemons);
# kubernetes-client is kubectl, which the Kubernetes executor's tests drive against their fake API server.
need=()
for pkg_cmd in shellcheck:shellcheck chromium:chromium gcc:cc kubernetes-client:kubectl; do
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
# Two pytest workers: a trainer world's ranks leave a core idle about a third of the time (imports, one-process
# references, waits on files), which a second test file fills. Each file stays on one worker (loadfile), so a
# module fixture is built once; the test-run-wide fixtures (tests/conftest.py) share their runs across workers.
workers=(-n "${MIMO_JOBS_TEST_WORKERS:-2}" --dist loadfile)
# --durations: the slowest tests are listed at the end, so a test that belongs under `slow` is seen (the fast
# default must stay under 4 minutes on a 2-core machine). Everything (CI) lists every test's time and writes
# out/junit.xml and out/junit-waiting.xml: the suite's time is measured, not estimated.
if ((all)); then
  mkdir -p out
  # Two lanes at once: the tests that mostly wait on clocks and daemons (the SLURM cluster's time limits and
  # requeues, the image build) beside the CPU-bound rest; the waiting lane's report follows the other's.
  waiting="slurm or container"
  python3 -m pytest -q --durations=0 --junitxml=out/junit-waiting.xml -m "$waiting" "${args[@]}" \
    >out/waiting-lane.log 2>&1 &
  lane=$!
  set +e
  python3 -m pytest -q "${workers[@]}" --durations=0 --junitxml=out/junit.xml -m "not ($waiting)" "${args[@]}"
  rc=$?
  wait "$lane"
  rc_waiting=$?
  set -e
  echo "== the waiting lane (-m \"$waiting\")"
  cat out/waiting-lane.log
  # 5: a lane that selected no test (extra arguments can leave one empty); the other lane's code decides
  if ((rc == 5 && rc_waiting != 5)); then rc=0; fi
  if ((rc_waiting == 5 && rc != 5)); then rc_waiting=0; fi
  if ((rc != 0)); then exit "$rc"; fi
  exit "$rc_waiting"
else
  exec python3 -m pytest -q "${workers[@]}" --durations=25 -m "not slow" "${args[@]}"
fi
