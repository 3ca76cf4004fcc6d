//! Tensor cores (TF32 and bf16 `mma.sync`) and asynchronous copies (`cp.async`).
//!
//! Fragment layout of `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`
//! (PTX ISA), with `g = lane / 4` and `t = lane % 4`:
//! - A (16x8, row-major): a0 = A\[g\]\[t\], a1 = A\[g+8\]\[t\], a2 = A\[g\]\[t+4\], a3 = A\[g+8\]\[t+4\]
//! - B (8x8, "col", i.e. B\[k\]\[n\] read as column n): b0 = B\[t\]\[g\], b1 = B\[t+4\]\[g\]
//! - C/D (16x8): c0 = C\[g\]\[2t\], c1 = C\[g\]\[2t+1\], c2 = C\[g+8\]\[2t\], c3 = C\[g+8\]\[2t+1\]
//!
//! GPT-2's linear weights are stored (out, in), so `W[n][k]` is exactly the
//! "col" B operand of `out = inp · Wᵀ`.
//!
//! Fragment layout of `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`:
//! each A/B register holds two bf16 of consecutive k, the lower k in the
//! lower 16 bits (as two consecutive bf16 of a K-contiguous row load):
//! - A (16x16): a0 = A\[g\]\[2t..2t+2\], a1 = A\[g+8\]\[2t..2t+2\], a2 = A\[g\]\[2t+8..2t+10\], a3 = A\[g+8\]\[2t+8..2t+10\]
//! - B (16x8, "col"): b0 = B\[2t..2t+2\]\[g\], b1 = B\[2t+8..2t+10\]\[g\]
//! - C/D: as for m16n8k8 above.

use core::arch::asm;

/// Round an f32 to TF32 (10-bit mantissa, round to nearest, ties away),
/// returned as the 32-bit pattern `mma` expects.
#[inline(always)]
pub fn to_tf32(x: f32) -> u32 {
    let r: u32;
    // SAFETY: a register-only conversion.
    unsafe { asm!("cvt.rna.tf32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(pure, nomem, nostack)) }
    r
}

/// `v` as a sum of two TF32 values (big, small): the small one carries the
/// 13 bits TF32 drops, rounded to 11. Three TF32 products of such halves
/// (small·big + big·small + big·big; small·small, ~2^-22 of the product,
/// dropped) keep FP32's accuracy on the tensor cores ("3xTF32").
#[inline(always)]
pub fn split_tf32(v: f32) -> (u32, u32) {
    let big = to_tf32(v);
    (big, to_tf32(v - f32::from_bits(big)))
}

/// D = A·B + C on one 16x8x8 tile, TF32 inputs, f32 accumulate. Fragments as
/// in the module docs; every lane of the warp must call it together.
#[inline(always)]
pub fn mma_m16n8k8_tf32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = [0f32; 4];
    // SAFETY: register-only warp-wide instruction; all lanes participate
    // (sm_80+; the crate's PTX targets sm_80 or later).
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
            d0 = out(reg32) d[0], d1 = out(reg32) d[1], d2 = out(reg32) d[2], d3 = out(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            // Registers only; not `pure`, so it is never speculated into divergent code.
            options(nomem, nostack),
        );
    }
    d
}

/// Shared-memory address of a generic pointer into shared memory (for `cp.async`, `ldmatrix`).
///
/// # Safety
/// `p` must point into this block's shared memory.
#[inline(always)]
pub unsafe fn shared_addr<T>(p: *const T) -> u32 {
    let r: u64;
    // The address travels as an integer: cvta converts it and reads nothing.
    let generic = p as u64;
    // SAFETY: cvta only converts the address; the caller promises it is shared.
    unsafe {
        asm!("cvta.to.shared.u64 {r}, {p};", r = out(reg64) r, p = in(reg64) generic, options(pure, nomem, nostack))
    }
    r as u32
}

/// Start an asynchronous 16-byte copy global -> shared (`cp.async.cg`, bypassing L1).
///
/// # Safety
/// `dst` points to 16 bytes of this block's shared memory, `src` to 16
/// readable bytes of global memory; both 16-byte aligned. The data may be read
/// only after [`cp_async_wait_group`] and a barrier.
#[inline(always)]
pub unsafe fn cp_async_16(dst: *mut f32, src: *const f32) {
    // SAFETY: the caller gives `dst` as 16 aligned bytes of this block's shared
    // memory (so `shared_addr` maps it) and `src` as 16 readable aligned global bytes.
    unsafe {
        let d = shared_addr(dst);
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) d, s = in(reg64) src);
    }
}

/// Like [`cp_async_16`], but copies only `src_bytes` (0 or 16) and fills the
/// rest with zeros: the way to load a tile edge without reading out of bounds.
///
/// # Safety
/// As for [`cp_async_16`]; `src` must be readable for `src_bytes` bytes.
#[inline(always)]
pub unsafe fn cp_async_16_zfill(dst: *mut f32, src: *const f32, src_bytes: u32) {
    // SAFETY: as for `cp_async_16`; the caller keeps `src_bytes` within what `src` can read.
    unsafe {
        let d = shared_addr(dst);
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) d, s = in(reg64) src, n = in(reg32) src_bytes);
    }
}

/// Start an asynchronous 4-byte copy global -> shared (`cp.async.ca`):
/// for values too few or too unaligned for [`cp_async_16`].
///
/// # Safety
/// `dst` points to 4 bytes of this block's shared memory, `src` to 4
/// readable bytes of global memory; both 4-byte aligned. As for
/// [`cp_async_16`], read only after [`cp_async_wait_group`] and a barrier.
#[inline(always)]
pub unsafe fn cp_async_4(dst: *mut f32, src: *const f32) {
    // SAFETY: the caller gives `dst` as 4 aligned bytes of this block's shared memory and
    // `src` as 4 readable aligned global bytes.
    unsafe {
        let d = shared_addr(dst);
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) d, s = in(reg64) src);
    }
}

/// Close the group of `cp.async` copies issued so far by this thread.
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: bookkeeping only.
    unsafe { asm!("cp.async.commit_group;") }
}

/// Wait until at most `N` of this thread's committed groups are still in flight.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.wait_group {n};", n = const N) }
}

/// Two f32 rounded to bf16 (to nearest, ties to even) and packed as one
/// `mma` bf16 register: `lo` in bits 0..16 (the lower k, i.e. the element at
/// the lower address of a K-contiguous row), `hi` in bits 16..32.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let r: u32;
    // SAFETY: a register-only conversion (sm_80+). `cvt.rn.bf16x2.f32 d, a, b`
    // puts `a` in the upper half of `d`, `b` in the lower.
    unsafe {
        asm!(
            "cvt.rn.bf16x2.f32 {r}, {hi}, {lo};",
            r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
            options(pure, nomem, nostack),
        )
    }
    r
}

/// Four 8x8 matrices of 16-bit elements from shared memory, transposed
/// (`ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`): lanes `8i..8i+8`
/// give the shared addresses of matrix `i`'s eight 16-byte rows, and lane
/// `(g, t) = (lane / 4, lane % 4)` receives in word `i` elements `(2t, g)`
/// and `(2t + 1, g)` of matrix `i` (row, column; the lower row in the low
/// half). With rows as the k index, that is an `mma` B fragment (`b0, b1`
/// for k `2t, 2t + 1`, n `g`) of row-major data. Every lane of the warp
/// must call it together.
///
/// # Safety
/// `addr` is a shared-window address (see [`shared_addr`]) of 16 readable,
/// 16-byte aligned bytes of this block's shared memory.
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let d: [u32; 4];
    // SAFETY: the caller's contract; a warp-wide read of shared memory.
    unsafe {
        let (d0, d1, d2, d3): (u32, u32, u32, u32);
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{d0}, {d1}, {d2}, {d3}}}, [{a}];",
            d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
            a = in(reg32) addr,
            options(readonly, nostack),
        );
        d = [d0, d1, d2, d3];
    }
    d
}

/// D = A·B + C on one 16x8x16 tile, bf16 inputs (two per register, see
/// the module docs), f32 accumulate. Every lane of the warp must call it
/// together.
#[inline(always)]
pub fn mma_m16n8k16_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = [0f32; 4];
    // SAFETY: register-only warp-wide instruction; all lanes participate
    // (sm_80+; the crate's PTX targets sm_80 or later).
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
            d0 = out(reg32) d[0], d1 = out(reg32) d[1], d2 = out(reg32) d[2], d3 = out(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            // Registers only; not `pure`, so it is never speculated into divergent code.
            options(nomem, nostack),
        );
    }
    d
}
