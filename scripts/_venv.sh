# Sourced by scripts/demo and scripts/test: make .venv with cachemgr installed (idempotent).
# CACHEMGR_EXTRAS=test adds the test extras; CACHEMGR_VENV names another virtualenv folder.
# Runs at the same time (scripts/test and scripts/demo) take turns to create and install,
# under an flock on "$VENV.lock"; a virtualenv already installed takes no lock.
set -euo pipefail
PROJECT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CACHEMGR_VENV:-$PROJECT/.venv}"
VENV="${VENV%/}"
PY="${PYTHON:-python3}"
stamp_base="$VENV/.installed-$(sha256sum "$PROJECT/pyproject.toml" | cut -c1-16)"
stamp="$stamp_base-${CACHEMGR_EXTRAS:-main}"

# Installed for these extras (or for the test extras, a superset of the package alone: a
# scripts/demo run beside scripts/test must not reinstall cachemgr under the running tests),
# and its python runs here.
_cachemgr_venv_ready() {
  { [ -f "$stamp" ] || { [ -z "${CACHEMGR_EXTRAS:-}" ] && [ -f "$stamp_base-test" ]; }; } &&
    "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1
}

_cachemgr_venv_install() {  # create (or recreate) and install; the caller holds the lock
  if [ -e "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "$VENV does not run here (copied from another user or machine?): recreating it" >&2
    rm -rf "$VENV"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtualenv $VENV" >&2
    "$PY" -m venv "$VENV"
  fi
  if ! _cachemgr_venv_ready; then
    echo "installing cachemgr${CACHEMGR_EXTRAS:+[$CACHEMGR_EXTRAS]} into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    if [ -n "${CACHEMGR_EXTRAS:-}" ]; then
      PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -e "$PROJECT[$CACHEMGR_EXTRAS]"
    else
      PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -e "$PROJECT"
    fi
    touch "$stamp"
  fi
}

if ! _cachemgr_venv_ready; then
  if command -v flock >/dev/null 2>&1; then
    exec {_cachemgr_lock_fd}<>"$VENV.lock"  # <>: never truncates, never blocks on a FIFO
    if ! flock -n "$_cachemgr_lock_fd"; then
      echo "waiting for another run installing into $VENV (lock $VENV.lock)" >&2
      flock -w "${CACHEMGR_VENV_LOCK_WAIT_S:-900}" "$_cachemgr_lock_fd" || {
        echo "gave up after ${CACHEMGR_VENV_LOCK_WAIT_S:-900} s waiting for $VENV.lock" >&2
        exit 1
      }
    fi
    if ! _cachemgr_venv_ready; then  # the other run may have installed it meanwhile
      _cachemgr_venv_install
    fi
    exec {_cachemgr_lock_fd}>&-  # closing it releases the lock
    unset _cachemgr_lock_fd
  else
    echo "flock (util-linux) not found: installing into $VENV without a lock" >&2
    _cachemgr_venv_install
  fi
fi
unset -f _cachemgr_venv_ready _cachemgr_venv_install
unset stamp stamp_base
export PATH="$VENV/bin:$PATH"
