//! The smallest end-to-end check of the pipeline: Rust kernel -> PTX -> driver -> result.

use gpu_kernels::params::{SaxpyParams, names};
use host::gpu::runtime::{dptr, dptr_mut};
use rand::Rng;

use crate::kernels::random_vec;

#[test]
fn embedded_ptx_has_every_kernel_entry() {
    assert!(gpt2::GPU_KERNELS_PTX.contains(".visible .entry saxpy("));
}

#[test]
fn saxpy_matches_cpu() {
    let Some(gpu) = host::gpu::test_gpu() else { return };
    let n = 1_000_003usize;
    let mut rng = rand::rng();
    let (x, y) = (random_vec(n, 1.0), random_vec(n, 1.0));
    let a: f32 = rng.random_range(-2.0..2.0);
    let dx = gpu.upload(&x).unwrap();
    let dy = gpu.upload(&y).unwrap();
    let mut out = gpu.upload(&vec![f32::NAN; n]).unwrap();
    let params = SaxpyParams {
        out: dptr_mut(&mut out),
        x: dptr(&dx),
        y: dptr(&dy),
        a,
        n: n as u32,
    };
    let cfg = cudarc::driver::LaunchConfig::for_num_elems(n as u32);
    // SAFETY: the three buffers hold n floats.
    unsafe { gpu.launch(names::SAXPY, cfg, params).unwrap() };
    let got = gpu.download(&out).unwrap();
    for i in 0..n {
        assert_eq!(got[i], a * x[i] + y[i], "element {i}");
    }
}
