#!/usr/bin/env bash
# Run the bundle made by scripts/gpu-bundle.sh on the GPU machine.
#
# Run from the repo root of the copied working tree, with gpu-out carried:
#   bash scripts/gpu-runner.sh
# The tests read workspace files (weights/gpt2 tokenizer files) relative to the
# repo root, which is why they run from there and not from gpu-out/.
#
# Steps (each one's failure is recorded, the others still run; the exit status
# is non-zero if any failed):
#   1. device: nvidia-smi, driver, GPU name
#   2. oracle: scripts/hf_reference.py writes a random-init GPT-2 checkpoint,
#      token ids and transformers' logits into a directory
#   3. tests: every test binary with --include-ignored (GPU tests are
#      #[ignore = "needs a GPU"] so that a machine without one reports them as
#      ignored) and GPT2_REQUIRE_GPU=1 (a test that cannot reach the GPU fails),
#      with GPT2_ORACLE_DIR + GPT2_REQUIRE_ORACLE=1 when step 2 succeeded;
#      then (PORTABLE=1) the GPU test binaries once more with
#      GPT2_PORTABLE_KERNELS=1, so a Hopper GPU runs the portable sm_80
#      module (the mma.sync TF32 path) end to end too
#   4. compute-sanitizer memcheck and racecheck over the GPU test binary
#   5. (BENCH=1) scripts/torch_bench.py and the Rust bench binary, if any
# Files written to $OUT (few on purpose: at most 8 come back):
#   summary.txt tests.log (both passes) sanitizer.log oracle.log programs.log bench.log
#   bench-torch.json bench-rust.json
#
# Knobs (environment), defaults keep the whole run under ~8 minutes:
#   GPU_OUT=gpu-out             the bundle
#   TEST_TIMEOUT=240            seconds per test binary
#   TEST_ARGS=                  extra libtest args for every test binary
#                               (after --include-ignored; e.g. a name filter)
#   PORTABLE=1                  0 skips the second pass with GPT2_PORTABLE_KERNELS=1
#   PORTABLE_TESTS="gpu gpu_oom"  test binaries of that pass
#   SANITIZE=1                  0 skips step 4
#   SANITIZER_TOOLS="memcheck racecheck synccheck"
#   SANITIZER_FILTERS=          libtest name filters for the sanitized run
#                               (space-separated; empty = the whole binary)
#   MEMCHECK_FILTERS=, RACECHECK_FILTERS=   per-tool filters, override the above
#   SANITIZER_TIMEOUT=300       seconds per sanitizer tool (racecheck took 190 s on an H200)
#   ORACLE=1                    0 skips step 2 (oracle tests then skip)
#   ORACLE_TIMEOUT=240
#   BENCH=0                     1 runs step 5
#   BENCH_TIMEOUT=420
#   BENCH_RUST_ARGS="all --json $OUT/bench-rust.json"   arguments for gpu-out/bin/bench
set -uo pipefail   # no -e: a failing step is recorded, and the next one runs

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
SANITIZER_TOOLS="${SANITIZER_TOOLS:-memcheck racecheck synccheck}"
SANITIZER_FILTERS="${SANITIZER_FILTERS:-}"
# memcheck: every GPU test of tests/gpu (the one that asks for terabytes on
# purpose lives in tests/gpu_oom, which the sanitizers do not run: its failed
# cuMemAlloc is the expected result, but memcheck counts API errors too).
# racecheck is ~50x slower: the kernels with shared memory and barriers, at
# sizes that finish in a few minutes.
MEMCHECK_FILTERS="${MEMCHECK_FILTERS-}"
RACECHECK_FILTERS="${RACECHECK_FILTERS-flash_attention::flash_prefill_tf32 flash_attention::flash_decode device:: matmul_tf32::matmul_tf32_awkward kernels::layernorm kernels::softmax kernels::attention_windowed kernels::argmax kernels::matmul_tiled_unaligned matmul_tf32::matmul_tf32_split_k kernels::matmul_split_k_explicit matmul_small::matmul_small_is_deterministic matmul_small::matmul_small_unaligned_operands decode::decode_attention_rows_at_different_positions decode::decode_graph_windowed}"
# synccheck: the decode kernels' barriers (sync_threads_or after early exits).
SYNCCHECK_FILTERS="${SYNCCHECK_FILTERS-decode::}"
export MEMCHECK_FILTERS RACECHECK_FILTERS SYNCCHECK_FILTERS
SANITIZER_TIMEOUT="${SANITIZER_TIMEOUT:-300}"
PORTABLE="${PORTABLE:-1}"
PORTABLE_TESTS="${PORTABLE_TESTS:-gpu gpu_oom}"
ORACLE="${ORACLE:-1}"
ORACLE_TIMEOUT="${ORACLE_TIMEOUT:-240}"
BENCH="${BENCH:-0}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-420}"
BENCH_RUST_ARGS="${BENCH_RUST_ARGS:-all --json $OUT/bench-rust.json}"

SUMMARY="$OUT/summary.txt"
TESTS_LOG="$OUT/tests.log"
SAN_LOG="$OUT/sanitizer.log"
ORACLE_LOG="$OUT/oracle.log"
BENCH_LOG="$OUT/bench.log"
: >"$SUMMARY"; : >"$TESTS_LOG"
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
note "device: ${DEVICE:-unknown}"
note "bundle: $(grep -m1 '^commit:' "$GPU_OUT/BUILD_INFO" 2>/dev/null || echo 'no BUILD_INFO')"
note "kernels: $(grep -m1 '^GPU_KERNELS_ARCH:' "$GPU_OUT/BUILD_INFO" 2>/dev/null || echo '?')"

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
        fail "oracle: hf_reference.py failed (see oracle.log); oracle tests run without it and skip"
    fi
fi

# ---------------------------------------------------------------- 3. tests
export GPT2_REQUIRE_GPU=1
if (( ORACLE_OK )); then
    export GPT2_ORACLE_DIR="$ORACLE_DIR" GPT2_REQUIRE_ORACLE=1
fi

# "test result: ok. 12 passed; 0 failed; 1 ignored; ..." -> "12 passed, 0 failed, 1 ignored"
counts() {
    grep -E '^test result:' "$1" | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d ignored", p, f, i}'
}

# One test binary: run it, log it, note its counts. Arguments: the label in
# the summary, the bundle's file name, the package dir, then extra
# environment assignments (VAR=value) for this run.
run_tests() {
    local label="$1" name="$2" pkg_dir="$3"; shift 3
    local bin="$GPU_OUT/tests/$name"
    banner "tests: $label (in $pkg_dir)"
    local one rc
    one="$(mktemp)"
    # --include-ignored: GPU tests are #[ignore = "needs a GPU"], so that
    # `cargo test` on a machine without one reports them as ignored.
    # shellcheck disable=SC2086  # TEST_ARGS is a word list on purpose
    (cd "$ROOT/$pkg_dir" && env "$@" timeout "$TEST_TIMEOUT" "$bin" --include-ignored $TEST_ARGS) >"$one" 2>&1
    rc=$?
    cat "$one"
    { echo "######## $label (exit $rc)"; cat "$one"; } >>"$TESTS_LOG"
    if (( rc == 0 )); then
        note "tests $label: ok, $(counts "$one")"
    elif (( rc == 124 )); then
        fail "tests $label: timed out after ${TEST_TIMEOUT}s, $(counts "$one")"
    else
        fail "tests $label: exit $rc, $(counts "$one"); failed: $(grep -E '^test .* FAILED$' "$one" | awk '{print $2}' | tr '\n' ' ')"
    fi
    rm -f "$one"
}

# tests.list: "<file> <package dir>"; like cargo, run each test binary from
# its package's directory (the repo root for tests/gpu and tests/cpu).
while read -r name pkg_dir; do
    [[ -n "$name" ]] || continue
    run_tests "$name" "$name" "$pkg_dir" GPT2_PORTABLE_KERNELS=
done <"$GPU_OUT/tests.list"

# The same GPU tests with the portable sm_80 module forced: on a Hopper GPU
# the first pass ran the sm_90a module (wgmma matmuls), this one runs the
# mma.sync TF32 kernels and everything else from the portable PTX. The wgmma
# tests skip here (printed); hopper_loads_the_wgmma_module checks the switch.
if [[ "$PORTABLE" == 1 ]]; then
    for name in $PORTABLE_TESTS; do
        pkg_dir="$(awk -v n="$name" '$1 == n {print $2}' "$GPU_OUT/tests.list")"
        if [[ -z "$pkg_dir" ]]; then
            fail "tests $name (portable): not in the bundle"
            continue
        fi
        run_tests "$name portable (GPT2_PORTABLE_KERNELS=1)" "$name" "$pkg_dir" GPT2_PORTABLE_KERNELS=1
    done
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
    run_prog "cli cpu" "$GPU_OUT/bin/host" --weights "$W" -n 48 --temperature 0 --cpu "$PROMPT"
    run_prog "cli gpu sampled batch" "$GPU_OUT/bin/host" --weights "$W" -n 32 --seed 7 "$PROMPT" "Once upon a time, in a land far away"
    # Decode speed as a user sees it (issue 13's CLI goal): 512 tokens at
    # batch 1, greedy and sampled (default settings), and batch 8.
    run_prog "cli gpu 512 greedy" "$GPU_OUT/bin/host" --weights "$W" -n 512 --temperature 0 "$PROMPT"
    run_prog "cli gpu 512 sampled" "$GPU_OUT/bin/host" --weights "$W" -n 512 --seed 7 "$PROMPT"
    EIGHT=("$PROMPT" "Once upon a time" "In the beginning" "The weather today" "My favourite food is" "Rust is a language" "GPUs are fast because" "The capital of France")
    run_prog "cli gpu batch 8 greedy 256" "$GPU_OUT/bin/host" --weights "$W" -n 256 --temperature 0 "${EIGHT[@]}"
    if [[ -x "$GPU_OUT/bin/perplexity" ]]; then
        run_prog "perplexity gpu" "$GPU_OUT/bin/perplexity" "$ROOT/tests/data/perplexity_sample.txt" --weights "$W" --window 256 --stride 128
        run_prog "perplexity cpu" "$GPU_OUT/bin/perplexity" "$ROOT/tests/data/perplexity_sample.txt" --weights "$W" --window 256 --stride 128 --cpu
    fi
    grep -E 'tokens generated|perplexity|PPL' "$PROG_LOG" | tee -a "$SUMMARY"
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
            # One test thread: the tools serialise kernels anyway, and the
            # report is easier to read. --error-exitcode makes findings fail.
            # shellcheck disable=SC2086
            # Per-tool filters (MEMCHECK_FILTERS, RACECHECK_FILTERS, ...) override
            # SANITIZER_FILTERS: racecheck is much slower than memcheck.
            filters_var="$(echo "$tool" | tr '[:lower:]' '[:upper:]')_FILTERS"
            filters="${!filters_var:-$SANITIZER_FILTERS}"
            timeout "$SANITIZER_TIMEOUT" "$SANITIZER" --tool "$tool" --error-exitcode 99 \
                "$GPU_TEST" --include-ignored --test-threads=1 $filters >"$one" 2>&1
            rc=$?
            tail -n 40 "$one"
            { echo "######## $tool (exit $rc)"; cat "$one"; } >>"$SAN_LOG"
            # The tool's own last word, e.g. memcheck "ERROR SUMMARY: 0 errors",
            # racecheck "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
            errors="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$one" | tail -n 1 | sed -E 's/^=+ *//')"
            errors="${errors:-no sanitizer summary}"
            tests_line="$(counts "$one")"
            if (( rc == 0 )); then
                note "sanitizer $tool: $errors; $tests_line"
            elif (( rc == 124 )); then
                fail "sanitizer $tool: timed out after ${SANITIZER_TIMEOUT}s ($errors; narrow SANITIZER_FILTERS or raise SANITIZER_TIMEOUT)"
            else
                fail "sanitizer $tool: exit $rc, $errors; $tests_line"
            fi
            rm -f "$one"
        done
    fi
fi

# ---------------------------------------------------------------- 5. bench
if [[ "$BENCH" == 1 ]]; then
    : >"$BENCH_LOG"
    banner "bench: PyTorch reference"
    if PYTHONUNBUFFERED=1 timeout "$BENCH_TIMEOUT" python3 "$SCRIPTS/torch_bench.py" "$OUT/bench-torch.json" 2>&1 | tee -a "$BENCH_LOG"; then
        note "bench torch: ok (bench-torch.json)"
    else
        fail "bench torch: failed (see bench.log)"
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
