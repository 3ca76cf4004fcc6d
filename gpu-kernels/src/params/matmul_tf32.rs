//! `out[N,OC] = inp[N,C] · W[OC,C]ᵀ (+ bias[OC]) (then GELU if asked)` on the
//! TF32 tensor cores (`mma.sync.m16n8k8`), f32 accumulate.
//!
//! One kernel body, monomorphised into a few tile shapes, each exported
//! under its own PTX name so the host (and the `tune` binary) can pick per
//! GEMM shape. The shapes are described by [`TileShape`]; the kernels read
//! their shape from the same constants, so host launch configurations and
//! device code cannot disagree.

/// Rows (of `k`) staged in shared memory per pipeline stage.
pub const MATMUL_TF32_BK: u32 = 32;
/// Padding (floats) appended to every shared-memory row of `BK` floats: with a
/// row stride of 36 words, the fragment reads `row = lane/4, col = lane%4`
/// land in banks `4*row + col`, all 32 distinct, and rows stay 16-byte
/// aligned for `cp.async`.
pub const MATMUL_TF32_PAD: u32 = 4;
/// Padding (floats) of each row of the output tile the epilogue stages in
/// shared memory (bank-conflict-free 8-byte fragment stores).
pub const MATMUL_TF32_EPI_PAD: u32 = 8;
/// Blocks along M processed together before moving along N (grouped
/// rasterisation): a wave of blocks then shares a few row panels of `inp` and
/// a band of `W`, so both are re-read from L2 rather than from DRAM.
pub const MATMUL_TF32_GROUP_M: u32 = 8;

/// A block tile `bm x bn`, split among warps each computing `wm x wn`, with
/// `stages` cp.async pipeline stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileShape {
    pub name: &'static str,
    pub bm: u32,
    pub bn: u32,
    pub wm: u32,
    pub wn: u32,
    pub stages: u32,
    /// Blocks of this shape expected to be resident on one sm_90 SM: the
    /// smaller of what its registers (ptxas 13 `-v` for sm_90, x threads;
    /// 64 Ki registers per SM) and its shared memory (228 KiB per SM) allow.
    /// Only the host's tile chooser reads it; `tests/gpu/matmul_tf32.rs`
    /// checks it against the driver's occupancy calculator.
    pub blocks_per_sm: u32,
}

impl TileShape {
    /// Warps per block.
    pub const fn warps(&self) -> u32 {
        (self.bm / self.wm) * (self.bn / self.wn)
    }
    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        self.warps() * 32
    }
    /// Dynamic shared memory per block: `stages` copies of an A and a B
    /// tile (the epilogue's output tile reuses it and is smaller).
    pub const fn shared_bytes(&self) -> u32 {
        self.stages * (self.bm + self.bn) * (MATMUL_TF32_BK + MATMUL_TF32_PAD) * 4
    }
}

/// 128x192 block, 8 warps of 64x48, 3 stages (138.2 KiB shared): the
/// largest tile (least shared-memory traffic per mma: 112 words per 6x4
/// mma step); one wave of it covers M=1024 x N=2304 or 3072 in 96 or 128
/// blocks, where 128x128 needs two waves of 144 or 192 on 132 SMs.
pub const MATMUL_TF32_128X192: TileShape = TileShape {
    name: "matmul_forward_tf32_128x192",
    bm: 128,
    bn: 192,
    wm: 64,
    wn: 48,
    stages: 3,
    blocks_per_sm: 1,
};
/// 128x128 block, 8 warps of 64x32, 4 stages (147.5 KiB shared): large GEMMs.
/// One block per SM (ptxas: ~172 registers x 256 threads), so the pipeline is
/// one stage deeper than the smaller tiles' to cover DRAM latency alone.
pub const MATMUL_TF32_128X128: TileShape = TileShape {
    name: "matmul_forward_tf32_128x128",
    bm: 128,
    bn: 128,
    wm: 64,
    wn: 32,
    stages: 4,
    blocks_per_sm: 1,
};
/// 128x64 block, 4 warps of 64x32, 4 stages (110.6 KiB): two blocks per SM.
pub const MATMUL_TF32_128X64: TileShape = TileShape {
    name: "matmul_forward_tf32_128x64",
    bm: 128,
    bn: 64,
    wm: 64,
    wn: 32,
    stages: 4,
    blocks_per_sm: 2,
};
/// 64x64 block, 4 warps of 32x32, 3 stages (55.3 KiB): medium GEMMs.
pub const MATMUL_TF32_64X64: TileShape = TileShape {
    name: "matmul_forward_tf32_64x64",
    bm: 64,
    bn: 64,
    wm: 32,
    wn: 32,
    stages: 3,
    blocks_per_sm: 4,
};
/// 32x64 block, 4 warps of 16x32, 4 stages (55.3 KiB): small M (decode, short
/// prompts), where more blocks are needed to fill the GPU.
pub const MATMUL_TF32_32X64: TileShape = TileShape {
    name: "matmul_forward_tf32_32x64",
    bm: 32,
    bn: 64,
    wm: 16,
    wn: 32,
    stages: 4,
    blocks_per_sm: 4,
};

/// Every compiled tile shape, for tuning sweeps.
pub const MATMUL_TF32_VARIANTS: [TileShape; 5] = [
    MATMUL_TF32_128X192,
    MATMUL_TF32_128X128,
    MATMUL_TF32_128X64,
    MATMUL_TF32_64X64,
    MATMUL_TF32_32X64,
];

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MatmulTf32Params {
    /// `[n, oc]`, written.
    pub out: *mut f32,
    /// `[n, c]`.
    pub inp: *const f32,
    /// `[oc, c]` (PyTorch's (out, in) layout).
    pub weight: *const f32,
    /// `[oc]`, or null for no bias.
    pub bias: *const f32,
    pub n: u32,
    /// Inner dimension; must be a multiple of 4 (16-byte rows for cp.async).
    pub c: u32,
    pub oc: u32,
    /// Nonzero: apply GELU (tanh approximation) after the bias.
    pub gelu: u32,
}

crate::kernel_params!(MatmulTf32Params);
