//! The sizes of an op's call, named, in one `Copy` value: what the launch
//! wrappers of [`ops`](crate::ops) take instead of lists of bare `usize`s,
//! and what their CPU twins (the `host` crate's `cpu::ops`) take too, so a
//! wrapper and its twin read the same fields in the same argument position.
//!
//! These are host-side types: the kernels see sizes only through their
//! `#[repr(C)]` parameter structs in `gpu_kernels::params`, which the
//! wrappers fill from a shape (and which keep llm.c's field names: a
//! matmul's `n, c, oc` there are [`MatmulShape`]'s `m, k, n`).
//!
//! [`KvRows`] and [`LayernormWeights`] sit here for the same reason: they
//! name what an op and its twin take, buffers included.

/// A matmul `out[m, n] = inp[m, k] · weight[n, k]ᵀ (+ bias[n])`, weights
/// stored (out, in) like llm.c and PyTorch's `nn.Linear`.
///
/// The one order of the three sizes everywhere in this workspace, BLAS's
/// and the tune cache's `"M,N,K"`: `m` rows of the input and the output
/// (tokens), `n` output columns (out features, rows of `weight`), `k` the
/// inner size (in features).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulShape {
    /// Rows of `inp` and `out`.
    pub m: usize,
    /// Columns of `out`: rows of `weight`, entries of `bias`.
    pub n: usize,
    /// The inner size: columns of `inp` and of `weight`.
    pub k: usize,
}

impl MatmulShape {
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        MatmulShape { m, n, k }
    }

    /// The same matmul over `m` rows (the same weights, another batch).
    pub const fn with_rows(self, m: usize) -> Self {
        MatmulShape { m, ..self }
    }

    /// Elements of `out`: `m * n`.
    pub const fn out_len(self) -> usize {
        self.m * self.n
    }

    /// Elements of `inp`: `m * k`.
    pub const fn inp_len(self) -> usize {
        self.m * self.k
    }

    /// Elements of `weight`: `n * k`.
    pub const fn weight_len(self) -> usize {
        self.n * self.k
    }
}

/// `rows` independent rows of `c` channels each: the shape of the row-wise
/// ops (layernorm, the fused residual + layernorm, the per-row encoder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowShape {
    pub rows: usize,
    pub c: usize,
}

impl RowShape {
    pub const fn new(rows: usize, c: usize) -> Self {
        RowShape { rows, c }
    }

    /// Elements of a `[rows, c]` buffer.
    pub const fn len(self) -> usize {
        self.rows * self.c
    }

    /// Whether there is nothing to compute (no rows or no channels).
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// The encoder's call: `b` sequences of `t` positions from `pos0`, `c`
/// channels (`out` is `[b, t, c]`, token ids `[b, t]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EncoderShape {
    pub b: usize,
    pub t: usize,
    pub c: usize,
    /// Position of each sequence's first token.
    pub pos0: usize,
}

/// A decode step's rows of `qkv` stored into one layer's KV caches: `rows`
/// rows of `c` channels in `nh` heads, caches of `max_t` positions
/// (`kv_cache_store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCacheShape {
    pub rows: usize,
    pub c: usize,
    pub nh: usize,
    pub max_t: usize,
}

/// One layer's KV caches as the per-row decode ops address them: row `r` of
/// the call at position `pos[r]` of cache row `cache_row[r]` (`None`: row
/// `r`; the caches are `[rows][nh][max_t][c / nh]`). `C` is how the caches
/// are held: `&mut` where the op writes them (`kv_cache_store`), `&` where
/// it only reads them (`decode_attention`); `P` holds the `u32` positions
/// and cache rows (a device buffer, or `[u32]` for a CPU twin).
pub struct KvRows<'a, C, P: ?Sized> {
    pub k_cache: C,
    pub v_cache: C,
    pub pos: &'a P,
    pub cache_row: Option<&'a P>,
}

/// A layernorm's parameters: the `c` scales (`weight`) and shifts (`bias`)
/// applied after normalising each row. `T` holds them: a device buffer, or
/// `[f32]` for a CPU twin.
pub struct LayernormWeights<'a, T: ?Sized> {
    pub weight: &'a T,
    pub bias: &'a T,
}

/// A projection left as split-K partial sums (a matmul's first launch
/// alone, `matmul_tf32::matmul_forward_fp32_tc_partials`): `splits` slices
/// of `rows * c` floats in `partial`, added in slice order, and the `c`
/// floats of `bias` still to add. `T` as for [`LayernormWeights`].
pub struct SplitSums<'a, T: ?Sized> {
    pub partial: &'a T,
    pub splits: usize,
    pub bias: Option<&'a T>,
}

// By hand: a derive would ask `T: Clone`, which `[f32]` is not.
impl<T: ?Sized> Clone for LayernormWeights<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for LayernormWeights<'_, T> {}

/// A decode step's attention (`decode_attention`): `rows` queries, one per
/// row, of `c` channels in `nh` heads, each seeing its last `window` keys
/// (0: all); the caches' length is the workspace's `max_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeAttentionShape {
    pub rows: usize,
    pub c: usize,
    pub nh: usize,
    pub window: usize,
}

impl DecodeAttentionShape {
    /// Every query sees all its keys (no window).
    pub const fn new(rows: usize, c: usize, nh: usize) -> Self {
        DecodeAttentionShape { rows, c, nh, window: 0 }
    }
}

/// The logits a sampling call reads (`sample_forward`): `n` rows, each's
/// first `v` entries (the real vocabulary; any padding after them is never
/// read), row `i` starting at element `i * row_stride`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SampleShape {
    pub n: usize,
    pub v: usize,
    pub row_stride: usize,
}

/// The problem of one attention call: `b` sequences of `t` new positions
/// from `pos0`, caches of `max_t` positions, `c` channels in `nh` heads,
/// each query seeing its last `window` keys (0: all). Taken by the unfused
/// and the flash kernels' wrappers and by the CPU twin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionShape {
    pub b: usize,
    pub t: usize,
    pub pos0: usize,
    pub max_t: usize,
    pub c: usize,
    pub nh: usize,
    pub window: usize,
}

impl AttentionShape {
    /// Channels per head, `c / nh` (0 without heads).
    pub fn head_size(self) -> usize {
        self.c.checked_div(self.nh).unwrap_or(0)
    }
}
