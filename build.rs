//! Compiles `examples/kernel-import` (a third-party kernel crate on
//! `gpu-kernels`' device layer: the device layer's test kernels) to PTX;
//! `src/lib.rs` embeds it for the tests. The GPT-2 kernels themselves are
//! compiled by `gpu-host`'s build script.

fn main() {
    let import_ptx = gpu_kernel_builder::PtxBuilder::new("examples/kernel-import")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!("cargo:rustc-env=KERNEL_IMPORT_PTX_PATH={}", import_ptx.display());
}
