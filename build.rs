//! Compiles the `gpu-kernels` crate to PTX; `src/lib.rs` embeds it.
//! Set `GPU_KERNELS_ARCH` (e.g. `sm_90`) to target another architecture
//! with the portable module; the Hopper module is always sm_90a.

/// The architecture-specific Hopper target (`wgmma` needs it).
const SM90A: &str = "sm_90a";

fn main() {
    let ptx = kernel_builder::PtxBuilder::new("gpu-kernels")
        .feature("panic-handler")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!("cargo:rustc-env=GPU_KERNELS_PTX_PATH={}", ptx.display());

    // The same kernels plus the Hopper-only ones (`wgmma`), for sm_90a: the
    // module the host loads on H100/H200 (compute capability 9.0).
    let mut hopper = kernel_builder::PtxBuilder::new("gpu-kernels")
        .feature("panic-handler")
        .feature("sm90a")
        .arch(SM90A);
    for &(kernel, threads) in gpu_kernels::params::SM90A_MAX_THREADS {
        hopper = hopper.max_threads(kernel, threads);
    }
    let hopper_ptx = hopper.build().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    println!("cargo:rustc-env=GPU_KERNELS_SM90A_PTX_PATH={}", hopper_ptx.display());

    // A third-party kernel crate on gpu-kernels' device layer (without its
    // panic-handler feature): the proof that the crate is importable, and the
    // device layer's test kernels.
    let import_ptx = kernel_builder::PtxBuilder::new("examples/kernel-import")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!("cargo:rustc-env=KERNEL_IMPORT_PTX_PATH={}", import_ptx.display());
}
