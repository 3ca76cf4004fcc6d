//! Hopper's tensor memory accelerator (TMA) and the `mbarrier`s that track
//! it (sm_90).
//!
//! A TMA copy moves a whole 2-D box of a tensor from global to shared memory
//! (or back, [`tma_store_2d`]) on the copy engine, described by a tensor
//! map the host encodes (`cuTensorMapEncodeTiled`): no thread computes an
//! address or touches the data. Boxes that stick out of the tensor are
//! zero-filled when loaded and clipped when stored. The copy
//! announces its bytes to an `mbarrier` in shared memory
//! (`complete_tx::bytes`); the barrier's phase completes when its expected
//! arrivals and bytes are all in, and threads wait for that phase by parity.
//! TMA writes through the async proxy, so `wgmma` may read the data as soon
//! as the phase is observed complete (no proxy fence).
//!
//! Barrier addresses are shared-window addresses (`mma::shared_addr`).

use core::arch::asm;

/// Bytes of an `mbarrier` object in shared memory (8-byte aligned).
pub const MBARRIER_BYTES: u32 = 8;

/// Initialise the barrier at `bar` to expect `arrivals` arrivals per phase.
///
/// # Safety
/// `bar` is an 8-byte aligned shared-memory address no other thread uses
/// until a [`fence_mbarrier_init`] and a block barrier have followed.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, arrivals: u32) {
    // SAFETY: `bar` is aligned shared memory that no other thread touches before the
    // init fence and a barrier (the caller's contract), so the init does not race.
    unsafe { asm!("mbarrier.init.shared::cta.b64 [{b}], {n};", b = in(reg32) bar, n = in(reg32) arrivals) }
}

/// Make this thread's `mbarrier_init`s visible to the other threads' and the
/// copy engine's later barrier operations (then a block barrier).
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence.
    unsafe { asm!("fence.mbarrier_init.release.cluster;") }
}

/// Arrive on `bar` once.
///
/// # Safety
/// `bar` is an initialised barrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    let _state: u64;
    // SAFETY: the caller's `bar` is an initialised barrier in this block's shared memory.
    unsafe { asm!("mbarrier.arrive.shared::cta.b64 {s}, [{b}];", s = out(reg64) _state, b = in(reg32) bar) }
}

/// Arrive on `bar` once and add `bytes` to the transaction count the
/// current phase waits for (the bytes the TMA copies issued next deliver).
///
/// # Safety
/// `bar` is an initialised barrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, bytes: u32) {
    let _state: u64;
    // SAFETY: the caller's `bar` is an initialised barrier in this block's shared memory.
    unsafe {
        asm!(
            "mbarrier.arrive.expect_tx.shared::cta.b64 {s}, [{b}], {n};",
            s = out(reg64) _state,
            b = in(reg32) bar,
            n = in(reg32) bytes,
        )
    }
}

/// Whether the phase of `bar` with parity `parity` (0 or 1) has completed
/// (the hardware may suspend the thread for a while before answering).
///
/// # Safety
/// `bar` is an initialised barrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(bar: u32, parity: u32) -> bool {
    let done: u32;
    // SAFETY: the caller's `bar` is an initialised barrier in this block's shared memory;
    // the wait only reads it.
    unsafe {
        asm!(
            "{{",
            ".reg .pred p;",
            "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {par};",
            "selp.u32 {d}, 1, 0, p;",
            "}}",
            d = out(reg32) done,
            b = in(reg32) bar,
            par = in(reg32) parity,
        )
    }
    done != 0
}

/// Wait until the phase of `bar` with parity `parity` has completed. Phase
/// `k` (counting from 0) of a barrier has parity `k % 2`.
///
/// # Safety
/// `bar` is an initialised barrier in this block's shared memory whose
/// phase will complete (else this spins forever).
#[inline(always)]
pub unsafe fn mbarrier_wait_parity(bar: u32, parity: u32) {
    // SAFETY: the caller's contract is `mbarrier_try_wait_parity`'s, forwarded unchanged.
    while !unsafe { mbarrier_try_wait_parity(bar, parity) } {}
}

/// Start a TMA copy of the 2-D box at element coordinates (`x` innermost,
/// `y`) of the tensor described by the tensor map at generic address
/// `tensor_map` into shared memory at `dst`, completing on `bar`.
///
/// # Safety
/// `tensor_map` is the generic address of a valid tensor map (64-byte
/// aligned, in global, constant or parameter memory) for a live tensor; `dst` is a shared address with room for
/// the box, aligned as the map's swizzle mode requires (1024 bytes for the
/// 128-byte swizzle); `bar` is an initialised barrier whose current phase
/// expects these bytes ([`mbarrier_arrive_expect_tx`]); `dst` is not read
/// until that phase completes.
#[inline(always)]
pub unsafe fn tma_load_2d(dst: u32, tensor_map: u64, x: i32, y: i32, bar: u32) {
    // SAFETY: the caller vouches for the map, `dst`'s room and alignment, and a phase of
    // `bar` expecting these bytes; no one reads `dst` before it completes.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
            d = in(reg32) dst,
            m = in(reg64) tensor_map,
            x = in(reg32) x,
            y = in(reg32) y,
            b = in(reg32) bar,
        )
    }
}

/// Start a TMA copy of the 2-D box at element coordinates (`x` innermost,
/// `y`) of the tensor described by `tensor_map` *from* shared memory at
/// `src` to global memory (`cp.async.bulk.tensor.2d.global.shared::cta`),
/// tracked by this thread's bulk-async group ([`bulk_commit_group`],
/// [`bulk_wait_group_read_all`]). Parts of the box outside the tensor are
/// not written.
///
/// # Safety
/// `tensor_map` is the generic address of a valid tensor map (as for
/// [`tma_load_2d`]) of a live tensor that nothing else reads or writes in
/// the box's range until this grid ends; `src` is a shared address holding
/// the box in the map's layout (its swizzle's alignment), written through
/// the generic proxy only before a [`fence_proxy_async_shared`] by each
/// writer and a barrier with this thread, and left unwritten until
/// [`bulk_wait_group_read_all`] returns.
#[inline(always)]
pub unsafe fn tma_store_2d(tensor_map: u64, x: i32, y: i32, src: u32) {
    // SAFETY: the caller vouches for the map, the box in `src` (fenced and published), and
    // that nobody touches `src` or the box's global range until the group's read completes.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [{m}, {{{x}, {y}}}], [{s}];",
            m = in(reg64) tensor_map,
            x = in(reg32) x,
            y = in(reg32) y,
            s = in(reg32) src,
            options(nostack),
        )
    }
}

/// Close this thread's bulk-async group: the bulk copies it started since
/// the last commit ([`tma_store_2d`]) become one group to wait for.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: bookkeeping of this thread's own bulk copies.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// Wait until every committed bulk-async group of this thread has finished
/// *reading* its shared-memory source (the writes to global may still be
/// in flight; they are visible to later grids once this one ends), so that
/// memory may be reused or the block may exit.
#[inline(always)]
pub fn bulk_wait_group_read_all() {
    // SAFETY: a wait on this thread's own bulk copies.
    unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) }
}

/// [`bulk_wait_group_read_all`], but leaving the newest `pending` groups
/// (at most [`BULK_WAIT_PENDING_MAX`]; more waits as for that many):
/// frees the sources of all the older ones, as a ring of store buffers
/// needs. Pass a constant; the choice of instruction then folds away.
#[inline(always)]
pub fn bulk_wait_group_read(pending: u32) {
    // The count is an immediate of the instruction, hence one asm a value.
    // SAFETY: a wait on this thread's own bulk copies.
    unsafe {
        match pending {
            0 => asm!("cp.async.bulk.wait_group.read 0;", options(nostack)),
            1 => asm!("cp.async.bulk.wait_group.read 1;", options(nostack)),
            2 => asm!("cp.async.bulk.wait_group.read 2;", options(nostack)),
            _ => asm!("cp.async.bulk.wait_group.read 3;", options(nostack)),
        }
    }
}

/// The most groups [`bulk_wait_group_read`] leaves pending.
pub const BULK_WAIT_PENDING_MAX: u32 = 3;

/// Start a bulk copy (no tensor map) of `bytes` contiguous bytes from global
/// `src` to shared `dst`, completing on `bar`
/// (`cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`).
///
/// # Safety
/// `src` and `dst` are 16-byte aligned, `bytes % 16 == 0`; `bytes` at `src`
/// are readable and stay unwritten until the copy completes; `dst` is a
/// shared address with room for them that no thread reads or writes until
/// `bar`'s current phase, which expects these bytes
/// ([`mbarrier_arrive_expect_tx`]), completes.
#[inline(always)]
pub unsafe fn bulk_copy_to_shared(dst: u32, src: *const u8, bytes: u32, bar: u32) {
    // SAFETY: the caller gives aligned, readable `src` bytes left unwritten, room at
    // `dst` nobody touches, and a phase of `bar` expecting these bytes.
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
            d = in(reg32) dst,
            s = in(reg64) src,
            n = in(reg32) bytes,
            b = in(reg32) bar,
            options(nostack),
        )
    }
}

/// [`bulk_copy_to_shared`], its bytes marked first to leave L2
/// (`.L2::cache_hint` with an `evict_first` policy): for data read once,
/// so it does not evict what is read again (activations, caches).
///
/// # Safety
/// As for [`bulk_copy_to_shared`].
#[inline(always)]
pub unsafe fn bulk_copy_to_shared_evict_first(dst: u32, src: *const u8, bytes: u32, bar: u32) {
    // SAFETY: as for `bulk_copy_to_shared`; the policy is only a hint.
    unsafe {
        asm!(
            "{{ .reg .b64 pol; createpolicy.fractional.L2::evict_first.b64 pol, 1.0; cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{s}], {n}, [{b}], pol; }}",
            d = in(reg32) dst,
            s = in(reg64) src,
            n = in(reg32) bytes,
            b = in(reg32) bar,
            options(nostack),
        )
    }
}

/// Order this thread's earlier shared-memory accesses (through the generic
/// proxy: ordinary loads and stores) before its later async-proxy ones (TMA
/// and bulk copies): issued before a copy overwrites shared memory the
/// block has been reading (after a block barrier that ends those reads).
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}
