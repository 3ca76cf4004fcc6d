//! Compile a `#![no_std]` Rust kernel crate to PTX from a build script.
//!
//! This plays the role of Rust-CUDA's `cuda_builder`, on top of rustc's own
//! `nvptx64-nvidia-cuda` backend instead of `rustc_codegen_nvvm`:
//!
//! ```no_run
//! // build.rs of a crate that embeds kernels (the body of its `fn main`)
//! let ptx = gpu_kernel_builder::PtxBuilder::new("../my-kernels")
//!     .build()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! println!("cargo:rustc-env=MY_KERNELS_PTX={}", ptx.display());
//! // and in the crate: include_str!(env!("MY_KERNELS_PTX"))
//! ```
//!
//! How it works, and why: the nvptx target can only produce a `cdylib`, whose
//! link step normally runs `llvm-bitcode-linker`, a component that is not
//! distributed for current nightlies. We do not need it: with fat LTO and one
//! codegen unit rustc already merges `core` (built with `-Zbuild-std=core`)
//! into the kernel module before code generation, so `--emit=asm` writes a
//! complete, self-contained PTX module. The link step would only repeat that
//! work, so we make it a no-op (`-C linker=true`) and keep the `.s` file.

use std::env;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The nvptx target triple rustc knows.
pub const TARGET: &str = "nvptx64-nvidia-cuda";
/// Default PTX target: the driver JIT-compiles `sm_80` PTX for A100, H100 and H200.
pub const DEFAULT_ARCH: &str = "sm_80";
/// Environment variable that overrides the target architecture (e.g. `sm_90a`).
pub const ARCH_ENV: &str = "GPU_KERNELS_ARCH";
/// The `cfg` set on the crate being compiled as the PTX module's root (not
/// on its dependencies): where `gpu_kernels::panic_handler!` defines the
/// module's one panic handler.
pub const ROOT_CFG: &str = "kernel_builder_root";

/// Why a kernel build failed, with what the user can do about it.
#[derive(Debug)]
pub enum BuildError {
    /// A required environment variable of build scripts is missing.
    NotInBuildScript(&'static str),
    /// `rust-src` is not installed for the active toolchain (needed by `-Zbuild-std`).
    MissingRustSrc(PathBuf),
    /// A tool could not be started.
    Spawn(String, std::io::Error),
    /// The nested `cargo rustc` failed; its stderr is attached.
    Compile {
        hint: Option<&'static str>,
        stderr: String,
    },
    /// The build ran but no PTX file was found where rustc writes it.
    NoPtx(PathBuf),
    /// A launch bound named a kernel the PTX does not define.
    NoEntry(String),
    Io(PathBuf, std::io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NotInBuildScript(var) => {
                write!(f, "kernel-builder must run from a build script ({var} is not set)")
            }
            BuildError::MissingRustSrc(p) => write!(
                f,
                "the `rust-src` component is missing ({} not found); it is needed to build `core` \
                 for {TARGET}. Install the pinned toolchain with `rustup toolchain install` in the \
                 repository root (rust-toolchain.toml lists rust-src).",
                p.display()
            ),
            BuildError::Spawn(what, e) => write!(f, "could not run {what}: {e}"),
            BuildError::Compile { hint, stderr } => {
                write!(f, "compiling the kernels to PTX failed")?;
                if let Some(h) = hint {
                    write!(f, " ({h})")?;
                }
                write!(f, ":\n{stderr}")
            }
            BuildError::NoPtx(dir) => write!(f, "the build produced no .s file in {}", dir.display()),
            BuildError::NoEntry(k) => write!(
                f,
                "max_threads or launch_bounds names kernel `{k}`, which the PTX does not define"
            ),
            BuildError::Io(p, e) => write!(f, "{}: {e}", p.display()),
        }
    }
}

impl std::error::Error for BuildError {}

/// Builder for one kernel crate. See the crate docs.
#[derive(Debug, Clone)]
pub struct PtxBuilder {
    crate_dir: PathBuf,
    arch: Option<String>,
    features: Vec<String>,
    /// (kernel, threads, blocks an SM or 0): see [`PtxBuilder::launch_bounds`].
    max_threads: Vec<(String, u32, u32)>,
}

impl PtxBuilder {
    /// `crate_dir` holds the kernel crate's `Cargo.toml`; relative paths are
    /// taken from the calling package's directory (`CARGO_MANIFEST_DIR`).
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        Self {
            crate_dir: crate_dir.into(),
            arch: None,
            features: Vec::new(),
            max_threads: Vec::new(),
        }
    }

    /// Target architecture, e.g. `"sm_90a"`. Without this call the
    /// `GPU_KERNELS_ARCH` environment variable decides, else [`DEFAULT_ARCH`].
    pub fn arch(mut self, arch: impl Into<String>) -> Self {
        self.arch = Some(arch.into());
        self
    }

    /// Enable a cargo feature of the kernel crate.
    pub fn feature(mut self, feature: impl Into<String>) -> Self {
        self.features.push(feature.into());
        self
    }

    /// Declare that `kernel` is launched with at most `threads` threads per
    /// block: the PTX gets `.maxntid threads, 1, 1` on that entry, so ptxas
    /// keeps its registers within what such a block may hold (CUDA's
    /// `__launch_bounds__`; rustc has no attribute for it). The build fails
    /// if the PTX has no such entry.
    pub fn max_threads(mut self, kernel: impl Into<String>, threads: u32) -> Self {
        self.max_threads.push((kernel.into(), threads, 0));
        self
    }

    /// [`PtxBuilder::max_threads`], and that `blocks` such blocks must fit
    /// an SM at once: the PTX also gets `.minnctapersm blocks`, so ptxas
    /// keeps the registers a thread within `65536 / (threads * blocks)`
    /// (CUDA's `__launch_bounds__(threads, blocks)`).
    pub fn launch_bounds(mut self, kernel: impl Into<String>, threads: u32, blocks: u32) -> Self {
        self.max_threads.push((kernel.into(), threads, blocks));
        self
    }

    /// The architecture this builder will compile for.
    pub fn resolved_arch(&self) -> String {
        self.arch
            .clone()
            .or_else(|| env::var(ARCH_ENV).ok())
            .unwrap_or_else(|| DEFAULT_ARCH.to_string())
    }

    /// Compile the crate and return the path of the PTX file (inside `OUT_DIR`).
    /// Emits the `cargo:rerun-if-*` lines so the caller rebuilds when kernel
    /// sources or the architecture knob change.
    pub fn build(self) -> Result<PathBuf, BuildError> {
        let manifest_dir = PathBuf::from(var("CARGO_MANIFEST_DIR")?);
        let out_dir = PathBuf::from(var("OUT_DIR")?);
        let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let crate_dir = manifest_dir.join(&self.crate_dir);
        let arch = self.resolved_arch();

        println!("cargo:rerun-if-env-changed={ARCH_ENV}");
        println!("cargo:rerun-if-changed={}", crate_dir.join("Cargo.toml").display());
        println!("cargo:rerun-if-changed={}", crate_dir.join("src").display());

        check_rust_src(&rustc)?;

        // A separate target directory: the outer build holds the lock on its
        // own. One per architecture, so builds of the same crate for two
        // targets (a portable and an sm_90a module) do not rebuild each other.
        let target_dir = out_dir.join(format!("ptx-target-{arch}"));
        let mut cmd = Command::new(&cargo);
        cmd.current_dir(&crate_dir)
            .args([
                "rustc",
                "--lib",
                "--release",
                "--crate-type",
                "cdylib",
                "--target",
                TARGET,
            ])
            .arg("-Zbuild-std=core")
            .args(["--config", "profile.release.lto=\"fat\""])
            .args(["--config", "profile.release.codegen-units=1"])
            .args(["--config", "profile.release.panic=\"abort\""])
            .args(["--config", "profile.release.debug=false"])
            .arg("--manifest-path")
            .arg(crate_dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir);
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        // After `--`, flags reach the root crate only: `kernel_builder_root`
        // tells it (and `gpu_kernels::panic_handler!`) that it is the
        // module's root, which alone defines the panic handler.
        cmd.args(["--", "--emit=asm", "-Clinker=true"])
            .arg(format!("-Ctarget-cpu={arch}"))
            .args(["--cfg", ROOT_CFG, "--check-cfg", &format!("cfg({ROOT_CFG})")]);
        // Flags meant for the host build must not leak into the device build.
        for v in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_TARGET",
            "CARGO_TARGET_DIR",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            cmd.env_remove(v);
        }
        let out = cmd
            .output()
            .map_err(|e| BuildError::Spawn(format!("{cargo} rustc"), e))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            return Err(BuildError::Compile {
                hint: hint_for(&stderr),
                stderr,
            });
        }

        let deps = target_dir.join(TARGET).join("release").join("deps");
        let stem = crate_name(&crate_dir)?.replace('-', "_");
        let ptx_src = newest_asm(&deps, &stem)?;
        let ptx_dst = out_dir.join(format!("{stem}.{arch}.ptx"));
        let mut ptx = fs::read_to_string(&ptx_src).map_err(|e| BuildError::Io(ptx_src.clone(), e))?;
        for (kernel, threads, blocks) in &self.max_threads {
            ptx =
                add_max_threads(&ptx, kernel, *threads, *blocks).ok_or_else(|| BuildError::NoEntry(kernel.clone()))?;
        }
        fs::write(&ptx_dst, ptx).map_err(|e| BuildError::Io(ptx_dst.clone(), e))?;
        Ok(ptx_dst)
    }
}

/// `ptx` with `.maxntid threads, 1, 1` (and `.minnctapersm blocks` unless
/// `blocks` is 0) after the parameter list of entry `kernel`, or `None` when
/// the PTX has no such entry.
fn add_max_threads(ptx: &str, kernel: &str, threads: u32, blocks: u32) -> Option<String> {
    let head = format!(".entry {kernel}(");
    let start = ptx.find(&head)?;
    // The parameter list ends at the first ")" line after the entry's name.
    let close = start + ptx[start..].find("\n)")? + 2;
    let mut out = String::with_capacity(ptx.len() + 32);
    out.push_str(&ptx[..close]);
    out.push_str(&format!("\n.maxntid {threads}, 1, 1"));
    if blocks > 0 {
        out.push_str(&format!("\n.minnctapersm {blocks}"));
    }
    out.push_str(&ptx[close..]);
    Some(out)
}

fn var(name: &'static str) -> Result<String, BuildError> {
    env::var(name).map_err(|_| BuildError::NotInBuildScript(name))
}

fn check_rust_src(rustc: &str) -> Result<(), BuildError> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| BuildError::Spawn(format!("{rustc} --print sysroot"), e))?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let core = sysroot.join("lib/rustlib/src/rust/library/core");
    if core.is_dir() {
        Ok(())
    } else {
        Err(BuildError::MissingRustSrc(core))
    }
}

fn hint_for(stderr: &str) -> Option<&'static str> {
    if stderr.contains("-Z") && stderr.contains("nightly") {
        Some("a nightly toolchain is required: run `rustup toolchain install` in the repository root")
    } else if stderr.contains("could not find specification for target") || stderr.contains("unknown target") {
        Some("this rustc does not know the nvptx64-nvidia-cuda target")
    } else if stderr.contains("rust-src") || stderr.contains("library/Cargo.lock") {
        Some("the rust-src component is missing: `rustup component add rust-src`")
    } else {
        None
    }
}

/// The package name from the kernel crate's manifest (first `name = ` line of `[package]`).
fn crate_name(crate_dir: &Path) -> Result<String, BuildError> {
    let manifest = crate_dir.join("Cargo.toml");
    let text = fs::read_to_string(&manifest).map_err(|e| BuildError::Io(manifest.clone(), e))?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some(rest) = line.strip_prefix("name")
            && let Some(value) = rest.trim_start().strip_prefix('=')
        {
            return Ok(value.trim().trim_matches('"').to_string());
        }
    }
    Err(BuildError::Io(manifest, std::io::Error::other("no [package] name")))
}

/// rustc writes `<crate>.s` (or `<crate>-<hash>.s`) into `deps/`; take the newest.
fn newest_asm(deps: &Path, stem: &str) -> Result<PathBuf, BuildError> {
    let entries = fs::read_dir(deps).map_err(|e| BuildError::Io(deps.to_path_buf(), e))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_stem()
                    .and_then(|s| s.to_str())
                    .is_some_and(|s| s == stem || s.starts_with(&format!("{stem}-")))
        })
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
        .ok_or_else(|| BuildError::NoPtx(deps.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::add_max_threads;

    const PTX: &str = ".visible .entry k_1(\n\t.param .u64 k_1_param_0\n)\n{\n\tret;\n}\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\tret;\n}\n";

    #[test]
    fn max_threads_goes_after_the_named_entrys_parameters() {
        let out = add_max_threads(PTX, "k", 512, 0).unwrap();
        assert!(out.contains("k_param_0\n)\n.maxntid 512, 1, 1\n{"), "{out}");
        // Only that entry: k_1 (whose name starts like it) is untouched.
        assert_eq!(out.matches(".maxntid").count(), 1);
        assert!(out.contains("k_1_param_0\n)\n{"));
        assert!(add_max_threads(PTX, "missing", 512, 0).is_none());
    }

    #[test]
    fn launch_bounds_add_the_blocks_an_sm() {
        let out = add_max_threads(PTX, "k", 256, 2).unwrap();
        assert!(
            out.contains("k_param_0\n)\n.maxntid 256, 1, 1\n.minnctapersm 2\n{"),
            "{out}"
        );
        assert_eq!(out.matches(".minnctapersm").count(), 1);
    }
}
