//! Launch wrappers, one module per op (same names as `cpu::ops` and the
//! kernels). Each wrapper checks buffer sizes, computes its launch
//! configuration, builds the kernel's parameter struct and launches.
pub mod flash_attention;
