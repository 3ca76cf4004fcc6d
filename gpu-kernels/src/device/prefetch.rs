//! L2 prefetch: ask the memory system to bring a range into L2 without
//! waiting for it and without using registers.
//!
//! A decode step streams every weight once, through ~60 dependent kernels.
//! Between the kernels (and while attention runs) HBM would sit idle; a
//! kernel that prefetches the weights of the kernels after it keeps HBM
//! busy, and those kernels then read from L2.

use core::arch::asm;

#[cfg(not(feature = "sm90a"))]
use super::block_dim_x;
use super::thread_idx_x;

/// Bytes of one cache line: the granule of the per-line prefetch.
pub const L2_LINE_BYTES: usize = 128;
/// Bytes one bulk prefetch instruction asks for (the instruction takes up
/// to 4 GiB; smaller pieces spread the work over the memory partitions
/// sooner).
pub const BULK_PREFETCH_BYTES: usize = 32 * 1024;

/// Prefetch part `part` of `parts` equal slices of `[base, base + bytes)`
/// into L2 (the slices are rounded to whole cache lines, the last one
/// clipped to the range). Every thread of the block calls it with the same
/// arguments. A hint: it has no effect on the values any load returns.
///
/// On the sm_90a module, thread 0 issues `cp.async.bulk.prefetch.L2`
/// (the TMA unit fetches, the block goes on at once); elsewhere the threads
/// share one `prefetch.global.L2` per line.
///
/// # Safety
/// `[base, base + bytes)` is global memory the kernel may read; `base` is
/// 16-byte aligned and `bytes % 16 == 0`; `part < parts`.
#[inline(always)]
pub unsafe fn prefetch_l2_slice(base: *const u8, bytes: usize, part: usize, parts: usize) {
    let per = bytes.div_ceil(parts).next_multiple_of(L2_LINE_BYTES);
    let lo = (part * per).min(bytes);
    let hi = (lo + per).min(bytes);
    #[cfg(feature = "sm90a")]
    if thread_idx_x() == 0 {
        let mut at = lo;
        while at < hi {
            let n = (hi - at).min(BULK_PREFETCH_BYTES);
            // SAFETY: [at, at + n) lies inside the caller's range; at and n
            // are multiples of 16 (lo is a multiple of the line size).
            unsafe {
                asm!(
                    "{{ .reg .b64 g; cvta.to.global.u64 g, {p}; cp.async.bulk.prefetch.L2.global [g], {n}; }}",
                    p = in(reg64) base.add(at),
                    n = in(reg32) n as u32,
                    options(nostack),
                )
            };
            at += n;
        }
    }
    #[cfg(not(feature = "sm90a"))]
    {
        let mut at = lo + thread_idx_x() as usize * L2_LINE_BYTES;
        let step = block_dim_x() as usize * L2_LINE_BYTES;
        while at < hi {
            // SAFETY: at < hi: inside the caller's range.
            unsafe {
                asm!(
                    "{{ .reg .b64 g; cvta.to.global.u64 g, {p}; prefetch.global.L2 [g]; }}",
                    p = in(reg64) base.add(at),
                    options(nostack),
                )
            };
            at += step;
        }
    }
}
