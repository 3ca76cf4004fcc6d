#!/usr/bin/env bash
# Lint the device code (gpu-kernels' `device` and `ops` modules) for the
# nvptx64 target, where it exists: the workspace's `cargo clippy` runs for
# the host, where those modules are compiled out, so it never sees them.
#
# Both module flavours kernel-builder compiles are checked: the portable one
# (`--features kernels`, `-C target-cpu=sm_80`) and the Hopper one
# (`--features sm90a`, `-C target-cpu=sm_90a`, which adds the wgmma kernels).
# Warnings are errors, and every `unsafe` block needs a `// SAFETY:` comment.
#
# Usage: bash scripts/clippy-nvptx.sh      (from anywhere in the repo)
# Needs the pinned toolchain's rust-src component (`core` is built from
# source for nvptx64, as kernel-builder does).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TARGET=nvptx64-nvidia-cuda
# A target dir of its own: the host build's lock and artefacts stay untouched,
# and the two flavours' RUSTFLAGS do not evict each other's cache.
TARGET_DIR_BASE="$ROOT/target/clippy-nvptx"

sysroot="$(rustc --print sysroot)"
if [[ ! -d "$sysroot/lib/rustlib/src/rust/library/core" ]]; then
    echo "error: rust-src is missing from the toolchain at $sysroot;" >&2
    echo "       -Zbuild-std=core needs it: rustup component add rust-src" >&2
    exit 1
fi

run() {
    local name="$1" cpu="$2" features="$3"
    echo "== clippy-nvptx: $name (--features $features, -C target-cpu=$cpu)"
    RUSTFLAGS="-C target-cpu=$cpu" cargo clippy -p gpu-kernels --locked \
        --features "$features" --target "$TARGET" -Zbuild-std=core \
        --target-dir "$TARGET_DIR_BASE/$name" \
        -- -D warnings -D clippy::undocumented_unsafe_blocks
}

run portable sm_80 kernels
run hopper sm_90a sm90a
echo "clippy-nvptx: both flavours clean"
