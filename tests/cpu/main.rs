//! Tests that need no GPU: loaders, tokenizer, CPU reference, sampling, CLI.
mod checkpoint;
