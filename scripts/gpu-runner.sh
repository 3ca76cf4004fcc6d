#!/usr/bin/env bash
# Run the bundle made by scripts/gpu-bundle.sh on the GPU machine.
#
# Run from the repo root of the copied working tree, with gpu-out carried:
#   bash scripts/gpu-runner.sh
# The tests read workspace files (weights/gpt2 tokenizer files) relative to the
# repo root, which is why they run from there and not from gpu-out/.
# Also: bash scripts/gpu-runner.sh --counts LOG   prints the counts below for a
# saved log (e.g. tests.log) and exits; needs no bundle and no GPU.
#
# Steps (each one's failure is recorded, the others still run; the exit status
# is non-zero if any failed):
#   1. device: nvidia-smi, driver, GPU name, compute capability
#   2. oracle: scripts/hf_reference.py writes a random-init GPT-2 checkpoint,
#      token ids and transformers' logits into a directory
#   3. tests: every test binary with --include-ignored (GPU tests are
#      #[ignore = "needs a GPU"] so that a machine without one reports them as
#      ignored) and GPT2_REQUIRE_GPU=1 (a test that cannot reach the GPU fails),
#      with GPT2_ORACLE_DIR + GPT2_REQUIRE_ORACLE=1 when step 2 succeeded;
#      then (PORTABLE=1) the GPU test binaries once more with
#      GPT2_PORTABLE_KERNELS=1, so a Hopper GPU runs the portable sm_80
#      module (the mma.sync TF32 path) end to end too
#   4. compute-sanitizer memcheck, racecheck, synccheck and initcheck over the
#      GPU test binary
#   5. (BENCH=1) scripts/torch_bench.py, the accuracy table (bin/accuracy) and
#      the Rust bench binary, if any
#
# Skips count as failures. libtest counts a test that returns early as
# passed, so a test that cannot run prints one line
#   SKIPPED: <test name>: <reason>
# (tests/common/skip.rs; written past libtest's output capture, so it reaches
# the log even when the test passes). The summary gives, per test binary and
# pass, "X passed, Y failed, Z ignored, S skipped" (the sums of libtest's
# "test result:" lines, and the count of SKIPPED lines), and with
# GPT2_REQUIRE_GPU=1 (always, here) a pass with S > 0 FAILS, naming the
# skipped tests. Tests that cannot run in a pass by design are not run there
# (--skip) rather than skipping, so a clean run has 0 skipped:
#   - WGMMA_TESTS (the sm_90a-only tests: wgmma, the decode step's folds)
#     in the portable pass, whose sm_80 module has no such kernels, and in every pass on a GPU that is not
#     compute capability 9.0;
#   - ORACLE_TESTS when step 2 made no oracle (step 2 has failed already,
#     or ORACLE=0 asked for none).
# Each sanitizer line gives the tool's own last word ("ERROR SUMMARY: n
# errors"; racecheck "RACECHECK SUMMARY: n hazards displayed (...)") and the
# counts of the tests it ran; a tool with findings, no summary line, or no
# test run fails.
#
# Files written to $OUT (few on purpose: at most 8 come back):
#   summary.txt tests.log (both passes) sanitizer.log oracle.log programs.log bench.log
#   bench-torch.json bench-rust.json (bench-multi.json with two or more GPUs)
#
# Knobs (environment). Measured on an H200 (2026-11-24): tests of both passes,
# the programs, memcheck, racecheck and synccheck take ~8-9 minutes; initcheck
# over INITCHECK_FILTERS' 32 tests 55 s more (bf16::engine_* under initcheck
# took minutes, hence the narrower bf16 filters):
#   GPU_OUT=gpu-out             the bundle
#   TEST_TIMEOUT=240            seconds per test binary
#   TEST_ARGS=                  extra libtest args for every test binary
#                               (after --include-ignored; e.g. a name filter)
#   PORTABLE=1                  0 skips the second pass with GPT2_PORTABLE_KERNELS=1
#   PORTABLE_TESTS="gpu gpu_oom"  test binaries of that pass
#   WGMMA_TESTS="matmul_tf32::matmul_tf32_wgmma_error_matches_cublas ..."
#                               libtest names of the tests that need the wgmma
#                               kernels (those calling wgmma_gpu() in
#                               tests/gpu/matmul_tf32.rs)
#   ORACLE_TESTS="oracle::cpu_logits_match_transformers forward::transformers_oracle"
#   SANITIZE=1                  0 skips step 4
#   SANITIZER_TOOLS="memcheck racecheck synccheck initcheck"
#   SANITIZER_FILTERS=          libtest name filters for the sanitized run
#                               (space-separated; empty = the whole binary)
#   MEMCHECK_FILTERS=, RACECHECK_FILTERS=, SYNCCHECK_FILTERS=, INITCHECK_FILTERS=
#                               per-tool filters, override the above (defaults
#                               and why: below, where they are set). memcheck:
#                               the whole binary; racecheck: kernels with shared
#                               memory, at small sizes; synccheck: decode::;
#                               initcheck (reads of device memory nothing
#                               wrote): decode::, sampling::, flash_attention::
#                               and five kernels:: tests, a few minutes
#   SANITIZER_TIMEOUT=300       seconds per sanitizer tool (racecheck took 190 s on an H200)
#   ORACLE=1                    0 skips step 2 (the oracle tests are then not run)
#   ORACLE_TIMEOUT=240
#   SERVE=1                     0 skips step 3c (the server on the GPU)
#   SERVE_SLOTS=128             the load test's --max-running
#   SERVE_LOAD_CLIENTS="1 8 32 64 128"  concurrency levels of the load test
#   SERVE_LOAD_ROUNDS=4         requests per client at each level (the first
#                               round arrives at once: more rounds weigh it less)
#   SERVE_LOAD_MIN_REQUESTS=4   at least this many requests a level
#   MULTI_GPU_TESTS="two_gpus"  libtest name filter of the tests that need two
#                               GPUs: left out (--skip) on a one-GPU machine;
#                               elsewhere GPT2_REQUIRE_MULTI_GPU=1 makes them
#                               fail rather than skip
#   MULTI_BENCH=1               on a machine with two or more GPUs, step 3d:
#                               `bench tp` and `bench replicas` (log: bench.log)
#   MULTI_BENCH_TIMEOUT=540
#   BENCH=0                     1 runs step 5
#   BENCH_TIMEOUT=420
#   BENCH_RUST_ARGS="all --json $OUT/bench-rust.json"   arguments for gpu-out/bin/bench
set -uo pipefail   # no -e: a failing step is recorded, and the next one runs

# ---------------------------------------------------------------- counting
# Reads the logs of the steps below (and of `--counts LOG`).

# libtest's "test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured; ..."
# lines of a log, summed: "12 passed, 0 failed, 1 ignored" ("no test result"
# when there is none: the binary crashed or was killed before its summary).
result_counts() {
    awk '/^test result:/ {
            n++
            for (i = 1; i < NF; i++) {
                w = $(i + 1); sub(/[;,.]$/, "", w)
                if (w == "passed") p += $i; else if (w == "failed") f += $i; else if (w == "ignored") g += $i
            }
        }
        END { if (n) printf "%d passed, %d failed, %d ignored", p, f, g; else printf "no test result" }' "$1"
}

# The tests that skipped, one name a line: the "SKIPPED: <test>: <reason>"
# lines of tests/common/skip.rs. No ^ anchor: the marker goes to stderr, and
# may land after libtest's "test <name> ... " (stdout, flushed before the
# result word) of the same or, with several threads, another test.
skipped_tests() {
    { grep -oE 'SKIPPED: .*' "$1" || true; } | sed -E 's/^SKIPPED: ([^ ]+): .*/\1/'
}

# The tests that failed, one name a line: libtest's closing "failures:" list
# ("    <name>" lines up to a blank one), and its "test <name> ... FAILED"
# lines (which a skip marker may have split; the list is whole).
failed_tests() {
    awk '/^failures:$/ { list = 1; next }
        list && /^    [^ ]+$/ { sub(/^    /, ""); print; next }
        { list = 0 }
        /^test .* FAILED$/ { print $2 }' "$1" | sort -u
}

# Names, one a line, as one line: at most 12, then "(and N more)".
name_list() {
    awk '{ n++; if (n <= 12) printf "%s%s", (n > 1 ? " " : ""), $0 }
        END { if (n > 12) printf " (and %d more)", n - 12 }'
}

# "X passed, Y failed, Z ignored, S skipped" for a log.
counts() {
    printf '%s, %d skipped' "$(result_counts "$1")" "$(skipped_tests "$1" | wc -l)"
}

# The number before WORD in a counts line: count_of "3 passed, 1 failed" passed -> 3.
count_of() {
    grep -oE "[0-9]+ $2" <<<"$1" | head -n 1 | cut -d' ' -f1
}

# compute-sanitizer's own last word in a log: memcheck, synccheck, initcheck
# "ERROR SUMMARY: 0 errors"; racecheck "RACECHECK SUMMARY: 0 hazards
# displayed (0 errors, 0 warnings)". Empty when there is none.
sanitizer_summary() {
    { grep -E '^=+ *(ERROR|RACECHECK) SUMMARY' "$1" || true; } | tail -n 1 | sed -E 's/^=+ *//'
}

# The errors a sanitizer summary line reports: "ERROR SUMMARY: N errors" -> N;
# racecheck's "(N errors, M warnings)" -> N (its warnings, hazards it judges
# benign, do not set --error-exitcode either; the summary line shows them).
sanitizer_errors() {
    case "$1" in
        RACECHECK*) sed -nE 's/.*\(([0-9]+) errors?.*/\1/p' <<<"$1" ;;
        *) sed -nE 's/^ERROR SUMMARY: ([0-9]+).*/\1/p' <<<"$1" ;;
    esac
}

# The distinct findings of a sanitizer log, most frequent first, as
# "<count> x <what> @ <where>" (where: the kernel, offsets dropped), at most 8.
sanitizer_findings() {
    awk '/^========= [^ ]/ && !/SUMMARY|COMPUTE-SANITIZER|Target application returned/ {
            what = $0; sub(/^========= /, "", what)
            if ((getline nxt) > 0 && nxt ~ /^=+ +at /) {
                sub(/^=+ +at /, "", nxt); gsub(/\+0x[0-9a-fA-F]+/, "", nxt); what = what " @ " nxt
            }
            print what
        }' "$1" | sort | uniq -c | sort -rn | head -n 8 | sed -E 's/^ *([0-9]+) /\1 x /'
}

# `--counts LOG`: the counts of each "######## <label>" section of a log
# this script wrote (tests.log, sanitizer.log), or of the whole file.
if [[ "${1:-}" == --counts ]]; then
    if (( $# != 2 )) || [[ ! -f "$2" ]]; then
        echo "usage: $0 --counts LOG" >&2
        exit 2
    fi
    parts="$(mktemp -d)"
    awk -v dir="$parts" -v whole="$2" '
        BEGIN { n = 0; title[0] = whole }
        /^######## / { close(f); n++; title[n] = substr($0, 10) }
        { f = sprintf("%s/%04d", dir, n); print > f }
        END { close(f); for (i = 0; i <= n; i++) print title[i] > (dir "/titles") }' "$2"
    i=0
    while IFS= read -r title; do
        part="$parts/$(printf '%04d' "$i")"
        i=$((i + 1))
        if [[ ! -f "$part" ]] || ! grep -qE '^test result:|SKIPPED: |SUMMARY' "$part"; then
            continue
        fi
        line="$title: $(counts "$part")"
        san="$(sanitizer_summary "$part")"
        [[ -n "$san" ]] && line="$line; $san"
        echo "$line"
        skipped="$(skipped_tests "$part" | name_list)"
        [[ -n "$skipped" ]] && echo "  skipped: $skipped"
    done <"$parts/titles"
    rm -rf "$parts"
    exit 0
fi

ROOT="$(pwd)"
if [[ ! -f "$ROOT/Cargo.toml" ]]; then
    echo "error: run this from the repository root (no Cargo.toml in $ROOT)" >&2
    exit 1
fi
GPU_OUT="$(cd "${GPU_OUT:-$ROOT/gpu-out}" 2>/dev/null && pwd || echo "${GPU_OUT:-$ROOT/gpu-out}")"
OUT="${OUT:-/tmp/gpu-runner-out}"
mkdir -p "$OUT"

TEST_TIMEOUT="${TEST_TIMEOUT:-240}"
TEST_ARGS="${TEST_ARGS:-}"
SANITIZE="${SANITIZE:-1}"
SANITIZER_TOOLS="${SANITIZER_TOOLS:-memcheck racecheck synccheck initcheck}"
SANITIZER_FILTERS="${SANITIZER_FILTERS:-}"
# memcheck: every GPU test of tests/gpu (the one that asks for terabytes on
# purpose lives in tests/gpu_oom, which the sanitizers do not run: its failed
# cuMemAlloc is the expected result, but memcheck counts API errors too).
# racecheck is ~50x slower: the kernels with shared memory and barriers, at
# sizes that finish in a few minutes.
MEMCHECK_FILTERS="${MEMCHECK_FILTERS-}"
# The persistent decode step at its smallest (decode_persistent_small):
# racecheck did not finish decode_persistent_one_row (grid barriers spinning
# under the tool) in 150 s.
RACECHECK_FILTERS="${RACECHECK_FILTERS-flash_attention::flash_prefill_tf32 flash_attention::flash_decode device:: matmul_tf32::matmul_tf32_awkward kernels::layernorm kernels::softmax kernels::attention_windowed kernels::argmax kernels::matmul_tiled_unaligned matmul_tf32::matmul_tf32_split_k kernels::matmul_split_k_explicit matmul_small::matmul_small_is_deterministic matmul_small::matmul_small_unaligned_operands decode::decode_attention_rows_at_different_positions decode::decode_graph_windowed decode::decode_persistent_small decode::decode_mma_small}"
# synccheck: the decode kernels' barriers (sync_threads_or after early exits).
SYNCCHECK_FILTERS="${SYNCCHECK_FILTERS-decode::}"
# initcheck: reads of device memory that nothing wrote. cudarc's alloc leaves
# memory uninitialised; the tests poison outputs (NaN) before each launch,
# which counts as written, so what it can find is a kernel reading a
# workspace, cache or padding that no one filled. It shadows every global
# access like memcheck (slower than memcheck, far faster than racecheck), so
# it runs the kernels with the most scratch state, in a few minutes: the
# decode step (KV cache, split workspaces, graphs), the device sampler, flash
# attention (cached prefix, kv splits), and a few kernels:: tests (encoder,
# layernorm, softmax, argmax over padded vocab rows, the tiled matmul's edge
# tiles), and the bf16 kernels (the bf16 matmul's edge tiles, the upload
# conversion, the embedding). A finding fails the step like the other tools'; the summary names
# the kernels (see sanitizer.log for the full report).
INITCHECK_FILTERS="${INITCHECK_FILTERS-decode:: sampling:: flash_attention:: kernels::encoder_matches_cpu kernels::layernorm_matches_cpu kernels::softmax kernels::argmax kernels::matmul_tiled_unaligned matmul_bf16::matmul_bf16_awkward bf16::convert bf16::encoder}"
export MEMCHECK_FILTERS RACECHECK_FILTERS SYNCCHECK_FILTERS INITCHECK_FILTERS
SANITIZER_TIMEOUT="${SANITIZER_TIMEOUT:-300}"
PORTABLE="${PORTABLE:-1}"
PORTABLE_TESTS="${PORTABLE_TESTS:-gpu gpu_oom}"
# libtest --skip matches substrings: keep these full paths.
WGMMA_TESTS="${WGMMA_TESTS-matmul_tf32::matmul_tf32_wgmma_error_matches_cublas matmul_tf32::matmul_tf32_split_k_every_wgmma_tile matmul_bf16::matmul_bf16_wgmma_gpt2_shapes matmul_bf16::matmul_bf16_wgmma_split_k_parts_add_up_to_the_twin matmul_bf16::matmul_bf16_wgmma_awkward_shapes_every_variant matmul_bf16::matmul_bf16_wgmma_selects_exactly matmul_bf16::matmul_bf16_wgmma_qkv_fills_the_kv_cache matmul_bf16::wgmma_tma_store_matches_the_elementwise_store decode::decode_step_fold_matches_cpu}"
ORACLE_TESTS="${ORACLE_TESTS-oracle::cpu_logits_match_transformers forward::transformers_oracle}"
ORACLE="${ORACLE:-1}"
ORACLE_TIMEOUT="${ORACLE_TIMEOUT:-240}"
BENCH="${BENCH:-0}"
MULTI_GPU_TESTS="${MULTI_GPU_TESTS-two_gpus}"
MULTI_BENCH="${MULTI_BENCH:-1}"
MULTI_BENCH_TIMEOUT="${MULTI_BENCH_TIMEOUT:-540}"
SERVE="${SERVE:-1}"
SERVE_SLOTS="${SERVE_SLOTS:-128}"
SERVE_LOAD_CLIENTS="${SERVE_LOAD_CLIENTS:-1 8 32 64 128}"
SERVE_LOAD_ROUNDS="${SERVE_LOAD_ROUNDS:-4}"
SERVE_LOAD_MIN_REQUESTS="${SERVE_LOAD_MIN_REQUESTS:-4}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-420}"
BENCH_RUST_ARGS="${BENCH_RUST_ARGS:-all --json $OUT/bench-rust.json}"

SUMMARY="$OUT/summary.txt"
TESTS_LOG="$OUT/tests.log"
SAN_LOG="$OUT/sanitizer.log"
ORACLE_LOG="$OUT/oracle.log"
BENCH_LOG="$OUT/bench.log"
: >"$SUMMARY"; : >"$TESTS_LOG"; : >"$BENCH_LOG"
FAILED=0
START=$SECONDS

note() { echo "$*" | tee -a "$SUMMARY"; }
fail() { note "FAIL: $*"; FAILED=1; }
banner() { printf '\n######## %s (%d s)\n' "$*" $((SECONDS - START)); }

# Prefer the scripts in the bundle (built together with the binaries), fall back
# to the working tree.
if [[ -d "$GPU_OUT/scripts" ]]; then SCRIPTS="$GPU_OUT/scripts"; else SCRIPTS="$ROOT/scripts"; fi

if [[ ! -f "$GPU_OUT/tests.list" ]]; then
    echo "error: no bundle at $GPU_OUT: run scripts/gpu-bundle.sh first and carry gpu-out" >&2
    exit 1
fi
# gpu-bundle.sh gzips the executables (they embed ~4 MB of PTX text each);
# carried files may also lose their execute bit.
for gz in "$GPU_OUT"/tests/*.gz "$GPU_OUT"/bin/*.gz; do
    [[ -f "$gz" ]] && gunzip -f "$gz"
done
chmod +x "$GPU_OUT"/tests/* "$GPU_OUT"/bin/* 2>/dev/null

# ---------------------------------------------------------------- 1. device
banner "device"
nvidia-smi || fail "nvidia-smi"
DEVICE="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
COMPUTE_CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')"
note "device: ${DEVICE:-unknown}, compute capability ${COMPUTE_CAP:-unknown}"
note "bundle: $(grep -m1 '^commit:' "$GPU_OUT/BUILD_INFO" 2>/dev/null || echo 'no BUILD_INFO')"
note "kernels: $(grep -m1 '^GPU_KERNELS_ARCH:' "$GPU_OUT/BUILD_INFO" 2>/dev/null || echo '?')"
GPU_COUNT="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
note "GPUs: $GPU_COUNT"

# NCCL for the multi-GPU code: cudarc loads "libnccl.so" (not the
# "libnccl.so.2" that PyTorch's nvidia-nccl wheel ships), so a folder with
# that name linked to the wheel's library goes on LD_LIBRARY_PATH. NVLink
# multicast stays off wherever NCCL starts.
export NCCL_NVLS_ENABLE=0
NCCL_SO="$(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = [h for r in roots for h in glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so*"), recursive=True)]
print(sorted(hits)[0] if hits else "")
PY
)"
if [[ -n "$NCCL_SO" ]]; then
    mkdir -p /tmp/gpt2-nccl && ln -sf "$NCCL_SO" /tmp/gpt2-nccl/libnccl.so
    export LD_LIBRARY_PATH="/tmp/gpt2-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "NCCL: $NCCL_SO (NCCL_NVLS_ENABLE=0)"
else
    note "NCCL: not found in Python's site-packages (the multi-GPU tests will say so)"
fi

# ---------------------------------------------------------------- 2. oracle
ORACLE_DIR="$(mktemp -d /tmp/gpt2-oracle.XXXXXX)"
ORACLE_OK=0
if [[ "$ORACLE" == 1 ]]; then
    banner "oracle: transformers reference"
    if [[ ! -f "$SCRIPTS/hf_reference.py" ]]; then
        fail "oracle: $SCRIPTS/hf_reference.py not found"
    elif PYTHONUNBUFFERED=1 timeout "$ORACLE_TIMEOUT" python3 "$SCRIPTS/hf_reference.py" "$ORACLE_DIR" >"$ORACLE_LOG" 2>&1; then
        ORACLE_OK=1
        note "oracle: ok ($(ls "$ORACLE_DIR" | tr '\n' ' '))"
    else
        tail -n 20 "$ORACLE_LOG"
        fail "oracle: hf_reference.py failed (see oracle.log); the oracle tests are not run"
    fi
fi

# ---------------------------------------------------------------- 3. tests
export GPT2_REQUIRE_GPU=1
if (( ORACLE_OK )); then
    export GPT2_ORACLE_DIR="$ORACLE_DIR" GPT2_REQUIRE_ORACLE=1
fi

# Tests that cannot run on this machine in any pass: every test binary (and
# the sanitizers) gets them as --skip, so they are left out, not skipped.
NOT_HERE=()
if [[ -n "$COMPUTE_CAP" && "$COMPUTE_CAP" != 9.0 && -n "$WGMMA_TESTS" ]]; then
    for t in $WGMMA_TESTS; do NOT_HERE+=(--skip "$t"); done
    note "not run: $WGMMA_TESTS (the wgmma kernels need compute capability 9.0)"
fi
if (( GPU_COUNT < 2 )) && [[ -n "$MULTI_GPU_TESTS" ]]; then
    for t in $MULTI_GPU_TESTS; do NOT_HERE+=(--skip "$t"); done
    note "not run: tests matching $MULTI_GPU_TESTS (they need two GPUs; this machine has $GPU_COUNT)"
elif (( GPU_COUNT >= 2 )); then
    export GPT2_REQUIRE_MULTI_GPU=1
fi
if (( ! ORACLE_OK )) && [[ -n "$ORACLE_TESTS" ]]; then
    for t in $ORACLE_TESTS; do NOT_HERE+=(--skip "$t"); done
    note "not run: $ORACLE_TESTS (no transformers oracle)"
fi

# One test binary: run it, log it, note its counts, and add its log to the
# pass's (PASS_LOG). Arguments: the label in the summary, the bundle's file
# name, the package dir, and 1 for the portable pass (GPT2_PORTABLE_KERNELS=1).
run_tests() {
    local label="$1" name="$2" pkg_dir="$3" portable="$4"
    local bin="$GPU_OUT/tests/$name"
    banner "tests: $label (in $pkg_dir)"
    # --include-ignored: GPU tests are #[ignore = "needs a GPU"], so that
    # `cargo test` on a machine without one reports them as ignored.
    local args=(--include-ignored "${NOT_HERE[@]}") kernels=GPT2_PORTABLE_KERNELS=
    if (( portable )); then
        kernels=GPT2_PORTABLE_KERNELS=1
        # The portable sm_80 module has no wgmma kernels, so the wgmma tests
        # cannot run in this pass (they would skip); the first pass ran them,
        # and hopper_loads_the_wgmma_module checks the switch here.
        for t in $WGMMA_TESTS; do args+=(--skip "$t"); done
    fi
    local one rc c skipped failed
    one="$(mktemp)"
    # shellcheck disable=SC2086  # TEST_ARGS is a word list on purpose
    (cd "$ROOT/$pkg_dir" && env "$kernels" timeout "$TEST_TIMEOUT" "$bin" "${args[@]}" $TEST_ARGS) >"$one" 2>&1
    rc=$?
    cat "$one"
    { echo "######## $label (exit $rc)"; cat "$one"; } | tee -a "$PASS_LOG" >>"$TESTS_LOG"
    c="$(counts "$one")"
    skipped="$(skipped_tests "$one" | name_list)"
    failed="$(failed_tests "$one" | name_list)"
    if (( rc == 124 )); then
        fail "tests $label: timed out after ${TEST_TIMEOUT}s: $c"
    elif (( rc != 0 )); then
        fail "tests $label: exit $rc: $c; failed: ${failed:-?}"
    elif [[ -n "$skipped" && "${GPT2_REQUIRE_GPU:-}" == 1 ]]; then
        fail "tests $label: $c (GPT2_REQUIRE_GPU=1: a skip is a failure)"
    else
        note "tests $label: ok: $c"
    fi
    [[ -n "$skipped" ]] && note "  skipped: $skipped"
    rm -f "$one"
}

# A pass's line over all its test binaries.
pass_total() {
    note "tests, $1, all binaries: $(counts "$PASS_LOG")"
    rm -f "$PASS_LOG"
}

# tests.list: "<file> <package dir>"; like cargo, run each test binary from
# its package's directory (the repo root for tests/gpu and tests/cpu).
PASS_LOG="$(mktemp)"
while read -r name pkg_dir; do
    [[ -n "$name" ]] || continue
    run_tests "$name" "$name" "$pkg_dir" 0
done <"$GPU_OUT/tests.list"
pass_total "first pass"

# The same GPU tests with the portable sm_80 module forced: on a Hopper GPU
# the first pass ran the sm_90a module (wgmma matmuls), this one runs the
# mma.sync TF32 kernels and everything else from the portable PTX.
if [[ "$PORTABLE" == 1 ]]; then
    PASS_LOG="$(mktemp)"
    for name in $PORTABLE_TESTS; do
        pkg_dir="$(awk -v n="$name" '$1 == n {print $2}' "$GPU_OUT/tests.list")"
        if [[ -z "$pkg_dir" ]]; then
            fail "tests $name (portable): not in the bundle"
            continue
        fi
        run_tests "$name portable (GPT2_PORTABLE_KERNELS=1)" "$name" "$pkg_dir" 1
    done
    pass_total "portable pass"
fi

# ------------------------------------------------------- 3a. outside consumer
# examples/outside-consumer: a third party's kernel on gpu_kernels::device
# and one of our ops through gpu-host; it checks itself against the CPU and
# ends with "ok".
if [[ -x "$GPU_OUT/bin/outside-consumer" ]]; then
    banner "outside consumer (examples/outside-consumer)"
    if "$GPU_OUT/bin/outside-consumer" 2>&1 | tee "$OUT/consumer.log" | tail -n 1 | grep -qx ok; then
        note "outside consumer: ok"
    else
        cat "$OUT/consumer.log"
        fail "the outside consumer failed (see consumer.log)"
    fi
else
    fail "gpu-out/bin/outside-consumer is missing (rebuild the bundle)"
fi

# ---------------------------------------------------------------- 3b. programs
# The user-facing programs on the transformers checkpoint: the CLI streaming
# greedy text on the GPU (both precisions) and on the CPU reference, and
# perplexity on GPU vs CPU. Logged to programs.log; a non-zero exit fails.
PROG_LOG="$OUT/programs.log"
if (( ORACLE_OK )) && [[ -x "$GPU_OUT/bin/host" ]]; then
    banner "programs: CLI and perplexity on the transformers checkpoint"
    : >"$PROG_LOG"
    W="$ORACLE_DIR/model.safetensors"
    PROMPT="The quick brown fox"
    run_prog() {  # label, command...
        local label="$1"; shift
        { echo "######## $label: $*"; } >>"$PROG_LOG"
        if (cd "$ROOT" && timeout "$TEST_TIMEOUT" "$@") >>"$PROG_LOG" 2>&1; then
            note "program $label: ok"
        else
            fail "program $label: exit $? (see programs.log)"
        fi
        echo >>"$PROG_LOG"
    }
    run_prog "cli gpu fp32" "$GPU_OUT/bin/host" --weights "$W" -n 48 --temperature 0 "$PROMPT"
    run_prog "cli gpu tf32" "$GPU_OUT/bin/host" --weights "$W" -n 48 --temperature 0 --precision tf32 "$PROMPT"
    run_prog "cli gpu bf16" "$GPU_OUT/bin/host" --weights "$W" -n 48 --temperature 0 --precision bf16 "$PROMPT"
    run_prog "cli cpu" "$GPU_OUT/bin/host" --weights "$W" -n 48 --temperature 0 --cpu "$PROMPT"
    run_prog "cli gpu sampled batch" "$GPU_OUT/bin/host" --weights "$W" -n 32 --seed 7 "$PROMPT" "Once upon a time, in a land far away"
    # Decode speed as a user sees it (the decode goal's CLI figure): 512 tokens at
    # batch 1, greedy and sampled (default settings), and batch 8.
    run_prog "cli gpu 512 greedy" "$GPU_OUT/bin/host" --weights "$W" -n 512 --temperature 0 "$PROMPT"
    run_prog "cli gpu 512 sampled" "$GPU_OUT/bin/host" --weights "$W" -n 512 --seed 7 "$PROMPT"
    EIGHT=("$PROMPT" "Once upon a time" "In the beginning" "The weather today" "My favourite food is" "Rust is a language" "GPUs are fast because" "The capital of France")
    run_prog "cli gpu batch 8 greedy 256" "$GPU_OUT/bin/host" --weights "$W" -n 256 --temperature 0 "${EIGHT[@]}"
    run_prog "cli gpu 512 greedy bf16" "$GPU_OUT/bin/host" --weights "$W" -n 512 --temperature 0 --precision bf16 "$PROMPT"
    run_prog "cli gpu 512 sampled bf16" "$GPU_OUT/bin/host" --weights "$W" -n 512 --seed 7 --precision bf16 "$PROMPT"
    run_prog "cli gpu batch 8 greedy 256 bf16" "$GPU_OUT/bin/host" --weights "$W" -n 256 --temperature 0 --precision bf16 "${EIGHT[@]}"
    if [[ -x "$GPU_OUT/bin/perplexity" ]]; then
        run_prog "perplexity gpu" "$GPU_OUT/bin/perplexity" "$ROOT/tests/data/perplexity_sample.txt" --weights "$W" --window 256 --stride 128
        run_prog "perplexity cpu" "$GPU_OUT/bin/perplexity" "$ROOT/tests/data/perplexity_sample.txt" --weights "$W" --window 256 --stride 128 --cpu
        run_prog "perplexity gpu bf16" "$GPU_OUT/bin/perplexity" "$ROOT/tests/data/perplexity_sample.txt" --weights "$W" --window 256 --stride 128 --precision bf16
    fi
    grep -E 'tokens generated|perplexity|PPL' "$PROG_LOG" | tee -a "$SUMMARY"
fi

# ---------------------------------------------------------------- 3c. serve
# The server on the GPU engine: the real-client test (openai from the
# bundle's wheels, curl) on its tiny checkpoint, then (with the oracle's
# 124M checkpoint) the load test at rising concurrency, FP32 greedy,
# 256-token completions of ~32-token prompts; its JSON lines go to the
# summary. Logged to programs.log (the files that come back are few).
if [[ "$SERVE" == 1 ]]; then
    banner "serve: real clients and the load test on the GPU"
    PROG_LOG="$OUT/programs.log"
    if [[ ! -x "$GPU_OUT/bin/serve" || ! -d "$GPU_OUT/wheels" ]]; then
        fail "serve: gpu-out/bin/serve or gpu-out/wheels missing (rebuild the bundle)"
    else
        { echo "######## serve_openai_test (GPU)"; } >>"$PROG_LOG"
        if (cd "$ROOT" && SERVE_BIN_DIR="$GPU_OUT/bin" SERVE_BACKEND_ARGS="" OPENAI_WHEELS="$GPU_OUT/wheels" \
            timeout "$TEST_TIMEOUT" bash scripts/serve_openai_test.sh) >>"$PROG_LOG" 2>&1; then
            note "serve openai+curl test (GPU): ok"
        else
            fail "serve openai+curl test (GPU): exit $? (see programs.log)"
        fi
    fi
    # One load sweep: the server started with extra flags "$@", every
    # concurrency level of SERVE_LOAD_CLIENTS, then SIGTERM (exit 0 expected).
    load_sweep() {  # label, serve flags...
        local label="$1"; shift
        local W="$ORACLE_DIR/model.safetensors" err outf spid url=""
        err="$(mktemp)"; outf="$(mktemp)"
        "$GPU_OUT/bin/serve" --weights "$W" --port 0 --max-running "$SERVE_SLOTS" --max-queue 4096 "$@" \
            >"$outf" 2>"$err" &
        spid=$!
        for _ in $(seq 120); do
            url="$(head -n 1 "$outf")"
            [[ -n "$url" ]] && break
            kill -0 "$spid" 2>/dev/null || break
            sleep 1
        done
        if [[ -z "$url" ]]; then
            cat "$err" >>"$PROG_LOG"
            fail "serve load ($label): the server did not start (see programs.log)"
            return
        fi
        # ~32 tokens of prompt (serve_load appends " (i)").
        local prompt="The history of the city begins in the early years of the nineteenth century, when a small group of farmers and traders settled on the banks of the river"
        local clients requests line
        for clients in $SERVE_LOAD_CLIENTS; do
            requests=$(( clients * SERVE_LOAD_ROUNDS ))
            (( requests < SERVE_LOAD_MIN_REQUESTS )) && requests=$SERVE_LOAD_MIN_REQUESTS
            echo "######## serve_load ($label) clients $clients requests $requests" >>"$PROG_LOG"
            if line="$(timeout "$TEST_TIMEOUT" "$GPU_OUT/bin/serve_load" --url "$url" --clients "$clients" \
                    --requests "$requests" --max-tokens 256 --prompt "$prompt" --duration 120 2>>"$PROG_LOG")"; then
                echo "$line" >>"$PROG_LOG"
                note "serve load ($label): $line"
            else
                fail "serve load ($label) at $clients clients: exit $? (see programs.log)"
            fi
        done
        kill -TERM "$spid" 2>/dev/null
        timeout 60 tail --pid="$spid" -f /dev/null
        if wait "$spid"; then note "serve load ($label): server exited 0"; else fail "serve load ($label): server exit $?"; fi
        { echo "######## serve stderr ($label)"; tail -n 20 "$err"; } >>"$PROG_LOG"
    }
    if (( ORACLE_OK )) && [[ -x "$GPU_OUT/bin/serve_load" ]]; then
        load_sweep "defaults"
        load_sweep "prefill-chunk 64" --prefill-chunk 64
    fi
fi

# ---------------------------------------------------------------- 3d. several GPUs
# Tensor parallelism and data-parallel replicas against one GPU, timed in one
# process (host::bench::tp, host::bench::replicas): appended to bench.log.
if (( GPU_COUNT >= 2 )) && [[ "$MULTI_BENCH" == 1 ]]; then
    banner "several GPUs: bench tp replicas"
    if timeout "$MULTI_BENCH_TIMEOUT" "$GPU_OUT/bin/bench" tp replicas --json "$OUT/bench-multi.json" 2>&1 | tee -a "$BENCH_LOG"; then
        note "bench tp replicas: ok (bench-multi.json)"
        grep -E '^ *(prefill|decode|all-reduce| +[0-9]+ +[0-9.]+ +[0-9.]+$)' "$BENCH_LOG" | tail -n 24 | sed 's/^/  /' >>"$SUMMARY"
    else
        fail "bench tp replicas: failed (see bench.log)"
    fi
fi

# ---------------------------------------------------------------- 4. sanitizer
if [[ "$SANITIZE" == 1 ]]; then
    SANITIZER="$(command -v compute-sanitizer || true)"
    [[ -n "$SANITIZER" ]] || for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [[ -x "$c" ]] && SANITIZER="$c" && break
    done
    GPU_TEST="$GPU_OUT/tests/gpu"
    : >"$SAN_LOG"
    if [[ -z "$SANITIZER" ]]; then
        fail "sanitizer: compute-sanitizer not found"
    elif [[ ! -x "$GPU_TEST" ]]; then
        fail "sanitizer: $GPU_TEST missing"
    else
        for tool in $SANITIZER_TOOLS; do
            banner "compute-sanitizer --tool $tool"
            one="$(mktemp)"
            # Per-tool filters (MEMCHECK_FILTERS, RACECHECK_FILTERS, ...) override
            # SANITIZER_FILTERS: racecheck is much slower than memcheck.
            filters_var="${tool^^}_FILTERS"
            filters="${!filters_var:-$SANITIZER_FILTERS}"
            # One test thread: the tools serialise kernels anyway, and the
            # report is easier to read. --error-exitcode makes findings fail.
            # The first pass's kernel module (GPT2_PORTABLE_KERNELS cleared);
            # GPT2_REQUIRE_GPU=1 and the oracle's variables as exported in
            # step 3, and NOT_HERE left out as there.
            # shellcheck disable=SC2086  # filters is a word list on purpose
            env GPT2_PORTABLE_KERNELS= timeout "$SANITIZER_TIMEOUT" "$SANITIZER" --tool "$tool" --error-exitcode 99 \
                "$GPU_TEST" --include-ignored --test-threads=1 "${NOT_HERE[@]}" $filters >"$one" 2>&1
            rc=$?
            tail -n 40 "$one"
            { echo "######## $tool (exit $rc)"; cat "$one"; } >>"$SAN_LOG"
            summary_line="$(sanitizer_summary "$one")"
            errors="$(sanitizer_errors "$summary_line")"
            c="$(counts "$one")"
            skipped="$(skipped_tests "$one" | name_list)"
            # Everything that makes this tool's step fail, in words.
            problems=()
            (( rc == 124 )) && problems+=("timed out after ${SANITIZER_TIMEOUT}s (narrow ${tool^^}_FILTERS or raise SANITIZER_TIMEOUT)")
            (( rc == 99 )) && problems+=("findings (exit 99)")
            (( rc != 0 && rc != 99 && rc != 124 )) && problems+=("exit $rc")
            [[ -z "$summary_line" ]] && problems+=("no summary line from compute-sanitizer")
            [[ -n "$errors" ]] && (( errors > 0 && rc != 99 )) && problems+=("$errors errors")
            passed="$(count_of "$c" passed)"; failed="$(count_of "$c" failed)"
            (( ${passed:-0} + ${failed:-0} == 0 )) && problems+=("no test ran (do the filters match nothing?)")
            [[ -n "$skipped" && "${GPT2_REQUIRE_GPU:-}" == 1 ]] && problems+=("tests skipped (GPT2_REQUIRE_GPU=1: a skip is a failure)")
            if (( ${#problems[@]} == 0 )); then
                note "sanitizer $tool: ok: $summary_line; tests: $c"
                [[ -n "$skipped" ]] && note "  skipped: $skipped"
            else
                joined="$(printf '%s; ' "${problems[@]}")"
                fail "sanitizer $tool: ${joined}${summary_line:-no summary}; tests: $c"
                [[ -n "$skipped" ]] && note "  skipped: $skipped"
                failed="$(failed_tests "$one" | name_list)"
                [[ -n "$failed" ]] && note "  failed: $failed"
                sanitizer_findings "$one" | sed 's/^/  finding: /' | tee -a "$SUMMARY"
            fi
            rm -f "$one"
        done
    fi
fi

# ---------------------------------------------------------------- 5. bench
if [[ "$BENCH" == 1 ]]; then
    banner "bench: PyTorch reference"
    if PYTHONUNBUFFERED=1 timeout "$BENCH_TIMEOUT" python3 "$SCRIPTS/torch_bench.py" "$OUT/bench-torch.json" 2>&1 | tee -a "$BENCH_LOG"; then
        note "bench torch: ok (bench-torch.json)"
    else
        fail "bench torch: failed (see bench.log)"
    fi
    if [[ -x "$GPU_OUT/bin/accuracy" ]]; then
        banner "accuracy: the error table per precision"
        if (cd "$ROOT" && timeout "$BENCH_TIMEOUT" "$GPU_OUT/bin/accuracy" --json "$OUT/accuracy.json") 2>&1 | tee -a "$BENCH_LOG"; then
            note "accuracy: ok (accuracy.json)"
        else
            fail "accuracy: failed (see bench.log)"
        fi
    fi
    if [[ -x "$GPU_OUT/bin/bench" ]]; then
        banner "bench: Rust engine"
        # shellcheck disable=SC2086
        if timeout "$BENCH_TIMEOUT" "$GPU_OUT/bin/bench" $BENCH_RUST_ARGS 2>&1 | tee -a "$BENCH_LOG"; then
            note "bench rust: ok"
        else
            fail "bench rust: failed (see bench.log)"
        fi
    else
        note "bench rust: no bench binary in the bundle"
    fi
fi

rm -rf "$ORACLE_DIR"
note "runner: $((SECONDS - START)) s, $( ((FAILED)) && echo 'SOME STEPS FAILED' || echo 'all steps passed')"
echo
echo "================ summary ================"
cat "$SUMMARY"
exit "$FAILED"
