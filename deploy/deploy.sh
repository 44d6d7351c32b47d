#!/usr/bin/env bash
# Deploy a release of a fastapi-lith app, and roll back when it is not healthy.
#
#   deploy/deploy.sh [options] SOURCE
#
# 1. installs SOURCE (a wheel, an sdist, a project folder) into a new folder under
#    releases/, with a venv of its own: the wheels beside SOURCE come first, and the versions
#    in the constraints.txt beside it (a release from `make release`) are the ones installed;
# 2. takes a copy of the database first, when DB is set;
# 3. points `current` at the new release and restarts the service;
# 4. asks HEALTH_URL until it answers 200, for at most HEALTH_TIMEOUT seconds;
# 5. if it never does: points `current` back at the previous release, restarts again,
#    checks that one, and exits 1. A failed install changes nothing and exits 1.
#
# Layout (ROOT is /srv/lith/NAME unless set):
#   ROOT/releases/20261129T214501Z/   one release: its files and its .venv
#   ROOT/current -> releases/...      what the service runs (see lith@.service)
#   ROOT/env                          the service's environment (APP, APP_DB, ...): keys,
#                                     so root's, mode 0600 (systemd reads it as root)
#   ROOT/data/                        the database and its copies, the service user's: this
#                                     script only adds its copy, with the database's owner and mode
#
# Options (each also read from the environment variable named after it):
#   --name NAME         NAME            the app: the instance in lith@NAME (required unless
#                                       RESTART_CMD and ROOT are both set)
#   --root DIR          ROOT            /srv/lith/NAME
#   --releases DIR      RELEASES_DIR    ROOT/releases
#   --health-url URL    HEALTH_URL      http://localhost/health, through HEALTH_SOCKET
#   --health-socket P   HEALTH_SOCKET   the unit's socket, /run/lith/NAME.sock, when HEALTH_URL is
#                                       not set; with HEALTH_URL alone, the URL's own host and port
#   --timeout SECONDS   HEALTH_TIMEOUT  30
#   --keep N            KEEP_RELEASES   5 (older releases are deleted; current and previous stay)
#   --db PATH           DB              the database to copy before switching (optional)
#   --constraints FILE  CONSTRAINTS     the versions to install: constraints.txt beside SOURCE
#   --python PATH       PYTHON          the Python of the release's venv: python3. The service
#                                       user must be able to run it: not one under /root or
#                                       /home (a pyenv), which the unit's ProtectHome hides
# and, from the environment only (run with `bash -c`, with RELEASE, SOURCE, ROOT, NAME exported):
#   INSTALL_CMD   "$PYTHON" -m venv "$RELEASE/.venv" && "$RELEASE/.venv/bin/pip" install --quiet
#                 --find-links "$(dirname "$SOURCE")" [--constraint "$CONSTRAINTS"] "$SOURCE"
#   RESTART_CMD   systemctl restart "lith@$NAME"
#   LITH_PYTHON   the Python with fastapi_lith for the copy: ROOT/current/.venv/bin/python
#   BACKUP_DIR    where the copy goes: DB's folder/backups
#
# Exit status: 0 deployed; 1 not deployed, the previous release serves (or nothing changed);
# 2 not deployed and no healthy release to go back to (the previous one fails its check too,
# or this was the first); 64 bad usage.
#
# A release whose migrations ran cannot simply be rolled back: the previous release refuses
# a database newer than its own migrations, so its health check fails too (exit 2). Then
# either fix forward, or stop the service and restore the copy taken in step 2
# (python -m fastapi_lith restore COPY DB), losing what was written since.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 64; }
die() { echo "deploy: $1" >&2; exit "${2:-1}"; }
say() { echo "deploy: $*"; }

SOURCE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --name) NAME="$2"; shift 2 ;;
        --root) ROOT="$2"; shift 2 ;;
        --releases) RELEASES_DIR="$2"; shift 2 ;;
        --health-url) HEALTH_URL="$2"; shift 2 ;;
        --health-socket) HEALTH_SOCKET="$2"; shift 2 ;;
        --timeout) HEALTH_TIMEOUT="$2"; shift 2 ;;
        --keep) KEEP_RELEASES="$2"; shift 2 ;;
        --db) DB="$2"; shift 2 ;;
        --constraints) CONSTRAINTS="$2"; shift 2 ;;
        --python) PYTHON="$2"; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "deploy: unknown option $1" >&2; usage ;;
        *) [ -z "$SOURCE" ] || usage; SOURCE="$1"; shift ;;
    esac
done
[ -n "$SOURCE" ] || usage

NAME="${NAME:-}"
if [ -z "$NAME" ] && { [ -z "${ROOT:-}" ] || [ -z "${RESTART_CMD:-}" ]; }; then
    die "--name is required (or set both ROOT and RESTART_CMD)" 64
fi
ROOT="${ROOT:-/srv/lith/$NAME}"
RELEASES_DIR="${RELEASES_DIR:-$ROOT/releases}"
CURRENT="$ROOT/current"
if [ -z "${HEALTH_URL:-}" ]; then
    HEALTH_URL="http://localhost/health"
    HEALTH_SOCKET="${HEALTH_SOCKET:-/run/lith/$NAME.sock}"
fi
HEALTH_SOCKET="${HEALTH_SOCKET:-}"
HEALTH_TIMEOUT="${HEALTH_TIMEOUT:-30}"
KEEP_RELEASES="${KEEP_RELEASES:-5}"
if [ -z "${INSTALL_CMD:-}" ]; then
    INSTALL_CMD='"$PYTHON" -m venv "$RELEASE/.venv" && "$RELEASE/.venv/bin/pip" install --quiet --find-links "$(dirname "$SOURCE")" ${CONSTRAINTS:+--constraint "$CONSTRAINTS"} "$SOURCE"'
fi
RESTART_CMD="${RESTART_CMD:-systemctl restart \"lith@\$NAME\"}"
DB="${DB:-}"
PYTHON="${PYTHON:-python3}"
case "$SOURCE" in /*) ;; *) [ -e "$SOURCE" ] && SOURCE="$(cd "$(dirname "$SOURCE")" && pwd)/$(basename "$SOURCE")" ;; esac
if [ -z "${CONSTRAINTS:-}" ] && [ -f "$(dirname "$SOURCE")/constraints.txt" ]; then
    CONSTRAINTS="$(dirname "$SOURCE")/constraints.txt"
fi
CONSTRAINTS="${CONSTRAINTS:-}"
export NAME ROOT SOURCE PYTHON CONSTRAINTS

healthy() {  # healthy URL SECONDS: true once URL answers 200 within SECONDS (through HEALTH_SOCKET)
    local url="$1" deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        if command -v curl >/dev/null 2>&1; then
            code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 ${HEALTH_SOCKET:+--unix-socket "$HEALTH_SOCKET"} "$url" || true)"
        else
            code="$(python3 -c 'import http.client, socket, sys, urllib.parse, urllib.request
url, path = sys.argv[1], sys.argv[2]
try:
    if not path:
        print(urllib.request.urlopen(url, timeout=2).status)
    else:
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.netloc, timeout=2)
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.settimeout(2)
        conn.sock.connect(path)
        conn.request("GET", parts.path or "/")
        print(conn.getresponse().status)
except Exception as e: print(getattr(e, "code", 0))' "$url" "$HEALTH_SOCKET")"
        fi
        [ "$code" = "200" ] && return 0
        sleep 0.25
    done
    return 1
}

restart() {
    say "restarting: $RESTART_CMD"
    bash -c "$RESTART_CMD"
}

# -- 1. install the new release into a folder of its own
mkdir -p "$RELEASES_DIR"
RELEASES_DIR="$(cd "$RELEASES_DIR" && pwd)"
id="$(date -u +%Y%m%dT%H%M%SZ)"
n=1
while [ -e "$RELEASES_DIR/$id" ] || [ -e "$RELEASES_DIR/$id.failed" ]; do
    n=$((n + 1)); id="$(date -u +%Y%m%dT%H%M%SZ)-$n"
done
RELEASE="$RELEASES_DIR/$id"
export RELEASE
mkdir "$RELEASE"
say "installing $SOURCE into $RELEASE"
if ! bash -c "$INSTALL_CMD"; then
    rm -rf "$RELEASE"
    die "install failed; nothing changed"
fi
# The unit runs the venv's Python as its own user with ProtectHome=yes: one under a home folder
# (a pyenv in /root) would fail every start. Refuse it here, before anything switches.
if [ -e "$RELEASE/.venv/bin/python" ]; then
    interpreter="$(readlink -f "$RELEASE/.venv/bin/python")"
    case "$interpreter" in
        /root/*|/home/*|/run/user/*)
            rm -rf "$RELEASE"
            die "the release's Python is $interpreter, under a home folder the service cannot read (ProtectHome=yes); nothing changed: pass --python /usr/bin/python3" ;;
    esac
fi

previous=""
if [ -L "$CURRENT" ]; then
    previous="$(readlink -f "$CURRENT" || true)"
fi

# -- 2. a copy of the database from before this release touched it
if [ -n "$DB" ] && [ -f "$DB" ]; then
    backup_dir="${BACKUP_DIR:-$(dirname "$DB")/backups}"
    lith_python="${LITH_PYTHON:-}"
    if [ -z "$lith_python" ]; then
        lith_python="$CURRENT/.venv/bin/python"
        [ -x "$lith_python" ] || lith_python="$RELEASE/.venv/bin/python"
    fi
    copy="$backup_dir/$(basename "$DB" .db)-before-$id.db"
    say "copying $DB to $copy"
    # The copy is the service's, like the database: as root it would be root's, world-readable,
    # in a folder the app's backup timer (the service user) could not write to.
    (umask 077 && mkdir -p "$backup_dir" && "$lith_python" -m fastapi_lith backup "$DB" "$copy") \
        || die "could not copy the database; nothing changed"
    chmod --reference="$DB" "$copy"
    if [ "$(id -u)" = 0 ]; then
        chown --reference="$(dirname "$DB")" "$backup_dir"
        chown --reference="$DB" "$copy"
        [ ! -e "$copy.sha256" ] || chown --reference="$DB" "$copy.sha256"
    fi
fi

switch_to() {  # atomically point `current` at a release
    ln -sfn "$1" "$CURRENT.new"
    mv -T "$CURRENT.new" "$CURRENT"
}

# -- 3. switch and restart
switch_to "$RELEASE"
say "current -> $RELEASE"
restart || true

# -- 4. health
if healthy "$HEALTH_URL" "$HEALTH_TIMEOUT"; then
    say "healthy: $HEALTH_URL${HEALTH_SOCKET:+ (through $HEALTH_SOCKET)} answers 200; deployed $id"
    # keep the newest KEEP_RELEASES releases, and always current and previous
    ls -1 "$RELEASES_DIR" | sort | head -n "-$KEEP_RELEASES" | while read -r old; do
        path="$RELEASES_DIR/$old"
        [ "$path" = "$RELEASE" ] || [ "$path" = "$previous" ] || rm -rf "$path"
    done
    if [ -n "$DB" ] && [ -d "${backup_dir:-/nonexistent}" ]; then
        { ls -1 "$backup_dir" | grep -E -- "-before-.*\.db$" || true; } | sort | head -n "-$KEEP_RELEASES" | while read -r old; do
            rm -f "$backup_dir/$old" "$backup_dir/$old.sha256"
        done
    fi
    exit 0
fi

# -- 5. roll back
say "UNHEALTHY: $HEALTH_URL gave no 200 within $HEALTH_TIMEOUT s"
if [ -z "$previous" ] || [ ! -d "$previous" ]; then
    die "no previous release to roll back to: $id stays current, unhealthy; fix it and deploy again" 2
fi
switch_to "$previous"
mv "$RELEASE" "$RELEASE.failed"
say "rolled back: current -> $previous (the failed release is kept as $RELEASE.failed)"
restart || true
if healthy "$HEALTH_URL" "$HEALTH_TIMEOUT"; then
    die "deploy of $id failed; the previous release serves again" 1
fi
die "deploy of $id failed and the previous release is not healthy either (did the new release migrate the database? see the top of this script)" 2
