# Sourced by scripts/demo and scripts/test: make .venv with cachemgr installed (idempotent).
# CACHEMGR_EXTRAS=test adds the test extras.
set -euo pipefail
PROJECT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CACHEMGR_VENV:-$PROJECT/.venv}"
PY="${PYTHON:-python3}"
if [ -e "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
  echo "$VENV does not run here (copied from another user or machine?): recreating it" >&2
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "creating virtualenv $VENV" >&2
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(sha256sum "$PROJECT/pyproject.toml" | cut -c1-16)-${CACHEMGR_EXTRAS:-main}"
if [ ! -f "$stamp" ]; then
  echo "installing cachemgr${CACHEMGR_EXTRAS:+[$CACHEMGR_EXTRAS]} into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  if [ -n "${CACHEMGR_EXTRAS:-}" ]; then
    PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -e "$PROJECT[$CACHEMGR_EXTRAS]"
  else
    PYTHONWARNINGS=ignore "$VENV/bin/python" -m pip install -q -e "$PROJECT"
  fi
  touch "$stamp"
fi
export PATH="$VENV/bin:$PATH"
