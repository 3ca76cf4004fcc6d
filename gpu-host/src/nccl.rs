//! Collectives across the GPUs of one process, through NCCL (feature
//! `nccl`; the library is loaded at run time like the CUDA libraries, so a
//! build needs no NCCL).
//!
//! [`Collective`] holds one NCCL communicator per [`Gpu`], made with
//! `ncclCommInitAll` (one process, one thread driving every rank), each on
//! its GPU's own stream: a collective is ordered after the kernels queued
//! before it and before those queued after, as any other work of that
//! [`Gpu`], which keeps [`crate::runtime`]'s one-stream invariant (and so
//! needs no `unsafe` here). A call covers every rank at once, inside one
//! NCCL group: one thread cannot issue a blocking collective per rank.
//!
//! Run one [`Collective`]'s calls at a time on a set of GPUs: communicators
//! used from several threads at once on the same GPUs can deadlock (each
//! one's kernels wait for their peers while the other's occupy the GPU).
//!
//! NVLink multicast (NVLS) stays off: on shared multi-GPU hosts a program
//! that uses it can take the GPUs out of service. [`Collective::new`]
//! refuses to start NCCL unless `NCCL_NVLS_ENABLE=0` is in the environment
//! (NCCL reads it then); a program sets it with [`keep_nvls_off`] first
//! thing in `main`, as this workspace's programs do, or its user exports it.

use cudarc::driver::{CudaSlice, DeviceRepr};
use cudarc::nccl::{Comm, ReduceOp, result as nccl};

use crate::Gpu;

/// NCCL's switch for NVLink multicast; our programs set it to "0".
pub const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";

/// Why a collective could not be made or run.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    #[error(
        "NCCL was not found (no libnccl.so could be loaded): install NCCL (e.g. the libnccl2 and libnccl-dev packages, \
         or PyTorch's nvidia-nccl wheel) and put the folder with libnccl.so on LD_LIBRARY_PATH"
    )]
    Absent,
    #[error(
        "NVLink multicast must stay off: set NCCL_NVLS_ENABLE=0 in the environment (or call \
         gpu_host::nccl::keep_nvls_off() at the start of main)"
    )]
    NvlsOn,
    #[error("a collective needs distinct GPUs, got device {0} twice")]
    SameDevice(usize),
    #[error("a collective needs at least one GPU")]
    Empty,
    #[error("{0} buffers for {1} ranks")]
    RankCount(usize, usize),
    #[error("rank {rank}'s buffer holds {have} values, the call needs {need}")]
    Lengths { rank: usize, have: usize, need: usize },
    #[error("NCCL error in {0}: {1:?}")]
    Nccl(&'static str, nccl::NcclError),
}

/// Sets [`NVLS_ENV`] to "0" for this process, so NCCL keeps NVLink
/// multicast off.
///
/// # Safety
/// As [`std::env::set_var`]: no other thread may read or write the
/// environment meanwhile. Call it at the start of `main`, before any thread
/// starts.
pub unsafe fn keep_nvls_off() {
    // SAFETY: the caller promises no other thread touches the environment.
    unsafe { std::env::set_var(NVLS_ENV, "0") }
}

/// One communicator per GPU, rank `i` on the `i`-th GPU given to [`Collective::new`].
pub struct Collective {
    comms: Vec<Comm>,
    ordinals: Vec<usize>,
}

/// Ends an NCCL group when dropped, so an error inside it cannot leave the
/// thread's group open.
struct GroupGuard;

impl GroupGuard {
    fn start() -> Result<GroupGuard, CollectiveError> {
        nccl::group_start().map_err(|e| CollectiveError::Nccl("ncclGroupStart", e))?;
        Ok(GroupGuard)
    }

    /// End the group, reporting its error (dropping ends it too, silently).
    fn end(self) -> Result<(), CollectiveError> {
        std::mem::forget(self);
        nccl::group_end()
            .map(|_| ())
            .map_err(|e| CollectiveError::Nccl("ncclGroupEnd", e))
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = nccl::group_end();
    }
}

impl Collective {
    /// Communicators over `gpus` (distinct devices), rank `i` on `gpus[i]`.
    pub fn new(gpus: &[&Gpu]) -> Result<Collective, CollectiveError> {
        if gpus.is_empty() {
            return Err(CollectiveError::Empty);
        }
        let ordinals: Vec<usize> = gpus.iter().map(|g| g.ordinal()).collect();
        for (i, o) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(o) {
                return Err(CollectiveError::SameDevice(*o));
            }
        }
        if std::env::var(NVLS_ENV).as_deref() != Ok("0") {
            return Err(CollectiveError::NvlsOn);
        }
        // SAFETY: only tries to dlopen libnccl; no NCCL call is made.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(CollectiveError::Absent);
        }
        let streams = gpus.iter().map(|g| g.stream.clone()).collect();
        let comms = Comm::from_devices(streams).map_err(|e| CollectiveError::Nccl("ncclCommInitAll", e))?;
        Ok(Collective { comms, ordinals })
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.comms.len()
    }

    /// The device ordinal of each rank.
    pub fn ordinals(&self) -> &[usize] {
        &self.ordinals
    }

    /// In place, on every rank: `bufs[r][..len] = Σ_ranks bufs[rank][..len]`,
    /// `bufs[r]` living on rank `r`'s GPU. Queued on the GPUs' streams
    /// (returns before it runs).
    pub fn all_reduce_sum(&self, bufs: &mut [&mut CudaSlice<f32>], len: usize) -> Result<(), CollectiveError> {
        self.check(bufs.iter().map(|b| b.len()), len)?;
        let group = GroupGuard::start()?;
        for (comm, buf) in self.comms.iter().zip(bufs.iter_mut()) {
            comm.all_reduce_in_place(&mut buf.slice_mut(0..len), &ReduceOp::Sum)
                .map_err(|e| CollectiveError::Nccl("ncclAllReduce", e))?;
        }
        group.end()
    }

    /// `recv[r][k * len..(k + 1) * len] = send[k][..len]` on every rank `r`:
    /// every rank gets every rank's `len` values, in rank order.
    pub fn all_gather<T: cudarc::nccl::NcclType + DeviceRepr>(
        &self,
        send: &[&CudaSlice<T>],
        recv: &mut [&mut CudaSlice<T>],
        len: usize,
    ) -> Result<(), CollectiveError> {
        self.check(send.iter().map(|b| b.len()), len)?;
        let world = self.world_size();
        self.check(recv.iter().map(|b| b.len()), len * world)?;
        let group = GroupGuard::start()?;
        for ((comm, s), r) in self.comms.iter().zip(send).zip(recv.iter_mut()) {
            comm.all_gather(&s.slice(0..len), &mut r.slice_mut(0..len * world))
                .map_err(|e| CollectiveError::Nccl("ncclAllGather", e))?;
        }
        group.end()
    }

    /// One buffer per rank, each holding at least `len` values.
    fn check(&self, lens: impl ExactSizeIterator<Item = usize>, len: usize) -> Result<(), CollectiveError> {
        let world = self.world_size();
        if lens.len() != world {
            return Err(CollectiveError::RankCount(lens.len(), world));
        }
        for (rank, have) in lens.enumerate() {
            if have < len {
                return Err(CollectiveError::Lengths { rank, have, need: len });
            }
        }
        Ok(())
    }
}
