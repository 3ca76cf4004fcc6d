//! The tensor-core prefill kernels' shared body (`flash_prefill_tc`): one
//! loop over K/V tiles for every operand format ([`TcFormat`]: TF32 in
//! `prefill_tf32`, bf16 in `prefill_bf16`). The tiling notes are in the
//! parent module; what the body does:
//! - 8 warps per block. `kv_split` 1: 128 query rows, each warp scores both
//!   32-key halves of every tile (each tile feeds 128 queries: half the L2
//!   traffic of 64-row tiles, which matters at B=8). `kv_split` 2: 64 rows,
//!   the two warps of a row slice take one half each and merge their
//!   (max, sum, acc) through shared memory at the end (twice the blocks and
//!   half the longest chain, which matters at B=1 where 128-row tiles would
//!   leave SMs idle). The host picks (params:
//!   FLASH_TF32_SPLIT_BELOW_BLOCKS_PER_SM).
//! - The warp step exists twice: with the causal/window mask (steps that
//!   straddle a boundary) and without any mask code (the common step).
//!   Index arithmetic is u32: 64-bit compares doubled the integer work.
//! - 1-D grid, heaviest query tiles (latest positions: most causal keys) of
//!   every head first, so the light tiles fill the tail of the last wave.
//! - Key chunks (`chunk_tiles`, the host's choice for grids short of
//!   blocks): a long query tile's keys go to several blocks, consecutive
//!   tiles each; every block leaves its state (max, sum, accumulators per
//!   lane) in `part_state`, and the last to arrive on the tile's counter
//!   merges them in chunk order and stores the output (flash-decoding's
//!   split, applied to the few long tiles of a batch-1 prefill).
//! - A K/V ring of `TcFormat::STAGES` tiles in the format's own element
//!   (TF32: f32, bf16: bf16, each as the cache keeps it) filled by
//!   `cp.async`, one barrier per tile; before that barrier each thread
//!   readies the chunks it copied for the format's products
//!   ([`TcFormat::prepare`]: TF32 rounds them in place, bf16 has nothing to
//!   do), so the MMA loops read ready operands.
//! - A TF32 call from position 0 (`kv_from_qkv`) reads K/V tiles straight
//!   from `qkv` (row stride 3C) and each block copies its own query rows' K/V
//!   into the caches, so no separate store kernel runs before it. The bf16
//!   kernel reads the (bf16) cache only: half the bytes of f32 `qkv` rows,
//!   copied as they are; its caller fills the cache first.
//! - Scores are S columns 2t, 2t+1 of each 8-key n-tile (the m16n8 C
//!   fragment) in both formats: key `8n + 2t + e` of the 32-key step, which
//!   the masks rely on.

use super::{BK, DIM_STEPS, HS, STRIDE, VEC, VECS_PER_ROW, WARP_ROWS, ld4, softmax_base};
use crate::device::math::{exp2_approx, fma};
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group};
use crate::device::shared::dynamic_shared_align16;
use crate::device::unroll;
use crate::device::warp::shfl_xor_f32;
use crate::device::{
    F32Storage, WARP_SIZE, atomic_add_acq_rel_u32, block_idx_x, lane_id, sync_threads, sync_threads_or, thread_fence,
    thread_idx_x, warp_id,
};
use crate::ops::vec4::load_cg;
use crate::params::flash_attention::*;

pub(super) const T_THREADS: usize = FLASH_TF32_THREADS as usize;
pub(super) const T_WARPS: usize = T_THREADS / WARP_SIZE as usize;
/// Keys of one warp step (a half tile) and its 8-key blocks.
pub(super) const SUB_K: usize = FLASH_TF32_SUB_KEYS as usize;
/// Floats one lane hands over in a merge (the kv_split one through shared
/// memory, the key chunks' through `part_state`): acc (32), m (2), l (2).
const MERGE_VALS: usize = FLASH_PREFILL_LANE_STATE as usize;
const _: () = assert!(MERGE_VALS == DIM_STEPS * 4 + 4);
const _: () = assert!(FLASH_PREFILL_BLOCK_STATE as usize == T_WARPS * MERGE_VALS * WARP_SIZE as usize);
/// 16-byte K (and V) chunks per thread when a block stores its own rows into
/// the caches (`kv_from_qkv`): at most `ROWS_MAX` rows of `VECS_PER_ROW`.
const STORE_CHUNKS_PER_THREAD: usize = FLASH_TF32_ROWS_MAX as usize * VECS_PER_ROW / T_THREADS;
const _: () = assert!(STORE_CHUNKS_PER_THREAD * T_THREADS == FLASH_TF32_ROWS_MAX as usize * VECS_PER_ROW);
const _: () = assert!((BK * VECS_PER_ROW).is_multiple_of(T_THREADS));
const _: () = assert!(
    STORE_CHUNKS_PER_THREAD == 8,
    "the store loops are unrolled 8 times (`unroll!`)"
);
const _: () = assert!(FLASH_TF32_ROWS_MAX as usize == T_WARPS * WARP_ROWS);
const _: () = assert!(BK / SUB_K == 2 && SUB_K == 32, "a tile is two 32-key warp steps");
const _: () = assert!(
    BK * VECS_PER_ROW == T_THREADS * T_COPY_BATCH && T_THREADS.is_multiple_of(VECS_PER_ROW),
    "each thread copies one batch of T_COPY_BATCH chunks of a tile, whole rows per batch step"
);
const _: () = assert!(
    FLASH_TF32_KV_SPLIT_MAX == 2,
    "the merge below hands one state per slice over"
);
const _: () = assert!(HS == 64, "the QKᵀ and PV lane orders are written for 64 dims");
/// Bytes of the kv_split merge area (every warp but part 0 of each slice),
/// which reuses the K/V ring: each format's ring is at least this large.
pub(super) const MERGE_BYTES: usize =
    (T_WARPS - T_WARPS / FLASH_TF32_KV_SPLIT_MAX as usize) * MERGE_VALS * WARP_SIZE as usize * 4;

/// One 32-key warp step's operands: the K and V stages of a tile (readied by
/// [`TcFormat::prepare`], published), of which the step reads rows
/// `32 * sub ..`.
#[derive(Clone, Copy)]
pub(super) struct Sub {
    pub(super) k: *const u8,
    pub(super) v: *const u8,
    pub(super) sub: u32,
}

/// Where a tile's K and V rows come from: the caches (rows of `HS`
/// elements), or (TF32 from position 0) `qkv`'s rows of `3C` floats.
#[derive(Clone, Copy)]
pub(super) struct KvRows<E> {
    pub(super) k: *const E,
    pub(super) v: *const E,
    /// Elements from one row to the next.
    pub(super) stride: u32,
}

/// The operand format of a tensor-core prefill kernel: how Q becomes A
/// fragments, how a landed K/V stage is readied, the warp step, and where
/// each output dim of the accumulators goes.
pub(super) trait TcFormat {
    /// Tiles of the K/V ring (2 or 3): `STAGES - 1` load while one is used.
    const STAGES: usize;
    /// Bytes of one ring tile (K or V), a multiple of 16.
    const TILE_BYTES: usize;
    /// Whether the format can read K/V from `qkv` (`kv_from_qkv`); then
    /// [`TcFormat::Cache`] is f32, as `qkv` is.
    const FROM_QKV: bool;
    /// How the KV cache keeps its values (f32, or bf16 bits).
    type Cache: F32Storage;
    /// A warp's Q fragments (rows g and g+8 of its 16).
    type Q;

    /// The fragments of query rows `g` (`qa`) and `g + 8` (`qb`) for lane
    /// quad position `tq`; a null row is past the last query (zeros).
    ///
    /// # Safety
    /// A non-null row is `HS` readable floats, 16-byte aligned.
    unsafe fn q(qa: *const f32, qb: *const f32, tq: u32) -> Self::Q;

    /// Issue this thread's `cp.async` copies of K/V rows `key0..key0 + BK`
    /// from `src` into the stages `k`, `v` (rows at or past `n_keys`
    /// zero-filled, never read).
    ///
    /// # Safety
    /// `k`, `v` are ring stages of [`TcFormat::TILE_BYTES`] that no warp
    /// reads until the barrier after these copies land; `src` rows
    /// `0..n_keys` (`n_keys >= 1`) are readable, 16-byte aligned.
    unsafe fn load(k: *mut u8, v: *mut u8, src: KvRows<Self::Cache>, key0: u32, n_keys: u32);

    /// Ready this thread's landed copies at the stages `k`, `v` for
    /// [`TcFormat::attend`], in place, before the barrier that publishes
    /// them.
    ///
    /// # Safety
    /// The copies have landed; only this thread touches its chunks until the
    /// barrier.
    unsafe fn prepare(p: &FlashAttentionParams<Self::Cache>, k: *mut u8, v: *mut u8);

    /// One warp step: the warp's 16 rows against the 32 keys of `at`: S =
    /// QKᵀ, the mask (`MASK`: key column `kk` of row r is visible iff
    /// `d0[r] - kk < lim[r]`, u32 wrapping, where `d0[r]` = the row's
    /// position minus the step's first key minus 2t and `kk = 8n + e`),
    /// online softmax, O += PV.
    ///
    /// # Safety
    /// `at` names a readied, published stage.
    unsafe fn attend<const MASK: bool>(
        st: &mut RowState,
        q: &Self::Q,
        at: Sub,
        d0: [u32; 2],
        lim: [u32; 2],
        scale: f32,
    );

    /// Store row `g + 8r`'s outputs (`acc` entries `2r`, `2r + 1` of every
    /// n-tile, times `inv`) into its head slice, element `at` of the output
    /// (`p.out`, or where the format allows `p.out_bf16`).
    ///
    /// # Safety
    /// `at..at + HS` lies inside the output, `at` a multiple of `HS`.
    unsafe fn store(
        p: &FlashAttentionParams<Self::Cache>,
        at: usize,
        acc: &[[f32; 4]; DIM_STEPS],
        r: usize,
        inv: f32,
        tq: u32,
    );
}

/// The online softmax of one warp step, between S and PV: mask (`MASK`),
/// row max over the quad, rescale of the running sum and accumulators, and
/// the probabilities `p = exp2(s * scale - base)` in place of the scores
/// (masked: 0), added to the running sums. Shared by every format.
#[inline(always)]
pub(super) fn online_softmax<const MASK: bool>(
    st: &mut RowState,
    s: &mut [[f32; 4]; SUB_K / 8],
    d0: [u32; 2],
    lim: [u32; 2],
    scale: f32,
) {
    let mut mx = [f32::NEG_INFINITY; 2];
    unroll!(n < 4 => {
        for (e, x) in s[n].iter_mut().enumerate() {
            let r = e / 2;
            if MASK && d0[r].wrapping_sub((n * 8 + (e & 1)) as u32) >= lim[r] {
                *x = f32::NEG_INFINITY;
            }
            mx[r] = mx[r].max(*x);
        }
    });
    // A row lives on the 4 lanes of a quad.
    let mut neg_base = [0f32; 2];
    let mut alpha = [0f32; 2];
    for r in 0..2 {
        let mut x = mx[r];
        x = x.max(shfl_xor_f32(x, 1));
        x = x.max(shfl_xor_f32(x, 2));
        let m_new = st.m[r].max(x * scale);
        let base = softmax_base(m_new);
        alpha[r] = exp2_approx(st.m[r] - base);
        neg_base[r] = -base;
        st.m[r] = m_new;
        st.l[r] *= alpha[r];
    }
    // p = exp2(s*scale - base): one FMA per score; masked -inf gives 0.
    unroll!(n < 4 => {
        for (e, x) in s[n].iter_mut().enumerate() {
            *x = exp2_approx(fma(*x, scale, neg_base[e / 2]));
            st.l[e / 2] += *x;
        }
    });
    unroll!(dt < 8 => {
        for (e, x) in st.acc[dt].iter_mut().enumerate() {
            *x *= alpha[e / 2];
        }
    });
}

/// Which 16-byte chunks of a 64x64 K/V tile one thread copies (and rounds):
/// thread `tid` of the block takes column chunk `tid % 16` of rows
/// `tid / 16 + i * threads / 16`, `i < 4 * passes`.
#[derive(Clone, Copy)]
pub(super) struct TileCopy {
    /// First row, and the row step between this thread's chunks.
    pub(super) row: u32,
    pub(super) row_step: u32,
    /// Float column of the chunk.
    pub(super) col: u32,
    /// Batches of [`T_COPY_BATCH`] chunks per tile (1 or 2).
    pub(super) passes: u32,
}

impl TileCopy {
    /// This thread's chunks of an f32 tile.
    #[inline(always)]
    pub(super) fn f32_tile() -> Self {
        let (gt, gtid) = (T_THREADS as u32, thread_idx_x());
        TileCopy {
            row: gtid / VECS_PER_ROW as u32,
            row_step: gt / VECS_PER_ROW as u32,
            col: (gtid % VECS_PER_ROW as u32) * VEC as u32,
            passes: (BK * VECS_PER_ROW) as u32 / gt / T_COPY_BATCH as u32,
        }
    }

    /// Tile row of this thread's chunk `i < T_COPY_BATCH` of pass `pass`.
    #[inline(always)]
    pub(super) fn row_of(self, pass: u32, i: usize) -> u32 {
        self.row + (pass * T_COPY_BATCH as u32 + i as u32) * self.row_step
    }
}

/// The lane's four 16-byte vectors of a query row's head slice at float
/// offsets `at` (zeros for a null row: past the last query), the raw
/// material of a format's Q fragments.
///
/// # Safety
/// A non-null `row` holds `HS` readable floats, 16-byte aligned; every
/// `at[i] + 4 <= HS` is a multiple of 4.
#[inline(always)]
pub(super) unsafe fn q_vectors(row: *const f32, at: [usize; 4]) -> [[f32; VEC]; 4] {
    if row.is_null() {
        return [[0.0; VEC]; 4];
    }
    // SAFETY: the caller's contract: four aligned vectors inside the slice.
    unsafe { at.map(|o| ld4(row.add(o))) }
}

/// Chunks per K (or V) tile that one copy pass of a thread handles; a
/// rounding pass holds one batch of K and one of V in registers.
pub(super) const T_COPY_BATCH: usize = 4;

/// Issue this thread's `cp.async` copies of K/V tile rows `key0..key0+64`
/// (rows at or past `n_keys` are zero-filled, never read) from rows of
/// `src_stride` floats.
///
/// # Safety
/// `dst` is a shared tile of [`TILE`] floats; `src` holds K or V rows of
/// `HS` floats every `src_stride` floats (16-byte aligned), rows
/// `0..n_keys` (`n_keys >= 1`) readable.
#[inline(always)]
pub(super) unsafe fn load_tile_f32(
    dst: *mut f32,
    src: *const f32,
    src_stride: u32,
    key0: u32,
    n_keys: u32,
    cp: TileCopy,
) {
    for pass in 0..cp.passes {
        unroll!(i < 4 => {
            let r = cp.row_of(pass, i);
            let key = key0 + r;
            let valid = key < n_keys;
            // An invalid row copies 0 bytes; its source address is still kept in bounds.
            let src_row = if valid { key } else { n_keys - 1 };
            // SAFETY: r < BK, cp.col + 4 <= HS <= STRIDE: 16 aligned bytes of the caller's
            // stage; `src_row` < n_keys is in the cache plane; invalid rows copy 0 bytes.
            unsafe {
                cp_async_16_zfill(
                    dst.add((r * STRIDE as u32 + cp.col) as usize),
                    src.add((src_row * src_stride + cp.col) as usize),
                    if valid { 16 } else { 0 },
                );
            }
        });
    }
}

/// Online-softmax state of one warp's 16 rows (two per lane: g and g+8).
pub(super) struct RowState {
    /// Running max, log2 units.
    pub(super) m: [f32; 2],
    /// Running sum of this lane's columns (quad-reduced at the end).
    pub(super) l: [f32; 2],
    /// O fragment, unnormalised: `DIM_STEPS` n-tiles of 8 output dims, in
    /// the order the format's PV product gives them.
    pub(super) acc: [[f32; 4]; DIM_STEPS],
}

impl RowState {
    /// The state of the same rows over other keys, value `v < MERGE_VALS`
    /// of this lane read by `at(v)`: accumulators `4 dt + e`, then the two
    /// maxima and the two sums ([`RowState::put`]'s order).
    #[inline(always)]
    fn get(at: impl Fn(usize) -> f32) -> Self {
        let mut o = RowState {
            m: [0.0; 2],
            l: [0.0; 2],
            acc: [[0.0; 4]; DIM_STEPS],
        };
        unroll!(dt < 8 => {
            for e in 0..4 {
                o.acc[dt][e] = at(4 * dt + e);
            }
        });
        for r in 0..2 {
            o.m[r] = at(4 * DIM_STEPS + r);
            o.l[r] = at(4 * DIM_STEPS + 2 + r);
        }
        o
    }

    /// Hand this lane's values to `put(v, value)` in [`RowState::get`]'s order.
    #[inline(always)]
    fn put(&self, put: impl Fn(usize, f32)) {
        unroll!(dt < 8 => {
            for e in 0..4 {
                put(4 * dt + e, self.acc[dt][e]);
            }
        });
        for r in 0..2 {
            put(4 * DIM_STEPS + r, self.m[r]);
            put(4 * DIM_STEPS + 2 + r, self.l[r]);
        }
    }

    /// Fold in the state of the same rows over other keys, its value `v`
    /// read by `at(v)` ([`RowState::get`]'s order), one accumulator at a
    /// time (either state may have seen no key: max -inf, sums 0).
    #[inline(always)]
    fn merge(&mut self, at: impl Fn(usize) -> f32) {
        let mut a = [0f32; 2];
        let mut b = [0f32; 2];
        for r in 0..2 {
            let (m2, l2) = (at(4 * DIM_STEPS + r), at(4 * DIM_STEPS + 2 + r));
            let m_new = self.m[r].max(m2);
            let base = softmax_base(m_new);
            a[r] = exp2_approx(self.m[r] - base);
            b[r] = exp2_approx(m2 - base);
            self.l[r] = self.l[r] * a[r] + l2 * b[r];
            self.m[r] = m_new;
        }
        unroll!(dt < 8 => {
            for e in 0..4 {
                self.acc[dt][e] = fma(self.acc[dt][e], a[e / 2], at(4 * dt + e) * b[e / 2]);
            }
        });
    }
}

/// The tensor-core prefill body (see the module docs), its operand format
/// `F`. Index arithmetic is u32 (the host checks every buffer index fits):
/// 64-bit compares and products doubled the integer work of the hot loop.
///
/// # Safety
/// As for the kernels that call it (`attention_forward_flash_tf32`,
/// `attention_forward_flash_bf16`), with dynamic shared memory for the ring
/// of `F::STAGES` K and V tiles of `F::TILE_BYTES`.
#[inline(always)]
pub(super) unsafe fn flash_prefill_tc<F: TcFormat>(p: &FlashAttentionParams<F::Cache>) {
    let (t, c, nh, b, max_t, pos0, window) = (p.t, p.c, p.nh, p.b, p.max_t, p.pos0, p.window);
    let (hs, bk, rows_w) = (HS as u32, BK as u32, WARP_ROWS as u32);
    let lane = lane_id();
    let warp = warp_id();
    let (g, tq) = (lane / 4, lane % 4);
    // kv_split s: T_WARPS/s row slices of 16 rows; warp w works on slice
    // w % slices with part w / slices of the keys: at kv_split 2 each part
    // takes one 32-key half of every tile, at kv_split 1 a warp takes both.
    let split = if p.kv_split == 2 { 2 } else { 1 };
    let slices = T_WARPS as u32 / split;
    let bq = slices * rows_w;
    let (slice, part) = (warp % slices, warp / slices);
    let (gt, gtid) = (T_THREADS as u32, thread_idx_x());
    let (sub_lo, sub_hi) = if split == 1 { (0, 2) } else { (part % 2, part % 2 + 1) };

    // 1-D grid, heaviest (latest) query tiles of all (head, row) pairs
    // first; with key chunks (`chunk_tiles`), a query tile's pairs take
    // `chunks` consecutive blocks each, one per chunk of its keys.
    // (`max(1)`: the launch guarantees nh, b >= 1; it spares the panic paths.)
    let lin = block_idx_x();
    let (nh1, pairs) = (nh.max(1), (nh * b).max(1));
    let q_tiles = t.div_ceil(bq);
    let (mut q_tile, mut rest, mut chunks) = (q_tiles - 1, lin, 1);
    if p.chunk_tiles == 0 {
        q_tile -= lin / pairs;
        rest = lin % pairs;
    } else {
        // Walk the query tiles from the last to the block's (at most
        // `t / bq` steps of scalar arithmetic).
        loop {
            // (`max(1)`: a tile has at least one key tile; it spares the panic paths.)
            chunks = flash_prefill_chunks(flash_prefill_key_tiles(q_tile, bq, t, pos0, window), p.chunk_tiles).max(1);
            if rest < pairs * chunks || q_tile == 0 {
                break;
            }
            rest -= pairs * chunks;
            q_tile -= 1;
        }
    }
    let (pair, chunk) = (rest / chunks, rest % chunks);
    let (h, bi) = (pair % nh1, pair / nh1);
    // With chunks: the tile's first block, and its (query tile, pair)
    // counter, in the unsplit grid's order (worked out here, so that only
    // these live across the loop).
    let (first_block, unit) = (lin - chunk, (q_tiles - 1 - q_tile) * pairs + pair);

    let q0 = q_tile * bq;
    let q_rows = bq.min(t - q0);
    // Absolute positions of the block's first and last query.
    let (p_min, p_max) = (pos0 + q0, pos0 + q0 + q_rows - 1);
    let key_lo = if window > 0 {
        (p_min + 1).saturating_sub(window)
    } else {
        0
    };
    // The query tile's key tiles (`flash_prefill_key_tiles`), and this
    // chunk's share of them: consecutive, balanced, at least one each
    // (chunks <= the tile count).
    let (first_tile, all_tiles) = (key_lo / bk, flash_prefill_key_tiles(q_tile, bq, t, pos0, window));
    let tile0 = first_tile + chunk * all_tiles / chunks;
    let n_tiles = first_tile + (chunk + 1) * all_tiles / chunks - tile0;
    let n_keys = p_max + 1; // keys past it are zero-filled, and masked

    // SAFETY: (whole body) the launch provides the dynamic shared memory
    // of the format: K stages | V stages (16-byte aligned rows); the
    // kv_split merge reuses them after the loop.
    let smem = unsafe { dynamic_shared_align16::<u8>() };
    const {
        assert!(F::STAGES == 2 || F::STAGES == 3);
        assert!(F::TILE_BYTES.is_multiple_of(16));
        assert!(
            MERGE_BYTES <= 2 * F::STAGES * F::TILE_BYTES,
            "the merge area fits in the ring"
        );
        assert!(
            !F::FROM_QKV || core::mem::size_of::<F::Cache>() == 4,
            "qkv rows are f32"
        );
    };
    let k_s = smem;
    // SAFETY: the V stages follow the STAGES K stages.
    let v_s = unsafe { k_s.add(F::STAGES * F::TILE_BYTES) };
    let plane = ((bi * nh + h) * max_t * hs) as usize;
    // Where K/V rows come from: the caches, or (`kv_from_qkv`, formats that
    // can: this call fills them from position 0) this call's own `qkv`
    // rows, whose K/V the block also stores into the caches below (no
    // separate store kernel).
    let from_qkv = F::FROM_QKV && p.kv_from_qkv != 0;
    let row0 = (bi * t * 3 * c + h * hs) as usize;
    // SAFETY: row0 is row (bi, 0)'s head-h q columns; its K and V columns (+c, +2c)
    // are inside qkv's 3c-float rows.
    let (k_g, v_g, kv_stride) = unsafe { (p.qkv.add(row0 + c as usize), p.qkv.add(row0 + 2 * c as usize), 3 * c) };
    let src = if from_qkv {
        // `FROM_QKV`: the cache's elements are f32 (asserted above), as qkv's.
        KvRows {
            k: k_g.cast::<F::Cache>(),
            v: v_g.cast::<F::Cache>(),
            stride: kv_stride,
        }
    } else {
        // SAFETY: the row's (bi, h) plane of max_t * hs elements lies inside each cache.
        unsafe {
            KvRows {
                k: p.k_cache.add(plane).cast_const(),
                v: p.v_cache.add(plane).cast_const(),
                stride: hs,
            }
        }
    };
    // SAFETY: stage < STAGES: inside the K/V rings, read by no warp until the barrier after
    // the copies land; keys below n_keys are readable rows of `src`.
    let load_kv = |i: u32, stage: u32| unsafe {
        let at = stage as usize * F::TILE_BYTES;
        F::load(k_s.add(at), v_s.add(at), src, (tile0 + i) * bk, n_keys);
    };
    // STAGES - 1 tiles in flight from the start (commit group i holds tile
    // i; maybe empty).
    for i in 0..F::STAGES as u32 - 1 {
        if i < n_tiles {
            load_kv(i, i);
        }
        cp_async_commit();
    }

    if from_qkv && chunk == 0 {
        // Keys q0..q0 + q_rows (pos0 = 0) are this block's own query rows
        // (stored by the tile's first chunk only):
        // copy their K and V into the caches, all loads of a thread before
        // its stores (they mostly hit L2: the tile copies read the same rows).
        let chunks = q_rows * VECS_PER_ROW as u32;
        let mut kv = [[[0f32; VEC]; 2]; STORE_CHUNKS_PER_THREAD];
        unroll!(j < 8 => {
            let i = gtid + j as u32 * gt;
            if i < chunks {
                let (r, col) = (q0 + i / VECS_PER_ROW as u32, (i % VECS_PER_ROW as u32) * VEC as u32);
                let src = (r * kv_stride + col) as usize;
                // SAFETY: r < q0 + q_rows <= t rows of kv_stride floats, col + 4 <= HS: inside
                // the source, 16-byte aligned.
                kv[j] = unsafe { [ld4(k_g.add(src)), ld4(v_g.add(src))] };
            }
        });
        unroll!(j < 8 => {
            let i = gtid + j as u32 * gt;
            if i < chunks {
                let (r, col) = (q0 + i / VECS_PER_ROW as u32, (i % VECS_PER_ROW as u32) * VEC as u32);
                let dst = plane + (r * hs + col) as usize;
                // SAFETY: r < t <= max_t (pos0 = 0): a row of the (bi, h) plane, col + 4 <= HS;
                // this thread alone writes chunk i.
                unsafe {
                    F::Cache::store4(p.k_cache.add(dst), kv[j][0]);
                    F::Cache::store4(p.v_cache.add(dst), kv[j][1]);
                }
            }
        });
    }

    // This warp's rows: local query index, absolute positions (rows g and g+8).
    let w_q0 = q0 + slice * rows_w;
    let w_p_min = pos0 + w_q0;
    let w_p_max = w_p_min + rows_w - 1;
    let row_p = [w_p_min + g, w_p_min + g + 8];
    // Mask limits (see `TcFormat::attend`): distance < min(window, pos + 1).
    let lim = row_p.map(|rp| if window > 0 { window.min(rp + 1) } else { rp + 1 });
    let warp_has_rows = slice * rows_w < q_rows;

    // Q's A fragments, straight from global memory (while the first tiles
    // load): rows g and g+8 of the warp, none past the last query.
    let q_row = |qi: u32| -> *const f32 {
        if qi < t {
            // SAFETY: qi < t: row (bi, qi) of qkv, head h's q columns.
            unsafe { p.qkv.add(((bi * t + qi) * 3 * c + h * hs) as usize) }
        } else {
            core::ptr::null()
        }
    };
    // SAFETY: each row is null or a head slice of HS floats of qkv, 16-byte aligned.
    let qf = unsafe { F::q(q_row(w_q0 + g), q_row(w_q0 + g + 8), tq) };

    let mut st = RowState {
        m: [f32::NEG_INFINITY; 2],
        l: [0.0; 2],
        acc: [[0.0; 4]; DIM_STEPS],
    };
    let ring = F::STAGES as u32;
    let (mut stage, mut next_stage) = (0, ring - 1);
    for i in 0..n_tiles {
        // SAFETY: stage < STAGES: one K and one V stage of the rings.
        let (kb, vb) = unsafe {
            (
                k_s.add(stage as usize * F::TILE_BYTES),
                v_s.add(stage as usize * F::TILE_BYTES),
            )
        };
        // Tile i's commit group is in (with 3 stages the one after it may
        // still be pending); the format readies what this thread copied,
        // then one barrier publishes the stage and also retires iteration
        // i-1, whose stage the next copies reuse.
        if F::STAGES == 3 {
            cp_async_wait_group::<1>();
        } else {
            cp_async_wait_group::<0>();
        }
        // SAFETY: the wait above landed this thread's copies of the stage, which only it
        // touches until the barrier below.
        unsafe { F::prepare(p, kb, vb) };
        sync_threads();
        if i + ring - 1 < n_tiles {
            load_kv(i + ring - 1, next_stage);
        }
        cp_async_commit(); // always, so commit group i stays tile i

        if warp_has_rows {
            let tile = tile0 + i;
            for sub in sub_lo..sub_hi {
                let k0 = tile * bk + sub * SUB_K as u32;
                let k_last = k0 + SUB_K as u32 - 1;
                // Warp-uniform: can any row of this warp see any key of the step?
                if k0 <= w_p_max && (window == 0 || k_last + window > w_p_min) {
                    let needs_mask = k_last > w_p_min || (window > 0 && k0 + window <= w_p_max);
                    let at = Sub { k: kb, v: vb, sub };
                    if needs_mask {
                        let d0 = row_p.map(|rp| rp.wrapping_sub(k0 + 2 * tq));
                        // SAFETY: `at` names the stage readied and published by the barrier at the
                        // top of the iteration.
                        unsafe { F::attend::<true>(&mut st, &qf, at, d0, lim, p.scale_log2e) };
                    } else {
                        // SAFETY: as for the masked call: the published stage.
                        unsafe { F::attend::<false>(&mut st, &qf, at, [0; 2], [0; 2], p.scale_log2e) };
                    }
                }
            }
        }
        stage = if stage + 1 == ring { 0 } else { stage + 1 };
        next_stage = if next_stage + 1 == ring { 0 } else { next_stage + 1 };
    }

    if split > 1 {
        // Parts 1.. hand their state to part 0 of their slice (same rows, same
        // lane layout), which merges them in order. The rings are free once
        // everyone is past the last step; no copy is in flight (the commit
        // groups after the last tile are empty).
        let others = split - 1;
        let merge = smem.cast::<f32>();
        // SAFETY: k < others and v < MERGE_VALS: inside the merge area, which the launch's
        // K/V rings (now free: barrier below, no copy in flight) are large enough for.
        let at = |k: u32, v: usize| unsafe {
            merge.add((((slice * others + k) as usize * MERGE_VALS + v) * WARP_SIZE as usize) + lane as usize)
        };
        sync_threads();
        if part > 0 {
            // SAFETY: v < MERGE_VALS: this lane's slot of part k's block.
            st.put(|v, x| unsafe { *at(part - 1, v) = x });
        }
        sync_threads();
        if part == 0 {
            for k in 0..others {
                // SAFETY: part k's slots, written before the barrier above.
                st.merge(|v| unsafe { *at(k, v) });
            }
        }
    }

    if chunks > 1 {
        // Key chunks: every block leaves its slices' states in its slot of
        // `part_state`; the last of the tile's chunks to arrive merges them in
        // chunk order (its own re-read, so the sums do not depend on which
        // block came last), stores the output and resets the counter.
        let first = first_block;
        // SAFETY: blocks first..first + chunks are this tile's chunks, inside the grid whose
        // states `part_state` holds; slice < slices, v < MERGE_VALS: inside a block's state.
        let at = |blk: u32, v: usize| unsafe {
            p.part_state.add(
                blk as usize * FLASH_PREFILL_BLOCK_STATE as usize
                    + (slice as usize * MERGE_VALS + v) * WARP_SIZE as usize
                    + lane as usize,
            )
        };
        if part == 0 {
            // SAFETY: this block's own slot, written by this lane alone.
            st.put(|v, x| unsafe { *at(first + chunk, v) = x });
        }
        thread_fence();
        // Every lane's state written and fenced before thread 0 arrives (the
        // barrier below evaluates its argument, the arrival, before it
        // synchronises).
        sync_threads();
        // One counter per (query tile, pair), in the unsplit grid's order.
        // SAFETY: the params' contract: a counter per query tile and pair.
        let counter = unsafe { p.part_count.add(unit as usize) };
        let last = sync_threads_or(
            // SAFETY: a live u32, zero between launches.
            gtid == 0 && unsafe { atomic_add_acq_rel_u32(counter, 1) } == chunks - 1,
        );
        if !last {
            return;
        }
        thread_fence();
        if part == 0 {
            // Through L2 (`ld.global.cg`): the other chunks' blocks wrote them.
            // SAFETY: written before their arrivals, which this block saw.
            st = RowState::get(|v| unsafe { load_cg(at(first, v)) });
            for k in 1..chunks {
                // SAFETY: as above.
                st.merge(|v| unsafe { load_cg(at(first + k, v)) });
            }
        }
        if gtid == 0 {
            // SAFETY: every chunk of the tile has arrived; none touches it again.
            unsafe { *counter = 0 };
        }
    }

    if part == 0 {
        // Unrolled, so the stores index the accumulators by constants (a
        // run-time row index would put them in local memory).
        unroll!(r < 2 => {
            let mut sum = st.l[r];
            sum += shfl_xor_f32(sum, 1);
            sum += shfl_xor_f32(sum, 2);
            let qi = w_q0 + g + 8 * r as u32;
            if qi < t {
                // Every valid row saw at least its own key, so sum >= 1.
                let inv = 1.0 / sum;
                // Row (bi, qi) of the output (b * t rows of c), head h's HS elements.
                let at = ((bi * t + qi) * c + h * hs) as usize;
                // SAFETY: qi < t: `at` is a row's head slice inside the output.
                unsafe { F::store(p, at, &st.acc, r, inv, tq) };
            }
        });
    }
}
