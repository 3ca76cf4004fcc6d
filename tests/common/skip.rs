//! Visible skips, for every test binary: `tests/cpu` includes this file by
//! path as `crate::skip`; in `tests/gpu` each file that needs it includes it
//! as its own `skip` module, and so does `tests/gpu_oom.rs`.
//!
//! A test that cannot run where it is (no usable GPU, no transformers oracle,
//! no `host` binary, no wgmma kernels loaded) calls [`skip`], or a helper
//! built on it ([`gpu`], [`oracle_dir`], [`unless_required`]), and returns.
//! libtest still counts such a test as passed, so [`skip`] prints one line
//!
//! ```text
//! SKIPPED: <test name>: <reason>
//! ```
//!
//! straight to the process's stderr. libtest's output capture takes only what
//! `print!`/`eprint!` (and panics) write, not writes to `std::io::stderr()`,
//! so the line shows in `cargo test`'s output even when the test passes, and
//! reaches the logs of `scripts/gpu-runner.sh`, whose summary counts the lines
//! of each test binary and fails a pass with any. libtest prints (to stdout)
//! `test <name> ... ` before the result word, so the marker may land right
//! after that on the same line (another test's, with several test threads):
//! look for it anywhere in a line, e.g. to list the skips of a run,
//! `cargo test -- --include-ignored 2>&1 | grep -o 'SKIPPED: .*'`.
//!
//! Where the environment says the missing thing is required
//! (`GPT2_REQUIRE_GPU=1`, `GPT2_REQUIRE_ORACLE=1`: the GPU runner sets both),
//! the test panics instead of skipping.

#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

use host::gpu::Gpu;

/// What every skip line starts with (the GPU runner greps for it).
pub const MARKER: &str = "SKIPPED:";

/// Makes a missing GPU (and the `host` binary the CLI tests run) a failure.
pub const REQUIRE_GPU_ENV: &str = host::gpu::runtime::REQUIRE_GPU_ENV;
/// The directory written by `scripts/hf_reference.py`.
pub const ORACLE_DIR_ENV: &str = "GPT2_ORACLE_DIR";
/// Makes a missing oracle directory a failure.
pub const REQUIRE_ORACLE_ENV: &str = "GPT2_REQUIRE_ORACLE";

/// The name of the running test (libtest names each test's thread after it,
/// also with `--test-threads=1`).
fn test_name() -> String {
    std::thread::current().name().unwrap_or("<unnamed test>").to_string()
}

/// Prints `SKIPPED: <test>: <reason>` to the process's stderr, past
/// libtest's capture. The caller then returns from the test.
pub fn skip(reason: impl Display) {
    let line = format!("{MARKER} {}: {reason}\n", test_name());
    // One write of the whole line, so lines of parallel tests do not mix.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Whether the environment variable `var` is set to require something: set,
/// not empty and not `0`.
pub fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// [`skip`]s, or panics (fails the test) when `$require_env` is set.
pub fn unless_required(require_env: &str, reason: impl Display) {
    if required(require_env) {
        panic!("{require_env} is set, but {reason}");
    }
    skip(reason);
}

/// For GPU tests: GPU 0, or `None` after [`skip`]ping; panics instead
/// when `GPT2_REQUIRE_GPU=1`.
pub fn gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            unless_required(REQUIRE_GPU_ENV, format_args!("no usable GPU ({e})"));
            None
        }
    }
}

/// For the transformers oracle tests: `$GPT2_ORACLE_DIR`, or `None` after
/// [`skip`]ping; panics instead when `GPT2_REQUIRE_ORACLE=1`.
pub fn oracle_dir() -> Option<PathBuf> {
    match std::env::var_os(ORACLE_DIR_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => {
            unless_required(REQUIRE_ORACLE_ENV, format_args!("{ORACLE_DIR_ENV} is not set"));
            None
        }
    }
}
