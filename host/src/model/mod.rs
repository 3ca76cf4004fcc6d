//! The model's description: its shape ([`ModelConfig`]) and its parameters as
//! typed views into the memory-mapped checkpoint ([`Weights`]), handed out
//! from where parsing the checkpoint found them ([`Layout`]).
pub mod config;
pub mod weights;

pub use config::ModelConfig;
pub use weights::{DType, Layer, LayerWeights, Layout, Tensor, TensorLayout, Weights};
pub mod checkpoint;
pub mod fixtures;
pub mod format;
pub mod llmc;
pub mod safetensors;
pub use checkpoint::{Checkpoint, CheckpointError, Format, FormatError};
