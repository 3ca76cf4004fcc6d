//! Tests that need no GPU: loaders, tokenizer, CPU reference, sampling, CLI.
mod checkpoint;
mod common;
mod cpu_reference;
mod tokenizer;
mod perplexity;
mod sampling;
mod oracle;
mod cli;
mod hub;
mod tune_cache;
