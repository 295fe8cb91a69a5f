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
# Says what it does on stderr: on a fresh machine pip downloads and installs for about a minute,
# and nothing else would be printed meanwhile.
make_venv() {
  local dir="$1" py="$2"; shift 2
  if [[ ! -x "$dir/bin/python" ]]; then
    echo "creating the virtualenv $dir ($("$py" -V 2>&1)); installing into it: $* (about a minute on a fresh machine)" >&2
    "$py" -m venv "$dir"
  else
    echo "checking the virtualenv $dir has: $* (seconds)" >&2
  fi
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
}

# The main environment: Python 3.12+ with Django 6.1 (django.tasks built in). main_venv EXTRA adds
# an extra of pyproject.toml (scripts/bench: bench).
main_venv() {
  local py; py="$(find_python 3.12 3.13)" || { echo "need Python 3.12 or 3.13" >&2; exit 1; }
  make_venv "$ROOT/.venv" "$py" -e "$ROOT[dev,otel${1:+,$1}]" "Django>=6.1,<6.2"
}

# The LTS environment: Python 3.11 with Django 5.2 and the django-tasks backport.
lts_venv() {
  local py; py="$(find_python 3.11)" || { echo "need Python 3.11" >&2; exit 1; }
  make_venv "$ROOT/.venv-dj52" "$py" -e "$ROOT[dev,otel,tasks-backport]" "Django>=5.2,<5.3"
}

# The Django 6.0 environment: Python 3.13 with Django 6.0 (the first release with django.tasks).
dj60_venv() {
  local py; py="$(find_python 3.13)" || { echo "need Python 3.13" >&2; exit 1; }
  make_venv "$ROOT/.venv-dj60" "$py" -e "$ROOT[dev]" "Django>=6.0,<6.1"
}

# apt_install COMMAND PACKAGE WHAT [APT-ARGS...]: install Debian's PACKAGE when the executable
# COMMAND is missing, for the tests WHAT names; without apt-get, or as a user who cannot use it, say
# which tests will skip and go on. A distribution service the package ships is never started (a
# container runs no systemd; the tests start their own processes on free ports).
apt_install() {
  local cmd="$1" package="$2" what="$3"; shift 3
  if command -v "$cmd" >/dev/null 2>&1 || [[ -x "/usr/sbin/$cmd" || -x "/usr/bin/$cmd" ]]; then return 0; fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "$cmd is not installed and apt-get is unavailable: $what will be skipped" >&2
    return 0
  fi
  local sudo=""
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo -n"; else
      echo "$cmd is not installed and this user cannot apt-get: $what will be skipped" >&2
      return 0
    fi
  fi
  echo "installing $package (apt-get) for $what" >&2
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" \
    "$package" >/dev/null || echo "$package could not be installed: $what will be skipped" >&2
}

# ensure_chromium: Debian's chromium for the admin's real-browser test (the Playwright Python
# package drives it; `playwright install` is never run, browsers come from the distribution).
# SKIP_BROWSER=1 skips; the test then skips itself with the reason.
ensure_chromium() {
  [[ "${SKIP_BROWSER:-0}" == 1 ]] || apt_install chromium chromium "the admin browser test"
}

# ensure_promtool: Debian's prometheus package for its promtool, which checks and unit-tests the
# shipped alert rules (tests/monitoring/test_alert_rules.py); it needs none of the web console's
# recommended JavaScript packages. SKIP_PROMTOOL=1 skips.
ensure_promtool() {
  [[ "${SKIP_PROMTOOL:-0}" == 1 ]] || apt_install promtool prometheus "the alert rule tests" --no-install-recommends
}

# ensure_pgbouncer: Debian's pgbouncer for the tests that run the library through it
# (tests/pgbouncer/, which start their own pgbouncer processes). SKIP_PGBOUNCER=1 skips.
ensure_pgbouncer() {
  [[ "${SKIP_PGBOUNCER:-0}" == 1 ]] || apt_install pgbouncer pgbouncer "the PgBouncer tests"
}
