//! One 16-byte aligned vector of four 4-byte values, for the kernels'
//! vector loads and stores.
//!
//! Reading or writing a [`Vec4`] through a pointer the caller knows to be
//! 16-byte aligned compiles to one vector instruction (`ld.v4` / `st.v4`,
//! global or shared) instead of four scalar ones; copying it between
//! registers costs nothing. A kernel casts its `*const f32` (or `u32`: bf16
//! pairs, TF32 bits) to `*const Vec4<_>` where it has checked or been
//! promised the alignment.

/// Four values moved as one 16-byte access. Meant for 4-byte `T` (`f32`,
/// `u32`), where it is exactly 16 bytes; the alignment is what makes the
/// access a single vector instruction.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct Vec4<T>(pub [T; 4]);
