//! GPT-2 kernels, one module per op. Each kernel takes one parameter struct
//! from [`crate::params`] and is exported under the name in [`crate::params::names`].

pub mod saxpy;
pub mod flash_attention;
