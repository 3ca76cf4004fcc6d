//! Tests that need no GPU: loaders, tokenizer, CPU reference, sampling, CLI.
//! Random inputs come from `crate::seed::rng()`: a failure prints its seed,
//! `GPT2_TEST_SEED` replays it. A test that cannot run here (the oracle test
//! without `GPT2_ORACLE_DIR`, the CLI tests without a `host` binary) prints
//! `SKIPPED: <test>: <reason>` through `crate::skip` (see there).

#[path = "../common/seed.rs"]
mod seed;
#[path = "../common/skip.rs"]
mod skip;

mod checkpoint;
mod cli;
mod common;
mod cpu_reference;
mod hub;
mod oracle;
mod parser_props;
mod perplexity;
mod prompt;
mod sample_twin;
mod sampling;
mod serve;
mod tensor_parallel;
mod tiny_oracle;
mod tokenizer;
mod tune_cache;
