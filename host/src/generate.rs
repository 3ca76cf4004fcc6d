//! One generation loop over a [`Backend`]; the CPU reference and the GPU
//! engine differ only in how they compute logits.

use crate::model::ModelConfig;

/// Which logits a forward call must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// Only the last position of each row (generation).
    Last,
    /// Every position (tests, perplexity).
    All,
}

/// Something that runs GPT-2 forward with a KV cache.
pub trait Backend {
    fn config(&self) -> &ModelConfig;

    /// Run `tokens` (`b` rows of `t` ids, row-major) at positions
    /// `pos0..pos0 + t` of every row, appending their keys and values to the
    /// KV cache, which must already hold positions `0..pos0` of these rows
    /// (`pos0 == 0` starts fresh). Errors (never panics) when `b` or
    /// `pos0 + t` exceed what the backend was built for, or an id is out of
    /// the vocabulary.
    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> anyhow::Result<()>;

    /// Logits of the last `forward`: `[b, 1, Vp]` for `Last`, `[b, t, Vp]` for `All`.
    fn logits(&mut self) -> anyhow::Result<Vec<f32>>;

    /// Greedy choice at the last position of each row of the last `forward`,
    /// over the real vocabulary only (padded entries are never chosen; ties
    /// go to the lowest id).
    fn argmax(&mut self) -> anyhow::Result<Vec<u32>>;
}
