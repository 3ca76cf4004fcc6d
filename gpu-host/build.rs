//! Compiles `gpu-kernels` (wherever cargo put its sources: its build script
//! says where, `DEP_GPU_KERNELS_ROOT`) to two PTX modules that `src/lib.rs`
//! embeds. Set `GPU_KERNELS_ARCH` (e.g. `sm_90`) to target another
//! architecture with the portable module; the Hopper module is always sm_90a.

/// The architecture-specific Hopper target (`wgmma` needs it).
const SM90A: &str = "sm_90a";

fn main() {
    let Ok(kernels) = std::env::var("DEP_GPU_KERNELS_ROOT") else {
        fail("DEP_GPU_KERNELS_ROOT is not set: gpu-kernels' build script did not run before this one")
    };
    let mut portable = gpu_kernel_builder::PtxBuilder::new(&kernels);
    for &(kernel, threads, blocks) in gpu_kernels::params::LAUNCH_BOUNDS {
        portable = portable.launch_bounds(kernel, threads, blocks);
    }
    let ptx = portable.build().unwrap_or_else(|e| fail(&e.to_string()));
    println!("cargo::rustc-env=GPU_KERNELS_PTX_PATH={}", ptx.display());

    // The same kernels plus the Hopper-only ones (`wgmma`), for sm_90a: the
    // module `Gpu::new` loads on H100/H200 (compute capability 9.0).
    let mut hopper = gpu_kernel_builder::PtxBuilder::new(&kernels)
        .feature("sm90a")
        .arch(SM90A);
    for &(kernel, threads) in gpu_kernels::params::SM90A_MAX_THREADS {
        hopper = hopper.max_threads(kernel, threads);
    }
    for &(kernel, threads, blocks) in gpu_kernels::params::LAUNCH_BOUNDS {
        hopper = hopper.launch_bounds(kernel, threads, blocks);
    }
    for tile in gpu_kernels::params::SM90A_WGMMA_TILES
        .iter()
        .flat_map(|family| family.iter())
    {
        hopper = hopper.launch_bounds(tile.name, tile.threads(), tile.blocks_per_sm);
    }
    let hopper_ptx = hopper.build().unwrap_or_else(|e| fail(&e.to_string()));
    println!("cargo::rustc-env=GPU_KERNELS_SM90A_PTX_PATH={}", hopper_ptx.display());
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
