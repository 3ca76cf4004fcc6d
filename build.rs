//! Compiles the `gpu-kernels` crate to PTX; `src/lib.rs` embeds it.
//! Set `GPU_KERNELS_ARCH` (e.g. `sm_90a`) to target another architecture.

fn main() {
    let ptx = kernel_builder::PtxBuilder::new("gpu-kernels")
        .feature("panic-handler")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!("cargo:rustc-env=GPU_KERNELS_PTX_PATH={}", ptx.display());

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
