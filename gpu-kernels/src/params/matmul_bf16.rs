//! `out[N,OC] = round_bf16(inp[N,C]) · W[OC,C]ᵀ (+ bias[OC]) (then GELU if
//! asked)` on the bf16 tensor cores (`mma.sync.m16n8k16`), f32 accumulate:
//! the prefill matmul of an engine that keeps its weights in bf16. `inp`
//! stays f32 in memory; the kernel rounds it to bf16 (to nearest, ties to
//! even) as it stages it.
//!
//! On Hopper (the sm_90a module) the `wgmma` kernels (`ops::matmul_wgmma`,
//! [`MatmulBf16WgmmaParams`]) take `inp` as bf16, rounded once by whatever
//! produced it, and may write bf16.
//!
//! One kernel body, monomorphised into the tile shapes below, each exported
//! under its own PTX name; the kernels read their shape from the same
//! constants, so host launch configurations and device code cannot disagree.

use super::matmul_tf32::{TensorMap, TileShape, persistent_wgmma_tile, wgmma_tile};

/// Depth (in k) of the slabs staged in shared memory per pipeline stage.
pub const MATMUL_BF16_BK: u32 = 32;
/// `c` must be a multiple of this: the weight rows are copied in 16-byte
/// chunks of 8 bf16, each of which must lie wholly inside or outside a row
/// (and rows must start 16-byte aligned).
pub const MATMUL_BF16_C_MULTIPLE: u32 = 8;
/// bf16 tiles of `inp` the kernel converts into, used in turn by k-tile: the
/// one written at k-tile `kt` was last read at `kt - 2`, before the barrier
/// of `kt - 1` that every warp has passed.
pub const MATMUL_BF16_A_TILES: u32 = 2;
/// Padding (floats) of each row of the output tile the epilogue stages in
/// shared memory: with a row stride of `BN + 8` words the 8-byte fragment
/// stores of a half-warp (rows g..g+3, columns 2t) cover all 32 banks once.
pub const MATMUL_BF16_EPI_PAD: u32 = 8;

/// PTX name of the 128x128 kernel.
pub const MATMUL_FORWARD_BF16_128X128: &str = "matmul_forward_bf16_128x128";
/// PTX name of the 64x64 kernel.
pub const MATMUL_FORWARD_BF16_64X64: &str = "matmul_forward_bf16_64x64";

/// A block tile `bm x bn` with `stages` cp.async pipeline stages, split
/// among warps that each compute `wm x wn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16TileShape {
    pub name: &'static str,
    pub bm: u32,
    pub bn: u32,
    pub wm: u32,
    pub wn: u32,
    pub stages: u32,
}

impl Bf16TileShape {
    /// Threads per block: one warp (32 lanes) per `wm x wn` sub-tile.
    pub const fn threads(&self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn) * 32
    }

    /// Dynamic shared memory per block: `stages` slabs of `inp` (f32, as
    /// copied) and of `W` (bf16), then the bf16 tiles `inp` is converted
    /// into. Rows are not padded (see `ops::matmul_bf16`). The epilogue's
    /// output tile reuses the same memory.
    pub const fn shared_bytes(&self) -> u32 {
        let f32_bytes = 4;
        let bf16_bytes = 2;
        self.stages * (self.bm * f32_bytes + self.bn * bf16_bytes) * MATMUL_BF16_BK
            + MATMUL_BF16_A_TILES * self.bm * bf16_bytes * MATMUL_BF16_BK
    }
}

/// 128x128 block, 8 warps of 64x32, 4 stages (112 KiB shared): long prompts.
pub const MATMUL_BF16_128X128: Bf16TileShape = Bf16TileShape {
    name: MATMUL_FORWARD_BF16_128X128,
    bm: 128,
    bn: 128,
    wm: 64,
    wn: 32,
    stages: 4,
};
/// 64x64 block, 4 warps of 32x32, 4 stages (56 KiB shared): four times the
/// blocks of 128x128, for outputs too small to fill the GPU with those.
pub const MATMUL_BF16_64X64: Bf16TileShape = Bf16TileShape {
    name: MATMUL_FORWARD_BF16_64X64,
    bm: 64,
    bn: 64,
    wm: 32,
    wn: 32,
    stages: 4,
};

/// Every tile shape (all in every module).
pub const MATMUL_BF16_VARIANTS: [Bf16TileShape; 2] = [MATMUL_BF16_128X128, MATMUL_BF16_64X64];

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulBf16Params {
    /// `[n, oc]`, written; 16-byte aligned.
    pub out: *mut f32,
    /// `[n, c]`, f32 (rounded to bf16 by the kernel); 16-byte aligned.
    pub inp: *const f32,
    /// `[oc, c]` bf16 bits (PyTorch's (out, in) layout); 16-byte aligned.
    pub weight: *const u16,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    /// Inner dimension; a multiple of `MATMUL_BF16_C_MULTIPLE`.
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU (tanh approximation) after the bias.
    pub gelu: u32,
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe MatmulBf16Params);

/// k depth (bf16 elements) of a stage of the `wgmma` kernels: one 128-byte
/// swizzled row, as the TF32 ones' 32 f32 (`ops::matmul_wgmma`).
pub const MATMUL_BF16_WGMMA_BK: u32 = 64;

/// 128x256, 2 consumer warpgroups of m64n256k16, 4 stages (193 KiB): the
/// most tensor work per staged byte (85 FLOP/B).
pub const MATMUL_BF16_WGMMA_128X256: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_128x256", 128, 256, 4, 1);
/// 192x192, 3 consumer warpgroups, 4 stages (193 KiB): fewer partial waves
/// at N = 2304 (see the TF32 twin).
pub const MATMUL_BF16_WGMMA_192X192: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_192x192", 192, 192, 4, 1);
/// 128x192, 2 warpgroups, 5 stages (201 KiB): N = 768 in 4 column tiles.
pub const MATMUL_BF16_WGMMA_128X192: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_128x192", 128, 192, 5, 1);
/// 128x128, 2 warpgroups, 6 stages (193 KiB).
pub const MATMUL_BF16_WGMMA_128X128: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_128x128", 128, 128, 6, 1);
/// 64x128, one warpgroup, 4 stages (97 KiB, two blocks per SM).
pub const MATMUL_BF16_WGMMA_64X128: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_64x128", 64, 128, 4, 2);
/// 64x64, one warpgroup, 4 stages (65 KiB, three blocks per SM): small outputs.
pub const MATMUL_BF16_WGMMA_64X64: TileShape = wgmma_tile("matmul_forward_bf16_wgmma_64x64", 64, 64, 4, 3);

/// Every bf16 `wgmma` tile shape (sm_90a module only).
pub const MATMUL_BF16_WGMMA_VARIANTS: [TileShape; 6] = [
    MATMUL_BF16_WGMMA_128X256,
    MATMUL_BF16_WGMMA_192X192,
    MATMUL_BF16_WGMMA_128X192,
    MATMUL_BF16_WGMMA_128X128,
    MATMUL_BF16_WGMMA_64X128,
    MATMUL_BF16_WGMMA_64X64,
];

/// The persistent twins of the one-block-an-SM bf16 tiles
/// (`persistent_wgmma_tile`): a stage fewer where the epilogue's buffer
/// needs the room; the buffer holds a whole tile of bf16 output (`bn / 64`
/// boxes), half of an f32 one. Measured at M = 8192 (H200), against the
/// one-tile blocks: 128x192 13-22 % faster on every GPT-2 shape, 128x128
/// 3-11 %. None for 128x256 (with 3 stages, 0-16 % slower than its
/// 4-stage one-tile blocks). The 192x192 twin's blocks (three consumer
/// warpgroups) have 128 registers a thread at an even share, and the loop
/// over tiles took its consumers past that (ptxas spilled 16-24 bytes): its
/// producer is a warpgroup that keeps 40 and gives the rest to the
/// consumers, 152 each (`TileShape::with_consumer_regs`); 3 stages, as the
/// epilogue's three boxes of 192 rows take a fourth stage's room.
pub const MATMUL_BF16_WGMMA_PERSISTENT: [TileShape; 3] = [
    persistent_wgmma_tile("matmul_forward_bf16_wgmma_128x192_persistent", 128, 192, 4, 3),
    persistent_wgmma_tile("matmul_forward_bf16_wgmma_128x128_persistent", 128, 128, 6, 2),
    persistent_wgmma_tile("matmul_forward_bf16_wgmma_192x192_persistent", 192, 192, 3, 3)
        .with_consumer_regs(BF16_WGMMA_192X192_CONSUMER_REGS),
];

/// Registers a consumer thread of the persistent 192x192 bf16 tile holds:
/// the most three consumer warpgroups can take beside a producer
/// warpgroup of `WGMMA_PRODUCER_REGS` in 64 Ki registers.
pub const BF16_WGMMA_192X192_CONSUMER_REGS: u32 = 152;

/// The persistent twin of a bf16 `wgmma` tile (same `bm x bn`), if it has one.
pub fn bf16_wgmma_persistent_twin(tile: &TileShape) -> Option<TileShape> {
    MATMUL_BF16_WGMMA_PERSISTENT
        .iter()
        .find(|p| p.bm == tile.bm && p.bn == tile.bn)
        .copied()
}

/// Parameters of the bf16 `wgmma` kernels: `out = inp · weightᵀ (+ bias)
/// (GELU)` with `inp` `[n, c]` and `weight` `[oc, c]` bf16, described by
/// tensor maps (element bf16, box [`MATMUL_BF16_WGMMA_BK`] x the tile's rows,
/// 128-byte swizzle), f32 accumulation.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulBf16WgmmaParams {
    pub inp_map: *const TensorMap,
    pub weight_map: *const TensorMap,
    /// Null, or a map of the output (`out_bf16`, else `out`; unsplit; with
    /// `kv`, a kernel of one tile a block) as
    /// [`MatmulTf32WgmmaParams::out_map`](super::matmul_tf32::MatmulTf32WgmmaParams::out_map)
    /// describes.
    pub out_map: *const TensorMap,
    /// `[n, oc]` f32, 16-byte aligned; written unless `out_bf16` is set.
    pub out: *mut f32,
    /// Null, or `[n, oc]` bf16 bits (8-byte aligned) written instead of
    /// `out` (rounded to nearest even), for a bf16 matmul that reads it next.
    pub out_bf16: *mut u16,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    /// A multiple of 8 (16-byte rows for the tensor maps).
    pub c: u32,
    pub oc: u32,
    /// Nonzero: GELU (tanh approximation) after the bias.
    pub gelu: u32,
    /// Split-K as in `MatmulTf32WgmmaParams` (f32 `out` only; then `bias`
    /// null and `gelu` 0).
    pub k_tiles_per_split: u32,
    /// Null, or (a qkv matmul: f32 `out`, `oc = 3C`, unsplit) the bf16 KV
    /// caches `[B][NH][kv.max_t][QKV_CACHE_HEAD_SIZE]` into which output columns `C..2C`
    /// (keys) and `2C..3C` (values) also go, rounded to nearest even, so the
    /// attention that reads the caches next needs no store kernel.
    pub kv: QkvCacheOut,
}

/// Head size of the KV caches a qkv matmul fills
/// ([`MatmulBf16WgmmaParams::kv`]): the flash attention kernels', which
/// read them (a constant, so the epilogue's index math is shifts).
pub const QKV_CACHE_HEAD_SIZE: u32 = super::flash_attention::FLASH_HEAD_SIZE;

/// Where a qkv matmul's keys and values also go
/// ([`MatmulBf16WgmmaParams::kv`]): output row `r` is sequence `r / t`'s
/// position `pos0 + r % t`, in caches of `max_t` positions a head and
/// `C / QKV_CACHE_HEAD_SIZE` heads a sequence (8-byte aligned, every index
/// within u32). `k` null: none.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct QkvCacheOut {
    pub k: *mut u16,
    pub v: *mut u16,
    pub t: u32,
    pub pos0: u32,
    pub max_t: u32,
}

impl QkvCacheOut {
    /// No cache: the matmul writes `out` alone.
    pub const NONE: QkvCacheOut = QkvCacheOut {
        k: core::ptr::null_mut(),
        v: core::ptr::null_mut(),
        t: 1,
        pos0: 0,
        max_t: 1,
    };
}

// SAFETY: repr(C) structs of plain numbers and device pointers, the same
// layout on host and device.
crate::kernel_params!(unsafe MatmulBf16WgmmaParams);
