#!/usr/bin/env bash
# The `serve` binary end to end with real clients, on the CPU and the
# loopback address only: the official `openai` Python package (installed
# into a fresh virtualenv) and curl. Needs python3, curl and cargo; builds
# `serve` and `host` (test profile: already built by `cargo test`), writes a
# small random checkpoint, starts the server on a free port, checks the
# replies, then stops it with SIGTERM and expects exit code 0.
#
#   bash scripts/serve_openai_test.sh
#
# Environment: SERVE_TEST_DIR (scratch directory, default a new temp dir),
# OPENAI_VERSION (default pinned below). On the GPU machine (no Rust, no
# internet; scripts/gpu-runner.sh): SERVE_BIN_DIR (prebuilt `serve` and
# `host`: no cargo build), SERVE_BACKEND_ARGS (flags of both, default
# `--cpu`; empty: the GPU engine), OPENAI_WHEELS (a directory of wheels:
# install offline from it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# The client version the test is known to pass with.
OPENAI_VERSION="${OPENAI_VERSION:-1.109.1}"
# The backend: the CPU reference unless told otherwise.
read -r -a BACKEND <<<"${SERVE_BACKEND_ARGS---cpu}"
# Bounds, in seconds: server start, the Python test, one curl request, exit.
START_TIMEOUT=120
SCRIPT_TIMEOUT=300
CURL_TIMEOUT=60
EXIT_TIMEOUT=60
PROMPT="The quick brown fox"  # as PROMPT in serve_openai_test.py
MAX_TOKENS=8                  # as MAX_TOKENS there

WORK="${SERVE_TEST_DIR:-$(mktemp -d)}"
mkdir -p "$WORK"
SERVER_PID=""
cleanup() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    [[ -n "${SERVE_TEST_DIR:-}" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

# CI runs as root on a Debian-like machine: install what is missing there.
apt_install() {
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt-get update -qq
        apt-get install -y -qq "$@"
    else
        echo "error: need $* (install it, or run as root with apt-get)" >&2
        return 1
    fi
}
command -v curl >/dev/null || apt_install curl

echo "== virtualenv with openai==$OPENAI_VERSION"
VENV="$WORK/venv"
if ! python3 -m venv "$VENV" 2>"$WORK/venv.err"; then
    cat "$WORK/venv.err"
    echo "python3 -m venv failed; installing python3-venv"
    # Debian names the package after the minor version on some releases.
    PYVER="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    apt_install python3-venv || apt_install "python${PYVER}-venv"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
fi
if [[ -n "${OPENAI_WHEELS:-}" ]]; then
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
        --find-links "$OPENAI_WHEELS" "openai==$OPENAI_VERSION"
else
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI_VERSION"
fi

if [[ -n "${SERVE_BIN_DIR:-}" ]]; then
    BIN="$(cd "$SERVE_BIN_DIR" && pwd)"
else
    echo "== build serve and host"
    cargo build --quiet --locked --profile test -p host --bin serve --bin host
    BIN="$ROOT/target/debug"
fi
echo "backend flags: ${BACKEND[*]:-(none: the GPU engine)}"

echo "== checkpoint and the CLI's greedy reference"
"$VENV/bin/python" scripts/serve_openai_test.py write-checkpoint "$WORK/model.bin"
HF_ENDPOINT=http://127.0.0.1:9 "$BIN/host" "${BACKEND[@]}" --weights "$WORK/model.bin" \
    --temperature 0 -n "$MAX_TOKENS" "$PROMPT" > "$WORK/cli.txt" 2>"$WORK/cli.err"
# The CLI prints the prompt, the continuation and a newline.
"$VENV/bin/python" - "$WORK/cli.txt" "$WORK/expected.txt" "$PROMPT" <<'PY'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
prompt = sys.argv[3]
assert text.startswith(prompt) and text.endswith("\n"), repr(text)
open(sys.argv[2], "w", encoding="utf-8").write(text[len(prompt):-1])
PY

echo "== start the server"
HF_ENDPOINT=http://127.0.0.1:9 "$BIN/serve" "${BACKEND[@]}" --weights "$WORK/model.bin" --port 0 \
    > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER_PID=$!
URL=""
for _ in $(seq "$START_TIMEOUT"); do
    URL="$(head -n 1 "$WORK/serve.out")"
    [[ -n "$URL" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/serve.err"; echo "error: serve exited" >&2; exit 1; }
    sleep 1
done
[[ "$URL" == http://127.0.0.1:* ]] || { cat "$WORK/serve.err"; echo "error: no address from serve" >&2; exit 1; }
echo "server at $URL"

echo "== openai client"
timeout "$SCRIPT_TIMEOUT" "$VENV/bin/python" scripts/serve_openai_test.py run "$URL" "$WORK/expected.txt"

echo "== curl"
CURL=(curl -sS --max-time "$CURL_TIMEOUT" -H 'Content-Type: application/json')
reply="$("${CURL[@]}" -d "{\"prompt\": \"$PROMPT\", \"max_tokens\": $MAX_TOKENS, \"temperature\": 0}" "$URL/v1/completions")"
"$VENV/bin/python" - "$reply" "$WORK/expected.txt" <<'PY'
import json, sys
reply = json.loads(sys.argv[1])
assert reply["object"] == "text_completion", reply
assert reply["choices"][0]["text"] == open(sys.argv[2], encoding="utf-8").read(), reply
PY
stream="$("${CURL[@]}" -N -d "{\"prompt\": \"$PROMPT\", \"max_tokens\": 4, \"stream\": true}" "$URL/v1/completions")"
[[ "$stream" == *"data: [DONE]" ]] || { echo "error: stream without [DONE]: $stream" >&2; exit 1; }
code="$("${CURL[@]}" -o /dev/null -w '%{http_code}' -d '{"prompt": ' "$URL/v1/completions")"
[[ "$code" == 400 ]] || { echo "error: malformed JSON gave HTTP $code" >&2; exit 1; }
code="$("${CURL[@]}" -o /dev/null -w '%{http_code}' "$URL/nowhere")"
[[ "$code" == 404 ]] || { echo "error: unknown route gave HTTP $code" >&2; exit 1; }
"${CURL[@]}" "$URL/health" | grep -q '"ok"'
"${CURL[@]}" "$URL/metrics" | grep -q '^gpt2_generated_tokens_total '
echo "curl ok"

echo "== SIGTERM"
kill -TERM "$SERVER_PID"
status=0
timeout "$EXIT_TIMEOUT" tail --pid="$SERVER_PID" -f /dev/null || { echo "error: serve did not exit" >&2; exit 1; }
wait "$SERVER_PID" || status=$?
SERVER_PID=""
[[ $status -eq 0 ]] || { cat "$WORK/serve.err"; echo "error: serve exited with $status" >&2; exit 1; }
echo "serve exited 0"
echo "serve_openai_test passed"
