//! Helpers shared by the tests of this binary.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// A private scratch directory (`gpt2-<tag>-<random>` in the system temp
/// dir, made by `tempfile`), removed on drop.
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix(&format!("gpt2-{tag}-"))
            .tempdir()
            .expect("creating a scratch directory");
        Scratch(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// target/<profile>/ of this test binary (which lives in target/<profile>/deps).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

/// A binary of the `host` package (`host`, `serve`, `serve_load`). Under
/// cargo, `cargo build --profile <this test's> -p host --bins` runs once per
/// test run into this test's own target directory, so the binaries are
/// never stale; without cargo (a bundle copied to another machine) the
/// bundle's `bin/<name>` (the layout of `scripts/gpu-bundle.sh`:
/// `gpu-out/tests/cpu`, `gpu-out/bin/host`) or a `<name>` in the test's
/// profile directory is used. `None` after a skip (printed by each test that
/// asks), or a panic under `GPT2_REQUIRE_GPU=1` (the GPU runner, whose
/// bundle must have it).
pub fn host_package_bin(name: &str) -> Option<&'static Path> {
    static BUILT: OnceLock<()> = OnceLock::new();
    static FOUND: OnceLock<Mutex<HashMap<String, &'static Path>>> = OnceLock::new();
    let profile_dir = profile_dir();
    BUILT.get_or_init(|| {
        if let Ok(cargo) = std::env::var("CARGO") {
            let target_dir = profile_dir.parent().expect("target dir");
            let profile = if profile_dir.ends_with("release") {
                "release"
            } else {
                "test"
            };
            let status = Command::new(cargo)
                .args([
                    "build",
                    "--quiet",
                    "--profile",
                    profile,
                    "-p",
                    "host",
                    "--bins",
                    "--target-dir",
                ])
                .arg(target_dir)
                .status()
                .expect("running cargo");
            assert!(status.success(), "building the host package's binaries failed");
        }
    });
    let found = FOUND.get_or_init(|| Mutex::new(HashMap::new()));
    let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = found.get(name) {
        return Some(path);
    }
    let exe = format!("{name}{}", std::env::consts::EXE_SUFFIX);
    let bin = profile_dir.join(&exe);
    // gpu-bundle.sh's layout: this binary is gpu-out/tests/cpu, so
    // profile_dir is gpu-out, and the programs are in gpu-out/bin.
    let bundled = profile_dir.join("bin").join(&exe);
    match [&bin, &bundled].into_iter().find(|b| b.is_file()) {
        Some(path) => {
            let path: &'static Path = Box::leak(path.clone().into_boxed_path());
            found.insert(name.to_string(), path);
            Some(path)
        }
        None => {
            let why = format!(
                "no {name} binary at {} or {} and no cargo to build it",
                bin.display(),
                bundled.display()
            );
            crate::skip::unless_required(crate::skip::REQUIRE_GPU_ENV, why);
            None
        }
    }
}
