# Sourced by the other scripts: find Python interpreters, start PostgreSQL, create virtualenvs.
# Idempotent: a second run reuses what the first one made.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PGHOST="${PGHOST:-127.0.0.1}" PGPORT="${PGPORT:-5432}" PGUSER="${PGUSER:-postgres}"

# find_python MAJOR.MINOR... : print the first interpreter found for the given versions.
find_python() {
  local v cand
  for v in "$@"; do
    for cand in "python$v" "$HOME/.pyenv/versions/$v"*/bin/python "/usr/local/bin/python$v" "/usr/bin/python$v"; do
      # shellcheck disable=SC2086
      for exe in $cand; do
        if command -v "$exe" >/dev/null 2>&1 && "$exe" -c 'import sys' 2>/dev/null; then
          command -v "$exe"; return 0
        fi
      done
    done
  done
  return 1
}

# ensure_postgres: start the local cluster if nothing answers on $PGHOST:$PGPORT.
ensure_postgres() {
  if pg_isready -q -h "$PGHOST" -p "$PGPORT" 2>/dev/null; then return 0; fi
  echo "PostgreSQL is not answering on $PGHOST:$PGPORT; starting it" >&2
  if command -v pg_ctlcluster >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
  fi
  for _ in $(seq 1 60); do
    pg_isready -q -h "$PGHOST" -p "$PGPORT" && return 0
    sleep 0.5
  done
  echo "PostgreSQL did not start" >&2; return 1
}

# make_venv DIR PYTHON PIP-ARGS... : create DIR with PYTHON unless present, then pip install.
make_venv() {
  local dir="$1" py="$2"; shift 2
  if [[ ! -x "$dir/bin/python" ]]; then "$py" -m venv "$dir"; fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
}

# The main environment: Python 3.12+ with Django 6.1 (django.tasks built in).
main_venv() {
  local py; py="$(find_python 3.12 3.13)" || { echo "need Python 3.12 or 3.13" >&2; exit 1; }
  make_venv "$ROOT/.venv" "$py" -e "$ROOT[dev]" "Django>=6.1,<6.2"
}

# The LTS environment: Python 3.11 with Django 5.2 and the django-tasks backport.
lts_venv() {
  local py; py="$(find_python 3.11)" || { echo "need Python 3.11" >&2; exit 1; }
  make_venv "$ROOT/.venv-dj52" "$py" -e "$ROOT[dev,tasks-backport]" "Django>=5.2,<5.3"
}

# ensure_chromium: install Debian's chromium for the admin's real-browser test when it is missing
# (the Playwright Python package drives it; `playwright install` is never run, browsers come from
# the distribution). Set SKIP_BROWSER=1 to skip; the test then skips itself with the reason.
ensure_chromium() {
  if [[ "${SKIP_BROWSER:-0}" == 1 ]] || command -v chromium >/dev/null 2>&1 || [[ -x /usr/bin/chromium ]]; then
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is not installed and apt-get is unavailable: the browser test will be skipped" >&2
    return 0
  fi
  local sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
      echo "chromium is not installed and this user cannot apt-get: the browser test will be skipped" >&2
      return 0
    fi
  fi
  echo "installing chromium (apt-get) for the admin browser test" >&2
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null \
    || echo "chromium could not be installed: the browser test will be skipped" >&2
}

# ensure_pgbouncer: install Debian's pgbouncer for the tests that run the library through it
# (tests/pgbouncer/) when it is missing. Only the binary is used: the distribution's service is
# never started, the tests start their own pgbouncer processes on free ports and stop them after.
# Set SKIP_PGBOUNCER=1 to skip; those tests then skip themselves with the reason.
ensure_pgbouncer() {
  if [[ "${SKIP_PGBOUNCER:-0}" == 1 ]] || command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]; then
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "pgbouncer is not installed and apt-get is unavailable: the PgBouncer tests will be skipped" >&2
    return 0
  fi
  local sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
      echo "pgbouncer is not installed and this user cannot apt-get: the PgBouncer tests will be skipped" >&2
      return 0
    fi
  fi
  echo "installing pgbouncer (apt-get) for the PgBouncer tests" >&2
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq pgbouncer >/dev/null \
    || echo "pgbouncer could not be installed: the PgBouncer tests will be skipped" >&2
}
