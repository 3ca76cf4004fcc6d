//! GPT-2 inference on the GPU with kernels written in Rust.
pub mod bench;
pub mod cli;
pub mod cpu;
pub mod generate;
pub mod gpu;
pub mod hub;
pub mod model;
pub mod perplexity;
pub mod prompt;
pub mod sample;
pub mod serve;
pub mod tokenizer;
pub mod tp;
