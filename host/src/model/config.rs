//! GPT-2's hyper-parameters, read from the checkpoint.

/// Sizes that travel together through the whole program (never re-derived
/// from loose integers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelConfig {
    /// Longest sequence the position table covers (1024 for GPT-2).
    pub max_seq_len: usize,
    /// Real vocabulary (50257 for GPT-2).
    pub vocab_size: usize,
    /// Vocabulary padded for aligned matmuls (50304 in llm.c); rows past
    /// `vocab_size` are never sampled.
    pub padded_vocab_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// Model width C.
    pub channels: usize,
}

/// Layernorm epsilon of GPT-2.
pub const LAYERNORM_EPS: f32 = 1e-5;
/// llm.c pads the vocabulary to a multiple of this.
pub const VOCAB_PAD_MULTIPLE: usize = 128;
/// GPT-2's end-of-text token.
pub const EOT_TOKEN: u32 = 50256;

impl ModelConfig {
    /// GPT-2 124M ("gpt2").
    pub const GPT2_124M: ModelConfig = ModelConfig {
        max_seq_len: 1024,
        vocab_size: 50257,
        padded_vocab_size: 50304,
        num_layers: 12,
        num_heads: 12,
        channels: 768,
    };

    /// Size of one attention head (C / NH).
    pub fn head_size(&self) -> usize {
        self.channels / self.num_heads
    }

    /// `vocab_size` rounded up to [`VOCAB_PAD_MULTIPLE`].
    pub fn pad_vocab(vocab_size: usize) -> usize {
        vocab_size.div_ceil(VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    }

    /// Number of parameters of the padded model (llm.c's count).
    pub fn num_parameters(&self) -> usize {
        let (c, l) = (self.channels, self.num_layers);
        self.padded_vocab_size * c + self.max_seq_len * c + l * (12 * c * c + 13 * c) + 2 * c
    }
}
