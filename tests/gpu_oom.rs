//! The deliberate out-of-memory test, alone in its own test binary.
//!
//! It asks the GPU for terabytes on purpose. Beside other tests in one
//! process (libtest runs a binary's tests on parallel threads) its failed
//! allocations raced with theirs: on an H200 a 17.6 MB allocation of
//! `kernels::matmul_matches_cpu_all_kernels_and_edges` once failed with
//! CUDA_ERROR_OUT_OF_MEMORY while it ran. A test binary of one
//! test never runs beside anything: cargo runs test binaries one after
//! another, and so does `scripts/gpu-runner.sh`. Keep tests that exhaust or
//! nearly exhaust GPU memory here, not in `tests/gpu`.

#[path = "common/skip.rs"]
mod skip;

use host::gpu::engine::{GpuEngine, Precision};
use host::model::DType;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::{llmc_bytes, tiny_config};

#[test]
#[ignore = "needs a GPU"]
fn out_of_memory_is_an_error_that_says_how_much() {
    let Some(gpu) = skip::gpu() else { return };
    let cfg = tiny_config();
    let ck = Checkpoint::from_bytes(
        llmc_bytes(&cfg, 1, DType::F32).unwrap(),
        "random.bin",
        Some(cfg.num_heads),
    )
    .unwrap();
    let w = ck.weights().unwrap();
    // A batch so large the logits alone need terabytes.
    let err = match GpuEngine::new(gpu, &w, 1 << 22, cfg.max_seq_len, Precision::Fp32) {
        Ok(_) => panic!("allocating terabytes succeeded"),
        Err(e) => format!("{e:#}"),
    };
    println!("{err}");
    assert!(err.contains("MiB"), "{err}");
}
