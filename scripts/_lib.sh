# Shared set-up for scripts/*: find a Python 3.12+ and keep .venv in step with pyproject.toml.
# Sourced, not run. Defines ROOT, VENV and ensure_venv.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"

# A candidate counts only if it actually runs and is 3.12+: pyenv's shims sit on PATH as
# python3.12/python3.13 yet fail unless PYENV_VERSION selects them.
_python_ok() {
  "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local candidate
  if [[ -n "${WIRETAPE_PYTHON:-}" ]] && _python_ok "$WIRETAPE_PYTHON"; then
    echo "$WIRETAPE_PYTHON"; return 0
  fi
  for candidate in python3.14 python3.13 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && _python_ok "$candidate"; then
      command -v "$candidate"; return 0
    fi
  done
  local root="${PYENV_ROOT:-$HOME/.pyenv}"
  if [[ -d "$root/versions" ]]; then
    for candidate in $(ls -1 "$root/versions" | grep -E '^3\.[0-9]+\.[0-9]+$' | sort -t. -k1,1nr -k2,2nr -k3,3nr); do
      if _python_ok "$root/versions/$candidate/bin/python3"; then
        echo "$root/versions/$candidate/bin/python3"; return 0
      fi
    done
  fi
  return 1
}

# ensure_venv: create .venv on first use and reinstall when pyproject.toml changes. One
# environment serves the demo, the tests and the bench, so switching between them installs
# nothing.
ensure_venv() {
  local extras="test,bench" stamp want
  stamp="$VENV/.wiretape-installed"
  want="$(cat "$ROOT/pyproject.toml" | cksum | cut -d' ' -f1)-$extras"
  if [[ -x "$VENV/bin/python" ]] && ! _python_ok "$VENV/bin/python"; then
    rm -rf "$VENV"
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    local python
    if ! python="$(find_python)"; then
      echo "wiretape needs Python 3.12 or newer (mitmproxy 12 requires it)." >&2
      echo "Install python3.12 or python3.13 (or set WIRETAPE_PYTHON=/path/to/python3.12+) and rerun." >&2
      exit 2
    fi
    echo "Creating $VENV with $python" >&2
    "$python" -m venv "$VENV"
  fi
  if [[ ! -f "$stamp" ]] || [[ "$(cat "$stamp")" != "$want" ]]; then
    echo "Installing wiretape[$extras] into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e "$ROOT[$extras]"
    echo "$want" >"$stamp"
  fi
}
