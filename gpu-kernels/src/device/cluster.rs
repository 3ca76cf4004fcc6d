//! Thread block clusters (sm_90): blocks launched together on one GPC that
//! meet at a hardware barrier and read each other's shared memory
//! (distributed shared memory).
//!
//! The cluster's shape comes from the launch (the host's cluster-dimension
//! launch attribute); [`cluster_ctarank`] numbers the blocks in it. A block's
//! shared memory lives as long as the block, so a block whose shared memory
//! others read must not exit before they are done: end such a section with
//! [`cluster_sync`] in every block.
//!
//! Only code compiled for sm_90 or later may call these (the PTX assembler
//! rejects them for older targets); the crate's `sm90a` feature gates the
//! kernels that do.

use core::arch::asm;

use super::mma::shared_addr;

/// This block's rank in its cluster (`%cluster_ctarank`), `0..cluster size`.
#[inline(always)]
pub fn cluster_ctarank() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(pure, nomem, nostack)) };
    r
}

/// A barrier across every thread of every block of the cluster, which
/// also orders memory: shared-memory writes any thread made before it are
/// visible to every thread of the cluster after it (`barrier.cluster.arrive`
/// with release semantics, then `barrier.cluster.wait`, acquire).
///
/// Every thread of every block in the cluster must reach it, the same
/// number of times (like [`super::sync_threads`], across blocks).
#[inline(always)]
pub fn cluster_sync() {
    // SAFETY: a barrier; no memory-safety preconditions. Not `nomem`: it
    // orders the cluster's memory accesses.
    unsafe {
        asm!(
            "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;",
            options(nostack)
        )
    };
}

/// A barrier across every thread of every block of the cluster that orders
/// no memory (`barrier.cluster.arrive.relaxed`, then `barrier.cluster.wait`):
/// it keeps every block resident until all have arrived, so that blocks
/// still reading others' shared memory find it there. Cheaper than
/// [`cluster_sync`], which waits for this block's memory operations to be
/// visible before arriving.
///
/// A thread that read another block's shared memory must have used the
/// values before arriving (a load whose value was consumed has completed),
/// and no thread may rely on this barrier to see another's writes.
///
/// Every thread of every block in the cluster must reach it, as for
/// [`cluster_sync`].
#[inline(always)]
pub fn cluster_sync_relaxed() {
    // SAFETY: a barrier; no memory-safety preconditions.
    unsafe {
        asm!(
            "barrier.cluster.arrive.relaxed.aligned; barrier.cluster.wait.aligned;",
            options(nostack)
        )
    };
}

/// The address, in the cluster's shared window, of the variable that `p`
/// points to in this block's shared memory, but in block `rank`'s copy
/// (`mapa.shared::cluster`): every block of a kernel has the same layout.
///
/// # Safety
/// `p` points into this block's shared memory; `rank` is below the
/// cluster's size.
#[inline(always)]
pub unsafe fn cluster_shared_addr<T>(p: *const T, rank: u32) -> u32 {
    let r: u32;
    // SAFETY: the caller's contract; mapa only computes an address.
    unsafe {
        let a = shared_addr(p);
        asm!("mapa.shared::cluster.u32 {r}, {a}, {k};", r = out(reg32) r, a = in(reg32) a, k = in(reg32) rank,
            options(pure, nomem, nostack));
    }
    r
}

/// `u32` at `addr` in the cluster's shared window (`ld.shared::cluster`).
///
/// # Safety
/// `addr` comes from [`cluster_shared_addr`] for a 4-byte aligned `u32`;
/// the owning block has not exited, and its write of the value is ordered
/// before this load (a [`cluster_sync`] between them).
#[inline(always)]
pub unsafe fn load_cluster_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe { asm!("ld.shared::cluster.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack)) };
    v
}

/// `u64` at `addr` in the cluster's shared window; as [`load_cluster_u32`]
/// for an 8-byte aligned `u64`.
///
/// # Safety
/// As for [`load_cluster_u32`], 8-byte aligned.
#[inline(always)]
pub unsafe fn load_cluster_u64(addr: u32) -> u64 {
    let v: u64;
    // SAFETY: the caller's contract.
    unsafe { asm!("ld.shared::cluster.u64 {v}, [{a}];", v = out(reg64) v, a = in(reg32) addr, options(nostack)) };
    v
}
