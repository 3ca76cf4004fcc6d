//! Compile our kernel crate (`kernels/`) to PTX; `src/main.rs` embeds it.
fn main() {
    let ptx = gpu_kernel_builder::PtxBuilder::new("kernels")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    println!("cargo::rustc-env=CONSUMER_KERNELS_PTX={}", ptx.display());
}
