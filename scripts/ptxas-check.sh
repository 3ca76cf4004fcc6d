#!/usr/bin/env bash
# Assemble the PTX that the host embeds with NVIDIA's ptxas, without a GPU,
# and fail on any ptxas error, any register spill, any kernel stack frame
# (an array left in local memory) or serialised wgmma; `*_traced` kernels
# (diagnostics) only report theirs.
#
# Why: the driver JIT-compiles our PTX only on the GPU machine, which CI never
# sees. ptxas is the same back end, so running it here catches invalid PTX,
# spills and shared-memory overuse before the code reaches a GPU.
#
# Usage: bash scripts/ptxas-check.sh            (from anywhere in the repo)
# Knobs (environment):
#   GPU_KERNELS_ARCH  PTX target the build script compiles for (default sm_80;
#                     e.g. sm_90a). Passed through to cargo, so the checked PTX
#                     is exactly what a build with this setting embeds.
#   PTXAS_ARCHS       space-separated ptxas -arch values to assemble for.
#                     Default: the PTX's own .target, plus sm_90 (H100/H200)
#                     when the target is not architecture-specific (sm_90a
#                     PTX can only be assembled for sm_90a).
#   PTXAS             a ptxas binary to use instead of the pip one.
#   PTXAS_VENV        where the virtualenv holding ptxas lives (default .ci/venv,
#                     ignored by git, reused across runs).
#   CARGO_PROFILE_ARGS extra cargo args for the build that produces the PTX
#                     (default none: the dev profile that `cargo test` uses;
#                     the kernels themselves are always compiled in release).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ARCH="${GPU_KERNELS_ARCH:-sm_80}"
export GPU_KERNELS_ARCH="$ARCH"
VENV="${PTXAS_VENV:-$ROOT/.ci/venv}"
# The PyPI wheel that carries ptxas (nvidia/cu13/bin/ptxas). Pinned to a major
# release so a new CUDA major cannot change the verdict of CI unannounced.
NVCC_WHEEL_SPEC="${NVCC_WHEEL_SPEC:-nvidia-cuda-nvcc>=13,<14}"
# The GPUs of the test machine (H100/H200) are sm_90.
HOPPER_ARCH=sm_90

find_pip_ptxas() {
    # The wheel's layout is nvidia/cu<major>/bin/ptxas inside site-packages.
    local f
    for f in "$VENV"/lib/python3*/site-packages/nvidia/cu*/bin/ptxas; do
        if [[ -x "$f" ]]; then
            echo "$f"
            return 0
        fi
    done
    return 1
}

# A virtualenv with pip. Debian/Ubuntu split `venv`'s ensurepip into the
# python3-venv package, which a fresh machine may lack: then install it with
# apt-get when we are root (or have password-less sudo), else return 1 and
# the caller falls back to fetching the wheel without pip.
make_venv() {
    [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1 && return 0
    rm -rf "$VENV"
    if python3 -m venv "$VENV" >/dev/null 2>&1; then return 0; fi
    rm -rf "$VENV"
    local sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        sudo -n true 2>/dev/null || return 1
        sudo="sudo -n"
    fi
    command -v apt-get >/dev/null || return 1
    local pyver
    pyver="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    echo "== python3 -m venv failed: installing python3-venv with apt-get"
    $sudo apt-get update -qq >/dev/null || return 1
    # python3.X-venv is the package that carries ensurepip for python3.X.
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "python${pyver}-venv" >/dev/null 2>&1 ||
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv >/dev/null || return 1
    python3 -m venv "$VENV"
}

# Without venv or pip: a wheel is a zip file, so fetch the newest wheel that
# matches NVCC_WHEEL_SPEC's major (13) for this machine from PyPI's JSON API
# with python3's standard library and unpack it where find_pip_ptxas looks.
fetch_wheel() {
    local site="$VENV/lib/python3-wheel/site-packages"
    mkdir -p "$site"
    python3 - "$site" <<'PY'
import io, json, platform, sys, urllib.parse, urllib.request, zipfile
site = sys.argv[1]
major = 13   # NVCC_WHEEL_SPEC: nvidia-cuda-nvcc>=13,<14
index = "https://pypi.org/pypi/nvidia-cuda-nvcc/json"
meta = json.load(urllib.request.urlopen(index, timeout=60))
def key(v):
    return tuple(int(x) if x.isdigit() else 0 for x in v.split("."))
arch = platform.machine()
for version in sorted(meta["releases"], key=key, reverse=True):
    if key(version)[0] != major:
        continue
    wheels = [f for f in meta["releases"][version]
              if f["filename"].endswith(".whl") and "manylinux" in f["filename"] and arch in f["filename"]]
    if wheels:
        break
else:
    sys.exit(f"no nvidia-cuda-nvcc {major}.x wheel for {arch} on PyPI")
w = wheels[0]
print(f"== fetching {w['filename']}")
# Mirrors may answer with URLs relative to the JSON's own.
data = urllib.request.urlopen(urllib.parse.urljoin(index, w["url"]), timeout=600).read()
zipfile.ZipFile(io.BytesIO(data)).extractall(site)
PY
    chmod +x "$site"/nvidia/cu*/bin/* 2>/dev/null || true
}

if [[ -z "${PTXAS:-}" ]]; then
    if ! PTXAS="$(find_pip_ptxas)"; then
        echo "== installing ptxas from PyPI ($NVCC_WHEEL_SPEC) into $VENV"
        if make_venv; then
            "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$NVCC_WHEEL_SPEC"
        else
            echo "== no usable venv (python3-venv missing, cannot install it): fetching the wheel without pip"
            fetch_wheel
        fi
        PTXAS="$(find_pip_ptxas)" || { echo "error: nvidia-cuda-nvcc installed but no ptxas found under $VENV" >&2; exit 1; }
    fi
fi
echo "== ptxas: $PTXAS"
"$PTXAS" --version | tail -n 2

# Ask cargo where the build scripts wrote their PTX instead of guessing among
# target/*/build/*: the build-script-executed messages name the exact OUT_DIR
# of this build. gpu-host's holds the kernels the host embeds; the root
# package's the example kernel crate the tests launch.
echo "== building gpu-host and the root package (GPU_KERNELS_ARCH=$ARCH) to locate their PTX"
PACKAGE_IDS="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, os, sys
want = [os.path.realpath(m) for m in sys.argv[1:]]
pkgs = json.load(sys.stdin)["packages"]
for m in want:
    ids = [p["id"] for p in pkgs if os.path.realpath(p["manifest_path"]) == m]
    if len(ids) != 1:
        sys.exit(f"expected one package with manifest {m}, found {len(ids)}")
    print(ids[0])
' "$ROOT/gpu-host/Cargo.toml" "$ROOT/Cargo.toml")"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PKG_ARGS=()
while IFS= read -r id; do PKG_ARGS+=(--package "$id"); done <<<"$PACKAGE_IDS"
# shellcheck disable=SC2086  # CARGO_PROFILE_ARGS is a word list on purpose
if ! cargo build --lib "${PKG_ARGS[@]}" ${CARGO_PROFILE_ARGS:-} --message-format=json-render-diagnostics >"$WORK/build.json"; then
    echo "error: building gpu-host and the root package (and so the PTX) failed; cargo's errors are above" >&2
    exit 1
fi
mapfile -t OUT_DIRS < <(python3 -c '
import json, sys
want = sys.argv[1].split()
dirs = {}
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") == "build-script-executed" and msg.get("package_id") in want:
        dirs.setdefault(msg["package_id"], []).append(msg["out_dir"])
for pid in want:
    if len(dirs.get(pid, [])) != 1:
        sys.exit(f"expected one build-script run of {pid}, cargo reported {len(dirs.get(pid, []))}")
    print(dirs[pid][0])
' "$(echo $PACKAGE_IDS)" <"$WORK/build.json")
KERNELS_DIR="${OUT_DIRS[0]}"
echo "== PTX directories: ${OUT_DIRS[*]}"

# The builder names its output <crate>.<arch>.ptx. Files of another arch in the
# same OUT_DIR are left over from builds with another GPU_KERNELS_ARCH, except
# the Hopper module, which gpu-host's build.rs always compiles for sm_90a.
shopt -s nullglob
PTX_FILES=()
for d in "${OUT_DIRS[@]}"; do PTX_FILES+=("$d"/*."$ARCH".ptx); done
shopt -u nullglob
HOPPER_PTX="$KERNELS_DIR/gpu_kernels.sm_90a.ptx"
if [[ "$ARCH" != sm_90a ]]; then
    if [[ ! -f "$HOPPER_PTX" ]]; then
        echo "error: $HOPPER_PTX (the sm_90a module the host embeds) is missing" >&2
        exit 1
    fi
    PTX_FILES+=("$HOPPER_PTX")
fi
if (( ${#PTX_FILES[@]} == 0 )); then
    echo "error: no *.$ARCH.ptx in ${OUT_DIRS[*]}" >&2
    exit 1
fi
if [[ ! -f "$KERNELS_DIR/gpu_kernels.$ARCH.ptx" ]]; then
    echo "error: $KERNELS_DIR/gpu_kernels.$ARCH.ptx (the kernels the host embeds) is missing" >&2
    exit 1
fi

status=0
for ptx in "${PTX_FILES[@]}"; do
    target="$(sed -n 's/^[[:space:]]*\.target[[:space:]]\+\([a-z0-9_]*\).*/\1/p' "$ptx" | head -n 1)"
    if [[ -z "$target" ]]; then
        echo "error: $ptx has no .target directive" >&2
        exit 1
    fi
    if [[ -n "${PTXAS_ARCHS:-}" ]]; then
        archs="$PTXAS_ARCHS"
    elif [[ "$target" == *a || "$target" == *f || "$target" == "$HOPPER_ARCH" ]]; then
        # Architecture-specific PTX (sm_90a, sm_100f...) assembles for its own
        # architecture only; sm_90 PTX needs no second run.
        archs="$target"
    else
        # Portable PTX: check the target it names and the GPUs we run on.
        archs="$target $HOPPER_ARCH"
    fi
    for a in $archs; do
        log="$WORK/$(basename "$ptx").$a.log"
        echo
        echo "== ptxas -arch=$a $(basename "$ptx") (.target $target)"
        if ! "$PTXAS" -arch="$a" -v -o "$WORK/out.cubin" "$ptx" >"$log" 2>&1; then
            cat "$log"
            echo "error: ptxas failed on $ptx for $a" >&2
            status=1
            continue
        fi
        # Warnings are shown in full; the table below is the summary.
        grep -i 'warning' "$log" || true
        # ptxas reports serialised wgmma (C7515: every wgmma of the kernel
        # waits for the previous one) as "info", not as a warning; it costs
        # the kernel its tensor-core pipelining, so it is an error here.
        if grep -q 'C7515\|wgmma.mma_async instructions are serialized' "$log"; then
            grep 'C7515\|wgmma.mma_async instructions are serialized' "$log"
            echo "error: ptxas serialised wgmma instructions in $ptx for $a" >&2
            status=1
        fi
        if ! python3 - "$log" <<'PY'
# Turn `ptxas -v` output into one row per function, and fail on spills.
import re, sys

rows = {}   # function name -> dict of numbers
order = []
current = None
kind = {}
for line in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        kind[m.group(1)] = "kernel"
    m = re.search(r"Function properties for (\S+)", line)
    if m:
        current = m.group(1)
        if current not in rows:
            rows[current] = {}
            order.append(current)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m and current is not None:
        rows[current].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        continue
    m = re.search(r"Used (\d+) registers", line)
    if m and current is not None:
        rows[current]["regs"] = int(m.group(1))
        s = re.search(r"(\d+) bytes smem", line)
        rows[current]["smem"] = int(s.group(1)) if s else 0

if not order:
    sys.exit("ptxas -v printed no function properties: nothing was checked")
head = f"{'function':<48} {'kind':<7} {'regs':>5} {'spill st':>9} {'spill ld':>9} {'smem B':>7} {'stack B':>8}"
print(head)
print("-" * len(head))
spilled = []
stacked = []
def cell(r, k):
    return str(r[k]) if k in r else "-"
for name in order:
    r = rows[name]
    shown = name if len(name) <= 48 else name[:45] + "..."
    print(f"{shown:<48} {kind.get(name, 'func'):<7} {cell(r, 'regs'):>5} {cell(r, 'spill_st'):>9} "
          f"{cell(r, 'spill_ld'):>9} {cell(r, 'smem'):>7} {cell(r, 'stack'):>8}")
    # `*_traced` kernels are diagnostics (the bench's trace of the decode
    # step): their few spills are reported, not fatal; the kernels they
    # trace must not spill.
    diagnostic = name.endswith("_traced")
    if (r.get("spill_st", 0) or r.get("spill_ld", 0)) and not diagnostic:
        spilled.append(name)
    # A kernel's stack frame is an array LLVM could not keep in registers
    # (indexed at run time somewhere): every access to it goes through
    # local memory, which ptxas does not count as a spill.
    if kind.get(name) == "kernel" and r.get("stack", 0) and not diagnostic:
        stacked.append(name)
if spilled:
    print("error: register spills in: " + ", ".join(spilled), file=sys.stderr)
if stacked:
    print("error: kernels with a stack frame (local-memory arrays): " + ", ".join(stacked), file=sys.stderr)
if spilled or stacked:
    sys.exit(1)
PY
        then
            status=1
        fi
    done
done

echo
if (( status != 0 )); then
    echo "ptxas check FAILED" >&2
    exit 1
fi
echo "ptxas check passed: ${#PTX_FILES[@]} PTX file(s), no errors, no spills, no kernel stack frames"
