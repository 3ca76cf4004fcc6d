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
}
