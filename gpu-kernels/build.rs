//! Tells the build scripts of dependent crates where this crate's sources
//! are (`DEP_GPU_KERNELS_ROOT`), so they can compile it to PTX with
//! `kernel-builder` wherever cargo put it (a path, a registry, a git cache).
fn main() {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| {
        eprintln!("error: CARGO_MANIFEST_DIR is not set (gpu-kernels' build script runs under cargo)");
        std::process::exit(1)
    });
    println!("cargo::metadata=root={root}");
    println!("cargo::rerun-if-changed=build.rs");
}
