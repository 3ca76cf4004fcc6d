//! `out[N,OC] = round_bf16(inp[N,C]) · W[OC,C]ᵀ (+ bias[OC]) (then GELU if
//! asked)` on the bf16 tensor cores (`mma.sync.m16n8k16`), f32 accumulate:
//! the prefill matmul of an engine that keeps its weights in bf16. `inp`
//! stays f32 in memory; the kernel rounds it to bf16 (to nearest, ties to
//! even) as it stages it.
//!
//! One kernel body, monomorphised into the tile shapes below, each exported
//! under its own PTX name; the kernels read their shape from the same
//! constants, so host launch configurations and device code cannot disagree.

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

crate::kernel_params!(MatmulBf16Params);
