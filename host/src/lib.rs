//! GPT-2 inference on the GPU with kernels written in Rust.
pub mod gpu;
pub mod model;
pub mod generate;
pub mod cpu;
pub mod sample;
pub mod hub;
pub mod tokenizer;
pub mod perplexity;
pub mod bench;
pub mod cli;
