//! Aligned vectors of four and of two 4-byte values ([`Vec4`], [`Vec2`]),
//! for the kernels' vector loads and stores.
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

/// Two values moved as one 8-byte access (`ld.v2` / `st.v2`): two floats,
/// or two words of bf16 pairs. Meant for 4-byte `T`; the pointer must be
/// 8-byte aligned, as for [`Vec4`]'s 16.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct Vec2<T>(pub [T; 2]);
