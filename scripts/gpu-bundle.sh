#!/usr/bin/env bash
# Build everything the GPU machine runs into one ignored folder, gpu-out/.
#
# Why: the GPU machine has no Rust toolchain, so we build here (release,
# x86-64, libcuda loaded at run time) and send the binaries along with the
# working tree (`carry: ["gpu-out"]`). The tree and the carried folders travel
# together under a 64 MiB cap, hence stripped binaries and a size check.
#
# Layout of gpu-out/:
#   tests/<name>.gz test executables (`cargo test --release --no-run`) that
#                   hold tests, gzipped
#   bin/<name>.gz   the workspace's binaries, gzipped (the CLI `host`, and bench/tune/
#                   perplexity where they exist), and examples/outside-consumer's
#   scripts/        scripts/*.py and gpu-runner.sh, so the bundle is whole
#   wheels/         the openai client and its dependencies for the GPU
#                   machine's Python (the server test installs them offline)
#   tests.list      '<test file> <package dir>': where each test runs from
#   BUILD_INFO      commit, toolchain, GPU_KERNELS_ARCH, file list
#
# Then, on the GPU machine, from the repo root: bash scripts/gpu-runner.sh
# Knobs: GPU_KERNELS_ARCH (passed to the build, default sm_80),
#        BUNDLE_LIMIT_MIB (fail above this size; default: the 64 MiB that
#        travels less the working tree that travels with it, less 1 MiB),
#        BUNDLE_PROFILE (cargo profile, default release; `test` reuses the
#        build of a plain `cargo test`, handy to try this script quickly).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUNDLE="$ROOT/gpu-out"
# What travels to the GPU machine: the working tree (tracked and untracked,
# not ignored files) and the carried gpu-out/, 64 MiB in all.
CARRY_CAP_MIB=64
BUNDLE_LIMIT_MIB="${BUNDLE_LIMIT_MIB:-0}"
CARRY_MARGIN_MIB=1
BUNDLE_PROFILE="${BUNDLE_PROFILE:-release}"
MIB=$((1024 * 1024))

# Collect the executables cargo reports for one build command. For test
# targets every test executable (profile.test) is taken; for binaries, every
# target of kind "bin". Output: lines "<package-dir> <target-name> <path>".
executables() {
    local want="$1"; shift
    cargo "$@" --message-format=json-render-diagnostics | python3 -c '
import json, os, sys
want, root = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    is_test = msg["profile"]["test"]
    if (want == "test") != is_test:
        continue
    if want == "bin" and "bin" not in msg["target"]["kind"]:
        continue
    # The package directory, relative to the workspace root ("." for the
    # root package): it names the file, and cargo runs tests from there.
    pkg_dir = os.path.relpath(os.path.dirname(msg["manifest_path"]), root)
    # The lib and a bin of one package may share a name (host): for tests, tell
    # them apart by kind, except integration tests ("test"), named as is.
    name = msg["target"]["name"]
    kind = msg["target"]["kind"][0]
    if want == "test" and kind != "test":
        name = f"{kind}-{name}"
    print(pkg_dir, name, msg["executable"])
' "$want" "$ROOT"
}

echo "== building test executables (profile $BUNDLE_PROFILE)"
TESTS="$(executables test test --profile "$BUNDLE_PROFILE" --workspace --no-run)"
echo "== building binaries (profile $BUNDLE_PROFILE)"
BINS="$(executables bin build --profile "$BUNDLE_PROFILE" --workspace --bins)"

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/tests" "$BUNDLE/bin" "$BUNDLE/scripts"

# The root package's test targets (gpu, cpu) keep their plain names, so the
# runner can find tests/gpu; others are prefixed with their package directory
# to stay unique (e.g. host-lib-host for host's library unit tests). tests.list records
# the directory each one runs from: cargo runs a test binary from its
# package's directory, and tests may read files relative to it.
: >"$BUNDLE/tests.list"
while read -r pkg_dir name path; do
    [[ -n "$path" ]] || continue
    if [[ "$pkg_dir" == "." ]]; then dest="$name"; else dest="$(basename "$pkg_dir")-$name"; fi
    # A harness with no tests (each binary of host gets one) would only
    # spend the carry limit: several MiB each. Listing runs no test and
    # needs no GPU.
    listed="$("$path" --list --format terse 2>/dev/null | grep -cE ': (test|benchmark)$' || true)"
    if [[ "$listed" == 0 ]]; then
        echo "== skipping $dest: no tests"
        continue
    fi
    cp "$path" "$BUNDLE/tests/$dest"
    echo "$dest $pkg_dir" >>"$BUNDLE/tests.list"
done <<<"$TESTS"
while read -r _pkg name path; do
    [[ -n "$path" ]] || continue
    cp "$path" "$BUNDLE/bin/$name"
done <<<"$BINS"

# The outside consumer (its own workspace, so its own build): the runner
# runs it as a third party's program.
echo "== building examples/outside-consumer (profile $BUNDLE_PROFILE)"
CONSUMER="$(cd examples/outside-consumer && executables bin build --profile "$BUNDLE_PROFILE" --bins)"
while read -r _pkg name path; do
    [[ -n "$path" ]] || continue
    cp "$path" "$BUNDLE/bin/$name"
done <<<"$CONSUMER"
if [[ ! -f "$BUNDLE/bin/outside-consumer" ]]; then
    echo "error: examples/outside-consumer built no binary" >&2
    exit 1
fi

# The release profile already drops debug info; dropping the symbol table
# too roughly halves what travels. Panics still print their message.
strip --strip-all "$BUNDLE"/tests/* "$BUNDLE"/bin/*
if [[ ! -x "$BUNDLE/tests/gpu" ]]; then
    echo "error: the GPU test binary (tests/gpu) is missing from the bundle" >&2
    exit 1
fi
# Every binary embeds two PTX modules (portable and sm_90a, ~2 MB of text
# each), which compress about tenfold; gpu-runner.sh unpacks them.
gzip -9 -n "$BUNDLE"/tests/* "$BUNDLE"/bin/*

cp scripts/gpu-runner.sh "$BUNDLE/scripts/"
# The official openai client and its dependencies, as wheels for the GPU
# machine's Python (3.12, x86-64 Linux: device/KINDS.md), which has no
# internet: the runner's server test installs them offline.
OPENAI_VERSION="$(sed -n 's/^OPENAI_VERSION="\${OPENAI_VERSION:-\([^}]*\)}"$/\1/p' scripts/serve_openai_test.sh)"
GPU_PYTHON="${GPU_PYTHON:-3.12}"
mkdir -p "$BUNDLE/wheels"
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --python-version "$GPU_PYTHON" --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$BUNDLE/wheels" "openai==$OPENAI_VERSION"
shopt -s nullglob
for py in scripts/*.py; do cp "$py" "$BUNDLE/scripts/"; done
shopt -u nullglob

{
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "rustc: $(rustc --version)"
    echo "profile: $BUNDLE_PROFILE"
    echo "GPU_KERNELS_ARCH: ${GPU_KERNELS_ARCH:-sm_80 (default)}"
    echo "files:"
    (cd "$BUNDLE" && find . -type f ! -name BUILD_INFO ! -name tests.list | sort | while read -r f; do
        printf '  %-40s %8d KiB\n' "$f" $(( $(stat -c %s "$f") / 1024 ))
    done)
} >"$BUNDLE/BUILD_INFO"
cat "$BUNDLE/BUILD_INFO"

if [[ -z "$(ls -A "$BUNDLE/tests")" ]]; then
    echo "error: no test executables were found" >&2
    exit 1
fi

bytes="$(du -sb "$BUNDLE" | cut -f1)"
tree_bytes="$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
limit=$((BUNDLE_LIMIT_MIB > 0 ? BUNDLE_LIMIT_MIB * MIB : (CARRY_CAP_MIB - CARRY_MARGIN_MIB) * MIB - tree_bytes))
mib() { printf '%d.%02d' $(($1 / MIB)) $((($1 % MIB) * 100 / MIB)); }
printf '== gpu-out: %s MiB (limit %s MiB; the working tree beside it %s MiB)\n' "$(mib "$bytes")" "$(mib "$limit")" "$(mib "$tree_bytes")"
if (( bytes > limit )); then
    echo "error: gpu-out is larger than $(mib "$limit") MiB" >&2
    exit 1
fi
echo "== next, on the GPU machine (carry: [\"gpu-out\"]): bash scripts/gpu-runner.sh"
