//! Hopper warpgroup tensor cores (`wgmma`, sm_90a only) and the proxy fence
//! the asynchronous units need.
//!
//! A warpgroup is 4 consecutive warps whose first warp index is a multiple
//! of 4 (128 threads). `wgmma.mma_async` multiplies a 64 x N tile of A by an
//! N-wide tile of B, 8 deep for TF32, with both operands read from shared
//! memory through 64-bit *matrix descriptors*, and accumulates into
//! registers spread over the warpgroup. It runs asynchronously: the
//! accumulator registers must not be touched between the issue and the
//! matching [`WgmmaAccumulator::wait`].
//!
//! Accumulator layout (PTX ISA, "wgmma D fragment"): warp `w` of the
//! warpgroup owns rows `16w..16w+16`; with `g = lane / 4`, `t = lane % 4`,
//! register `4i + j` holds row `16w + g + 8 * (j / 2)`, column `8i + 2t + j % 2`.
//! So register pair `p` (registers `2p`, `2p+1`) is row `g + 8 * (p % 2)`,
//! columns `8 * (p / 2) + 2t` and `+1`.
//!
//! Only code compiled for `sm_90a` may call these (the PTX assembler rejects
//! `wgmma` for any other target); the crate's `sm90a` feature gates the
//! kernels that do.

use core::arch::asm;

/// Bytes of one row of a 128-byte-swizzled tile: 32 f32 values of k.
pub const SWIZZLE_ROW_BYTES: u32 = 128;
/// Rows in one swizzle atom: the XOR pattern repeats every 8 rows (1024 B),
/// which is also the stride between the 8-row "core matrix" groups of a
/// K-major operand whose rows are one swizzle row each.
pub const SWIZZLE_ATOM_ROWS: u32 = 8;
/// Bytes of one swizzle atom; tiles must start at a multiple of it.
pub const SWIZZLE_ATOM_BYTES: u32 = SWIZZLE_ROW_BYTES * SWIZZLE_ATOM_ROWS;
/// Descriptor bits 62-63: the 128-byte swizzle mode.
const DESC_SWIZZLE_128B: u64 = 1 << 62;
/// Descriptor addresses and offsets are stored in 16-byte units, 14 bits each.
const DESC_UNIT: u32 = 16;
const DESC_FIELD_MASK: u64 = 0x3fff;
/// Leading-dimension byte offset: ignored for swizzled K-major operands
/// whose k extent per instruction fits in one swizzle row; 1 by convention.
const DESC_LBO_UNUSED: u64 = 1;

/// The matrix descriptor of a K-major operand tile in shared memory, laid
/// out as rows of [`SWIZZLE_ROW_BYTES`] with the 128-byte swizzle (16-byte
/// chunk `c` of row `r` stored at chunk position `c ^ (r % 8)`, the layout a
/// TMA copy with `CU_TENSOR_MAP_SWIZZLE_128B` writes): `shared_addr` is the tile's shared-window
/// address plus the byte offset of the k-slice the instruction starts at
/// (0, 32, 64 or 96 for TF32's 8-deep steps); the stride between 8-row
/// groups is one atom.
///
/// The tile's own base must be [`SWIZZLE_ATOM_BYTES`]-aligned (the hardware
/// applies the swizzle on address bits).
#[inline(always)]
pub const fn descriptor_k_major_sw128(shared_addr: u32) -> u64 {
    let start = ((shared_addr / DESC_UNIT) as u64) & DESC_FIELD_MASK;
    let sbo = ((SWIZZLE_ATOM_BYTES / DESC_UNIT) as u64) & DESC_FIELD_MASK;
    start | (DESC_LBO_UNUSED << 16) | (sbo << 32) | DESC_SWIZZLE_128B
}

/// Make this thread's earlier ordinary shared-memory writes (stores,
/// `cp.async` results it has waited for) visible to the asynchronous proxy
/// that `wgmma` reads through. Each writing thread fences, then a barrier
/// publishes the data to the warpgroups.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence; no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;") }
}

/// Order this warpgroup's register and shared-memory accesses before the
/// `wgmma` instructions that follow (required before the first `wgmma` of a
/// batch, and whenever the accumulators were written by other instructions).
/// All threads of the warpgroup must execute it.
#[inline(always)]
pub fn wgmma_fence() {
    // SAFETY: a fence; warpgroup-wide, every thread calls it (contract above).
    unsafe { asm!("wgmma.fence.sync.aligned;") }
}

/// Close the batch of `wgmma` instructions issued since the last commit
/// into one group that [`WgmmaAccumulator::wait`] can wait for.
#[inline(always)]
pub fn wgmma_commit_group() {
    // SAFETY: bookkeeping; warpgroup-wide.
    unsafe { asm!("wgmma.commit_group.sync.aligned;") }
}

/// Set this warpgroup's registers a thread to `N` (`setmaxnreg`): fewer
/// gives registers back to the block's pool, more takes them from it,
/// waiting until enough are free. A warp-specialised kernel's producer
/// gives up what it does not need so that its consumers' accumulators fit
/// without spilling: ptxas allocates the code after the call for `N`.
///
/// `DEC`: `true` to lower the count to `N` (`.dec`), `false` to raise it
/// (`.inc`).
///
/// # Safety
/// Every thread of the warpgroup calls it with the same `N` and `DEC`, and
/// the warpgroup synchronises before calling it again. The kernel has a
/// known register count at entry (`.maxntid` and `.minnctapersm`; without
/// them ptxas ignores the call, warning C7508), and the block's warpgroups
/// never ask for more than that count times its threads altogether (a
/// `.inc` beyond the pool waits forever).
/// `N` is a multiple of 8 from 24 to 256 (PTX ISA, `setmaxnreg`); ptxas
/// rejects any other. (Not a compile-time assertion here: a generic caller
/// names the function for a count of 0 in the branch its constant turns
/// off. `params::matmul_tf32::TileShape::with_consumer_regs` checks the
/// tiles' counts.)
#[inline(always)]
pub unsafe fn warpgroup_registers<const N: u32, const DEC: bool>() {
    // SAFETY: the caller's contract (warpgroup-uniform, a register budget the block's
    // pool covers); the count is a compile-time immediate in the allowed range.
    unsafe {
        if DEC {
            asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N);
        } else {
            asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N);
        }
    }
}

/// An accumulator of one warpgroup's `m64nNk8` TF32 tile, kept in registers.
/// Implemented for `[f32; N / 2]` with N in {64, 128, 192, 256}; the methods
/// touch every register by a constant index, so the array never leaves
/// registers.
pub trait WgmmaAccumulator: Sized {
    /// N: the tile's width (columns of B).
    const N: usize;
    /// An all-zero accumulator.
    fn zeroed() -> Self;
    /// `self += A · Bᵀ` for one 64 x N x 8 step, issued asynchronously.
    /// `a` and `b` are descriptors ([`descriptor_k_major_sw128`]) of the A
    /// tile (64 rows of k) and the B tile (N rows of k).
    ///
    /// # Safety
    /// sm_90a only; every thread of the warpgroup calls it with the same
    /// descriptors, after [`wgmma_fence`]; the described shared memory holds
    /// the tiles (written, fenced with [`fence_proxy_async_shared`] and
    /// published by a barrier) and is not overwritten until a `wait`
    /// covering this step has returned.
    unsafe fn mma_tf32(&mut self, a: u64, b: u64);
    /// `self += A · Bᵀ` for one 64 x N x 16 step of bf16 operands: the same
    /// descriptors as [`Self::mma_tf32`] (a 16-deep bf16 slice is 32 bytes of
    /// a staged row, as an 8-deep TF32 one is), both operands K-major.
    ///
    /// # Safety
    /// As for [`Self::mma_tf32`], with tiles of bf16.
    unsafe fn mma_bf16(&mut self, a: u64, b: u64);
    /// Wait until at most `PENDING` committed groups of this warpgroup are
    /// still running. The accumulator is passed through so the compiler
    /// cannot move its uses above the wait.
    fn wait<const PENDING: u32>(&mut self);
    /// Call `f(p, [lo, hi])` for every register pair `p` (see the module
    /// docs for its row and columns), with `p` a constant after inlining.
    fn for_each_pair(&self, f: impl FnMut(u32, [f32; 2]));
}

macro_rules! wgmma_accumulator {
    ($(#[$meta:meta])* $n:literal, [$first:literal $($i:literal)*], pairs [$($p:literal)*]) => {
        $(#[$meta])*
        impl WgmmaAccumulator for [f32; $n / 2] {
            const N: usize = $n;

            #[inline(always)]
            fn zeroed() -> Self {
                // Element by element, at constant indices: rustc writes
                // `[0.0; LEN]` (and a literal list of equal elements, which
                // MIR turns into that) as a store loop, whose run-time index
                // would keep the whole accumulator in local memory.
                let mut acc = core::mem::MaybeUninit::<Self>::uninit();
                let first = acc.as_mut_ptr().cast::<f32>();
                // SAFETY: every element is written (indices $first and $i
                // cover 0..LEN) before `assume_init`.
                unsafe {
                    first.add($first).write(0.0);
                    $( first.add($i).write(0.0); )*
                    acc.assume_init()
                }
            }

            #[inline(always)]
            unsafe fn mma_tf32(&mut self, a: u64, b: u64) {
                // Scale-d is 1 (accumulate), scale-a and scale-b are 1; TF32
                // takes no transpose flags (both operands must be K-major).
                // SAFETY: the caller meets `mma_tf32`'s contract (sm_90a, whole warpgroup, fenced
                // and published tiles left in place until a wait).
                unsafe {
                    asm!(
                        concat!(
                            "wgmma.mma_async.sync.aligned.m64n", $n, "k8.f32.tf32.tf32 {{{", $first, "}",
                            $(", {", $i, "}",)*
                            "}}, {a}, {b}, {one}, 1, 1;"
                        ),
                        inout(reg32) self[$first], $(inout(reg32) self[$i],)*
                        a = in(reg64) a,
                        b = in(reg64) b,
                        one = const 1,
                    )
                }
            }

            #[inline(always)]
            unsafe fn mma_bf16(&mut self, a: u64, b: u64) {
                // Scale-d 1 (accumulate), scale-a and scale-b 1, transpose
                // flags 0: both operands K-major.
                // SAFETY: the caller meets `mma_bf16`'s contract, which is `mma_tf32`'s for bf16 tiles.
                unsafe {
                    asm!(
                        concat!(
                            "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.bf16.bf16 {{{", $first, "}",
                            $(", {", $i, "}",)*
                            "}}, {a}, {b}, {one}, 1, 1, 0, 0;"
                        ),
                        inout(reg32) self[$first], $(inout(reg32) self[$i],)*
                        a = in(reg64) a,
                        b = in(reg64) b,
                        one = const 1,
                    )
                }
            }

            #[inline(always)]
            fn wait<const PENDING: u32>(&mut self) {
                // SAFETY: waiting has no preconditions; the operands only pin
                // the registers (they appear in a PTX comment).
                unsafe {
                    asm!(
                        "wgmma.wait_group.sync.aligned {n};",
                        concat!("// {", $first, "}", $(" {", $i, "}",)*),
                        inout(reg32) self[$first], $(inout(reg32) self[$i],)*
                        n = const PENDING,
                    )
                }
            }

            #[inline(always)]
            fn for_each_pair(&self, mut f: impl FnMut(u32, [f32; 2])) {
                $( f($p, [self[2 * $p], self[2 * $p + 1]]); )*
            }
        }
    };
}

wgmma_accumulator!(
    /// Accumulator of one `m64n64k8` tile: 32 floats per thread.
    64, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31],
    pairs [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]
);

wgmma_accumulator!(
    /// Accumulator of one `m64n128k8` tile: 64 floats per thread.
    128, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63],
    pairs [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]
);

wgmma_accumulator!(
    /// Accumulator of one `m64n192k8` tile: 96 floats per thread.
    192, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95],
    pairs [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47]
);

wgmma_accumulator!(
    /// Accumulator of one `m64n256k8` tile: 128 floats per thread.
    256, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127],
    pairs [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]
);
