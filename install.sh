#!/usr/bin/env bash
# Creates ./.venv on Python >= 3.12 and installs this checkout into it (editable), with the given extras.
# The trainer's megatron-core 0.19 needs Python >= 3.12; the toolkit alone (no extras) runs on >= 3.10.
#   bash install.sh               toolkit + trainer (extra `train`)
#   bash install.sh train,dev     ... and the test tools (what tests/run.sh asks for)
# Which Python: $MIMO_JOBS_PYTHON if set, else the first of python3.12, python3.13, python3 that is >= 3.12,
# else a pyenv-installed 3.12 or 3.13 (`pyenv install 3.12` where none is; conda, uv and Debian's python3.12 work too).
# A .venv on an older Python is replaced.
set -euo pipefail
cd "$(dirname "$0")"
extras="${1:-train}"

new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; }

find_python() {
  local c
  if [[ -n "${MIMO_JOBS_PYTHON:-}" ]]; then  # named by the user: that one or a clear refusal, never another
    if command -v "$MIMO_JOBS_PYTHON" >/dev/null 2>&1 && new_enough "$MIMO_JOBS_PYTHON"; then
      command -v "$MIMO_JOBS_PYTHON"
      return
    fi
    local what="not found"
    if command -v "$MIMO_JOBS_PYTHON" >/dev/null 2>&1; then what="$("$MIMO_JOBS_PYTHON" -V 2>&1)"; fi
    echo "install.sh: MIMO_JOBS_PYTHON=$MIMO_JOBS_PYTHON is not a Python >= 3.12 ($what)" >&2
    return 1
  fi
  for c in python3.12 python3.13 python3; do
    if command -v "$c" >/dev/null 2>&1 && new_enough "$c"; then command -v "$c"; return; fi
  done
  # pyenv's interpreters by path (its shims name only the selected versions; `pyenv` may not be on PATH)
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if command -v pyenv >/dev/null 2>&1; then root="$(pyenv root)"; fi
  for c in "$root"/versions/3.12*/bin/python3.12 "$root"/versions/3.13*/bin/python3.13; do
    if [[ -x "$c" ]] && new_enough "$c"; then echo "$c"; return; fi
  done
  echo "install.sh: no Python >= 3.12 found (tried python3.12, python3.13, python3, pyenv's versions);" \
    "install one (pyenv install 3.12, conda, uv python install 3.12) or set MIMO_JOBS_PYTHON" >&2
  return 1
}

if [[ -x .venv/bin/python ]] && ! new_enough .venv/bin/python; then
  echo "== .venv is on $(.venv/bin/python -V 2>&1): replacing it"
  rm -rf .venv
fi
if [[ ! -x .venv/bin/python ]]; then
  py="$(find_python)" || exit 2
  echo "== python -m venv .venv ($("$py" -V 2>&1))"
  "$py" -m venv .venv
fi
echo "== pip install -e .[$extras] into .venv"
set +e
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 |
  grep -v "Running pip as the 'root'\|is ignored: it is neither a file nor a directory"
rc=${PIPESTATUS[0]}
set -e
if ((rc)); then echo "install.sh: pip install -e .[$extras] failed (exit $rc)" >&2; exit "$rc"; fi
