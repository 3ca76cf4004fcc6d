//! bf16 tensor-core matmul for prefill:
//! `out[N,OC] = round_bf16(inp[N,C]) · W[OC,C]ᵀ (+ bias) (GELU)`, `W` stored
//! as bf16, f32 accumulate.
//!
//! Structure (per block, tile `BM x BN`, `BK = 32` deep), as in the TF32
//! `mma.sync` kernel (`matmul_tf32`):
//! - `STAGES` shared-memory slabs filled by 16-byte `cp.async` copies (4 f32
//!   of `inp`, 8 bf16 of `W` each), so the loads of tile `k + STAGES - 1`
//!   overlap the tensor-core work on tile `k`; what lies outside the matrices
//!   is zero-filled (`src-size 0`), so any `N` and `OC` work and every `C`
//!   that is a multiple of 8.
//! - When a stage has landed, each thread rounds the `inp` chunks it copied
//!   to bf16 (`cvt.rn.bf16x2`, ties to even) into a bf16 tile, before the
//!   barrier that publishes the stage: once per element per block, where
//!   converting fragments would repeat it for every warp column. The bf16
//!   tiles alternate (`MATMUL_BF16_A_TILES`), so the one being written is
//!   never one a slower warp still reads.
//! - A and B are then alike: K-contiguous bf16 rows, the "row" A and "col" B
//!   operands of `mma.m16n8k16`. A row of `BK` bf16 is 64 bytes, and lane `t`
//!   of a quad reads its 16-byte chunk `t` (see `K_PER_LANE`), so a warp's
//!   fragment load of 8 consecutive rows reads 512 contiguous bytes: free of
//!   bank conflicts without padding. The `cp.async` writes and the
//!   conversion are contiguous per thread index too.
//! - Each warp owns a `WM x WN` sub-tile: `MI = WM/16` by `NI = WN/8` mma
//!   tiles, accumulated in registers in f32.
//! - Epilogue: the TF32 kernels' (`matmul_tf32::store_tile`): bias and
//!   optional GELU, guarded stores (the fragments parked by
//!   `matmul_tf32::park_fragments` first).
//!
//! The body is generic over the tile shape; the macro at the bottom exports
//! one kernel per shape in [`crate::params::matmul_bf16::MATMUL_BF16_VARIANTS`].

use super::matmul_tf32::{TileOut, grouped_tile, park_fragments, store_tile, wait_for_oldest_stage};
use crate::device::mma::{cp_async_16_zfill, cp_async_commit, cp_async_wait_group, mma_m16n8k16_bf16, pack_bf16x2};
use crate::device::shared::dynamic_shared;
use crate::device::{UNROLL_MAX, unroll};
use crate::device::{Vec2, Vec4};
use crate::device::{WARP_SIZE, block_idx_x, grid_dependency_sync, sync_threads, thread_idx_x};
use crate::params::matmul_bf16::*;

const BK: usize = MATMUL_BF16_BK as usize;
const A_TILES: usize = MATMUL_BF16_A_TILES as usize;
const EPI_PAD: usize = MATMUL_BF16_EPI_PAD as usize;
/// Bytes of one `cp.async` copy.
const CHUNK_BYTES: usize = 16;
/// f32 per copy, and so per unit of the conversion.
const F32_PER_CHUNK: usize = CHUNK_BYTES / size_of::<f32>();
/// bf16 per 32-bit word (one `mma` operand register).
const BF16_PER_WORD: usize = 2;
/// Words of bf16 one converted chunk of `inp` becomes.
const WORDS_PER_CHUNK: usize = F32_PER_CHUNK / BF16_PER_WORD;
/// 32-bit words of a staged bf16 row.
const ROW_WORDS: usize = BK / BF16_PER_WORD;
/// Shape of one `mma.m16n8k16`.
const MMA_M: usize = 16;
const MMA_N: usize = 8;
const MMA_K: usize = 16;
/// Lanes sharing a fragment row (`t = lane % 4`), and the row offset of the
/// second half of an A fragment (a1/a3 are rows g+8).
const LANES_PER_ROW: usize = 4;
const FRAG_ROW_HALF: usize = MMA_M / 2;
/// k assignment: the mma only needs A's k-slot j and B's k-slot j to be the
/// same k. Lane t owns the 8 consecutive k `[8t, 8t+8)` of every row of the
/// 32-deep stage, i.e. words `[4t, 4t+4)`, one 16-byte load: in mma step `s`
/// (0..2) its slots (2t, 2t+1) are word `2s` (k `8t+4s`, `8t+4s+1`) and its
/// slots (2t+8, 2t+9) word `2s+1` (k `8t+4s+2`, `8t+4s+3`). Over t and s
/// that is every k of the stage once, and within a word the lower k is in
/// the lower half, as the mma wants.
const K_PER_LANE: usize = BK / LANES_PER_ROW;
const WORDS_PER_LANE: usize = K_PER_LANE / BF16_PER_WORD;
/// mma steps per stage; each takes two of the lane's words.
const STEPS: usize = BK / MMA_K;
const _: () = assert!(K_PER_LANE * LANES_PER_ROW == BK && WORDS_PER_LANE == 2 * STEPS);
const _: () = assert!(WORDS_PER_LANE * size_of::<u32>() == CHUNK_BYTES);

/// Most `inp` chunks one thread converts per stage ([`convert_slab`]).
const CONVERT_MAX_CHUNKS: usize = 4;

/// Asking for the dynamic shared memory as this type makes its base 16-byte
/// aligned, which `cp.async` of 16 bytes needs.
#[repr(C, align(16))]
struct Align16([u8; CHUNK_BYTES]);

/// Bytes of the shared-memory layout of one block (must equal
/// `Bf16TileShape::shared_bytes`, checked where the kernels are exported):
/// `stages` f32 `inp` slabs of `bm` rows, `stages` bf16 `W` slabs of `bn`
/// rows, then `A_TILES` bf16 tiles of `bm` rows, all rows `BK` deep.
const fn layout_bytes(bm: usize, bn: usize, stages: usize) -> usize {
    stages * (bm * BK * size_of::<f32>() + bn * BK * size_of::<u16>()) + A_TILES * bm * BK * size_of::<u16>()
}

/// Copy one `ROWS x BK` slab of a K-contiguous matrix of `T` (f32, or bf16
/// bits as `u16`), `rows` rows of `c` elements, starting at row `r0`, column
/// `k0`, into shared memory at `dst` (unpadded rows of `BK`), zero-filling
/// what lies outside the matrix. Thread `tid` copies chunks
/// `tid + i * THREADS` (chunk `j` is bytes `[16j, 16j + 16)` of the slab).
///
/// # Safety
/// `dst` holds `ROWS * BK` elements of shared memory, 16-byte aligned;
/// `src` is a device matrix of `rows x c` elements, 16-byte aligned,
/// `c * size_of::<T>()` a multiple of 16.
#[inline(always)]
unsafe fn load_slab<T, const ROWS: usize, const THREADS: usize>(
    dst: *mut T,
    src: *const T,
    r0: usize,
    k0: usize,
    rows: usize,
    c: usize,
    tid: usize,
) {
    let per_chunk = const { CHUNK_BYTES / size_of::<T>() };
    let chunks_per_row = const { BK / (CHUNK_BYTES / size_of::<T>()) };
    let per_thread = const { ROWS * (BK / (CHUNK_BYTES / size_of::<T>())) / THREADS };
    const { assert!((ROWS * (BK / (CHUNK_BYTES / size_of::<T>()))).is_multiple_of(THREADS)) };
    for i in 0..per_thread {
        let chunk = tid + i * THREADS;
        let row = chunk / chunks_per_row;
        let col = (chunk % chunks_per_row) * per_chunk;
        let (gr, gk) = (r0 + row, k0 + col);
        let inside = gr < rows && gk < c;
        // Outside: copy 0 bytes (zero-fill) from an address that is valid anyway.
        let (from, bytes) = if inside {
            // SAFETY: inside: gr < rows and gk < c, so element (gr, gk) is in `src`.
            (unsafe { src.add(gr * c + gk) }, CHUNK_BYTES as u32)
        } else {
            (src, 0)
        };
        // Unpadded rows: chunk j of the slab is at element j * per_chunk.
        // SAFETY: chunk < ROWS * BK / per_chunk (the const assert), so `dst`'s 16 bytes are
        // in the slab and aligned; `from` is readable for `bytes` (0 outside).
        unsafe { cp_async_16_zfill(dst.add(chunk * per_chunk).cast(), from.cast(), bytes) };
    }
}

/// Round to bf16 the f32 chunks of a staged `inp` slab (`ROWS x BK`) that
/// this thread copied with [`load_slab`] (chunks `tid + i * THREADS`), into
/// the bf16 tile `dst` (`ROWS` rows of `ROW_WORDS` words): chunk `j` (4 f32)
/// becomes words `2j, 2j + 1`. All loads are issued before any store: the
/// compiler cannot tell the two buffers apart, so a load-convert-store loop
/// would wait out the shared-memory latency once per chunk.
///
/// # Safety
/// `src` is a slab filled by this thread's `load_slab::<f32, ROWS, THREADS>`
/// whose copies have completed (`cp.async.wait_group`); `dst` holds `ROWS *
/// ROW_WORDS` words of shared memory, 16-byte aligned, that no other thread
/// reads until the next barrier.
#[inline(always)]
unsafe fn convert_slab<const ROWS: usize, const THREADS: usize>(dst: *mut u32, src: *const f32, tid: usize) {
    let per_thread = const { ROWS * (BK / F32_PER_CHUNK) / THREADS };
    const {
        assert!((ROWS * (BK / F32_PER_CHUNK)).is_multiple_of(THREADS));
        assert!(ROWS * (BK / F32_PER_CHUNK) / THREADS <= CONVERT_MAX_CHUNKS);
    };
    let mut v = [Vec4([0.0; F32_PER_CHUNK]); CONVERT_MAX_CHUNKS];
    unroll!(i < CONVERT_MAX_CHUNKS => {
        if i < per_thread {
            // SAFETY: the caller's slab holds ROWS * BK f32 this thread's copies filled and
            // that have landed; chunk tid + i * THREADS < ROWS * BK / 4, aligned 16.
            v[i] = unsafe { *src.add((tid + i * THREADS) * F32_PER_CHUNK).cast::<Vec4<f32>>() };
        }
    });
    unroll!(i < CONVERT_MAX_CHUNKS => {
        if i < per_thread {
            let [x0, x1, x2, x3] = v[i].0;
            let words = Vec2([pack_bf16x2(x0, x1), pack_bf16x2(x2, x3)]);
            // SAFETY: the same chunk index in `dst`'s ROWS * ROW_WORDS words, 8-byte
            // aligned (16-byte base, 2 words a chunk); no other thread reads it yet.
            unsafe { *dst.add((tid + i * THREADS) * WORDS_PER_CHUNK).cast::<Vec2<u32>>() = words };
        }
    });
}

/// One 16-byte load from shared memory.
///
/// # Safety
/// `p` is 16-byte aligned and points to 4 readable words.
#[inline(always)]
unsafe fn load_u4(p: *const u32) -> [u32; WORDS_PER_LANE] {
    // SAFETY: the caller gives `p` 16-byte aligned with 4 readable words, `Vec4`'s size
    // and alignment.
    unsafe { *p.cast::<Vec4<u32>>() }.0
}

/// A lane's operands for one staged k-tile: for each of the warp's MI A
/// tiles its chunk of rows g and g+8, for each of the NI B tiles its chunk
/// of row g (see `K_PER_LANE`).
struct Fragments<const MI: usize, const NI: usize> {
    a: [[[u32; WORDS_PER_LANE]; 2]; MI],
    b: [[u32; WORDS_PER_LANE]; NI],
}

/// Load a lane's [`Fragments`] from the warp's A rows `sa` and B rows `sb`.
///
/// # Safety
/// `sa` points to `MI * 16` and `sb` to `NI * 8` rows of `ROW_WORDS` words
/// of staged bf16 shared memory, 16-byte aligned, published by a barrier.
#[inline(always)]
unsafe fn load_fragments<const MI: usize, const NI: usize>(
    sa: *const u32,
    sb: *const u32,
    g: usize,
    t: usize,
) -> Fragments<MI, NI> {
    const { assert!(MI <= UNROLL_MAX && NI <= UNROLL_MAX) };
    let mut f = Fragments {
        a: [[[0; WORDS_PER_LANE]; 2]; MI],
        b: [[0; WORDS_PER_LANE]; NI],
    };
    let lane_col = t * WORDS_PER_LANE;
    unroll!(mi < MI => {
        // SAFETY: row mi * 16 + g < MI * 16 rows of `sa` (the caller's contract).
        let top = unsafe { sa.add((mi * MMA_M + g) * ROW_WORDS + lane_col) };
        // SAFETY: `top` and the row 8 below are inside `sa`'s MI * 16 rows; the lane's
        // 4 words start at a multiple of 4 words of a 16-byte aligned row.
        f.a[mi] = unsafe { [load_u4(top), load_u4(top.add(FRAG_ROW_HALF * ROW_WORDS))] };
    });
    unroll!(ni < NI => {
        // SAFETY: row ni * 8 + g < NI * 8 rows of `sb`, 4 words at a 16-byte boundary.
        f.b[ni] = unsafe { load_u4(sb.add((ni * MMA_N + g) * ROW_WORDS + lane_col)) };
    });
    f
}

/// The `STEPS x MI x NI` mma of one staged k-tile.
#[inline(always)]
fn mma_fragments<const MI: usize, const NI: usize>(acc: &mut [[[f32; 4]; NI]; MI], f: &Fragments<MI, NI>) {
    unroll!(s < STEPS => {
        // Slots (2t, 2t+1) of this step are word 2s, slots (2t+8, 2t+9) word 2s+1.
        let (lo, hi) = (2 * s, 2 * s + 1);
        unroll!(mi < MI => {
            let [top, bottom] = f.a[mi];
            let a = [top[lo], bottom[lo], top[hi], bottom[hi]];
            unroll!(ni < NI => {
                acc[mi][ni] = mma_m16n8k16_bf16(a, [f.b[ni][lo], f.b[ni][hi]], acc[mi][ni]);
            });
        });
    });
}

/// The kernel body for one tile shape. `MI`/`NI` are `WM/16` and `WN/8`
/// (passed explicitly: array lengths cannot be computed from generics).
///
/// # Safety
/// Launched with `THREADS` threads, a 1-D grid of
/// `ceil(n/BM) * ceil(oc/BN)` blocks and `layout_bytes(BM, BN, STAGES)` bytes
/// of dynamic shared memory; the pointers of `p` hold the sizes its fields
/// say, `inp`/`weight`/`out` 16-byte aligned, `c % 8 == 0`.
#[inline(always)]
unsafe fn matmul_bf16_body<
    const BM: usize,
    const BN: usize,
    const WM: usize,
    const WN: usize,
    const STAGES: usize,
    const MI: usize,
    const NI: usize,
    const THREADS: usize,
>(
    p: MatmulBf16Params,
) {
    const {
        assert!(WM == MI * MMA_M && WN == NI * MMA_N);
        assert!(BM.is_multiple_of(WM) && BN.is_multiple_of(WN));
        assert!(THREADS == (BM / WM) * (BN / WN) * WARP_SIZE as usize);
        assert!(STAGES >= 2 && STAGES <= 5);
        // The epilogue reuses the pipeline's shared memory for the output tile.
        assert!(BM * (BN + EPI_PAD) * size_of::<f32>() <= layout_bytes(BM, BN, STAGES));
    };
    let (n, c, oc) = (p.n as usize, p.c as usize, p.oc as usize);

    let (tile_m, tile_n) = grouped_tile(block_idx_x() as usize, n.div_ceil(BM), oc.div_ceil(BN));
    let (m0, n0) = (tile_m * BM, tile_n * BN);

    let tid = thread_idx_x() as usize;
    let warp = tid / WARP_SIZE as usize;
    let lane = tid % WARP_SIZE as usize;
    let (warp_m, warp_n) = (warp % (BM / WM), warp / (BM / WM));
    let (g, t) = (lane / LANES_PER_ROW, lane % LANES_PER_ROW);

    // SAFETY: (whole body) the launch provides the shared memory and buffer
    // sizes stated in the contract; every global access is bounds-guarded.
    // Shared layout (`layout_bytes`): f32 `inp` slabs, bf16 `W` slabs, bf16
    // A tiles; every part a multiple of 16 bytes, so all stay aligned.
    let smem: *mut u8 = unsafe { dynamic_shared::<Align16>() }.cast();
    let inp_slab_bytes = BM * BK * size_of::<f32>();
    let w_slab_bytes = BN * BK * size_of::<u16>();
    let a_tile_bytes = BM * BK * size_of::<u16>();
    // SAFETY: stage < STAGES: inside the `inp` slabs of the `layout_bytes` layout.
    let inp_slab = |stage: usize| unsafe { smem.add(stage * inp_slab_bytes) }.cast::<f32>();
    // SAFETY: stage < STAGES: inside the `W` slabs, which follow the `inp` slabs.
    let w_slab = |stage: usize| unsafe { smem.add(STAGES * inp_slab_bytes + stage * w_slab_bytes) }.cast::<u16>();
    let a_tile =
        // SAFETY: i < A_TILES: inside the A tiles, after both slab rings.
        |i: usize| unsafe { smem.add(STAGES * (inp_slab_bytes + w_slab_bytes) + i * a_tile_bytes) }.cast::<u32>();
    // SAFETY: the slabs are in the layout and aligned; `inp`/`weight` are the launch's
    // n x c and oc x c matrices, 16-byte aligned with c % 8 == 0.
    let load_inp = |stage: usize, kt: usize| unsafe {
        load_slab::<f32, BM, THREADS>(inp_slab(stage), p.inp, m0, kt * BK, n, c, tid);
    };
    // SAFETY: as for `load_inp`.
    let load_weight = |stage: usize, kt: usize| unsafe {
        load_slab::<u16, BN, THREADS>(w_slab(stage), p.weight, n0, kt * BK, oc, c, tid);
    };

    let ktiles = c.div_ceil(BK);
    // Prologue: fill STAGES-1 stages (always commit, so group counts line up),
    // the weights' slabs before the PDL wait (no kernel writes them).
    for s in 0..STAGES - 1 {
        if s < ktiles {
            load_weight(s, s);
        }
    }
    grid_dependency_sync();
    for s in 0..STAGES - 1 {
        if s < ktiles {
            load_inp(s, s);
        }
        cp_async_commit();
    }

    let mut acc = [[[0f32; 4]; NI]; MI];
    let mut read_stage = 0usize;
    let mut write_stage = STAGES - 1;
    for kt in 0..ktiles {
        wait_for_oldest_stage::<STAGES>();
        // This thread's copies of tile kt have landed (visible to it alone):
        // round its `inp` chunks to bf16, once, into this k-tile's A tile
        // (last read at kt - 2: every warp has passed kt - 1's barrier since).
        let a = a_tile(kt % A_TILES);
        // SAFETY: `read_stage`'s copies by this thread have landed (the wait above); the
        // A tile was last read at kt - 2, before the last barrier.
        unsafe { convert_slab::<BM, THREADS>(a, inp_slab(read_stage), tid) };
        // Tile kt (converted) is visible to all; and every warp is done with
        // the stage consumed last iteration, which the prefetch overwrites.
        sync_threads();

        // SAFETY: warp_m * WM + WM <= BM rows of the A tile.
        let sa = unsafe { a.add(warp_m * WM * ROW_WORDS) };
        // SAFETY: warp_n * WN + WN <= BN rows of the W slab of this stage.
        let sb = unsafe { w_slab(read_stage).cast::<u32>().add(warp_n * WN * ROW_WORDS) };
        // SAFETY: `sa`/`sb` cover MI * 16 and NI * 8 rows, aligned; the barrier above
        // published the converted A tile and the landed W slab.
        let frags = unsafe { load_fragments::<MI, NI>(sa, sb, g, t) };
        // The prefetch of tile kt + STAGES - 1 goes out between the fragment
        // loads and the mma, so its copy instructions issue while the loads
        // are in flight.
        if kt + STAGES - 1 < ktiles {
            load_inp(write_stage, kt + STAGES - 1);
            load_weight(write_stage, kt + STAGES - 1);
        }
        cp_async_commit();
        mma_fragments::<MI, NI>(&mut acc, &frags);
        read_stage = if read_stage + 1 == STAGES { 0 } else { read_stage + 1 };
        write_stage = if write_stage + 1 == STAGES { 0 } else { write_stage + 1 };
    }

    // Epilogue, in two steps so the accumulators are only ever indexed by
    // constants (a run-time index would move all of them to local memory):
    // 1. every warp parks its fragments in shared memory (c0/c1: row g,
    //    columns 2t and 2t+1; c2/c3: the same at row g+8);
    // 2. the block streams the BM x BN tile out row by row, adding the bias
    //    and applying GELU on the way.
    cp_async_wait_group::<0>();
    sync_threads(); // all warps done reading the pipeline's shared memory
    let tile = smem.cast::<f32>();
    let ldo = BN + EPI_PAD;
    // SAFETY: after the wait and barrier no one reads the pipeline's memory; the
    // BM x (BN + EPI_PAD) f32 tile fits in it (`layout_bytes`).
    unsafe { park_fragments::<MI, NI>(&acc, tile, ldo, warp_m * WM, warp_n * WN, g, t) };
    sync_threads();

    // SAFETY: the barrier above published the whole tile; `out`/`bias` hold n x oc
    // and oc floats per the launch contract, and `store_tile` guards the edges.
    unsafe {
        store_tile(
            tile,
            ldo,
            BM,
            BN,
            tid,
            THREADS,
            (m0, n0),
            TileOut::F32 {
                out: p.out,
                round_tf32: false,
            },
            p.bias,
            n,
            oc,
            p.gelu != 0,
        )
    };
}

/// Exports one kernel per tile shape; the name comes from the shape so the
/// host's launch configuration and the kernel are always the same shape.
macro_rules! matmul_bf16_kernel {
    ($fn_name:ident, $shape:expr) => {
        /// # Safety
        /// As for `matmul_bf16_body`, with this kernel's tile shape.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $fn_name(p: MatmulBf16Params) {
            const S: Bf16TileShape = $shape;
            // The host sizes the launch's shared memory by `shared_bytes`.
            const {
                assert!(
                    S.shared_bytes() as usize == layout_bytes(S.bm as usize, S.bn as usize, S.stages as usize)
                )
            };
            // SAFETY: the host launches this kernel by its `Bf16TileShape`, which is
            // `matmul_bf16_body`'s contract for these parameters.
            unsafe {
                matmul_bf16_body::<
                    { S.bm as usize },
                    { S.bn as usize },
                    { S.wm as usize },
                    { S.wn as usize },
                    { S.stages as usize },
                    { (S.wm as usize) / MMA_M },
                    { (S.wn as usize) / MMA_N },
                    { S.threads() as usize },
                >(p)
            }
        }
    };
}

matmul_bf16_kernel!(matmul_forward_bf16_128x128, MATMUL_BF16_128X128);
matmul_bf16_kernel!(matmul_forward_bf16_64x64, MATMUL_BF16_64X64);
