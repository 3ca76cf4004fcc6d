//! The smallest end-to-end check of the pipeline: Rust kernel -> PTX -> driver -> result.

use std::collections::BTreeSet;
use std::path::Path;

use gpu_kernels::params::matmul_tf32::{MATMUL_3XTF32_VARIANTS, MATMUL_TF32_VARIANTS};
use gpu_kernels::params::{SM90A_WGMMA_TILES, SaxpyParams, names};
use host::gpu::runtime::{dptr, dptr_mut};
use rand::Rng;

use crate::kernels::{random_vec, skip};

/// The kernel names of `gpu_kernels::params`, read from its source: the
/// string literals of every `pub const NAME: &str` and `pub const NAMES:
/// [&str; N]`, and the tile shapes' names (constants of the crate, so new
/// ones are picked up). The host launches kernels by these names only.
fn param_kernel_names() -> (BTreeSet<String>, BTreeSet<String>) {
    // Tests run from the package directory (the repository root), under cargo
    // and in scripts/gpu-runner.sh alike.
    let dir = Path::new("gpu-kernels/src/params");
    let mut names = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    assert!(files.len() > 10, "{} holds {} files", dir.display(), files.len());
    for f in &files {
        let src = std::fs::read_to_string(f).unwrap();
        // A declaration may span lines: join each `pub const ...;` first.
        for decl in src.split("pub const ").skip(1) {
            let Some((ty, value)) = decl.split_once('=') else {
                continue;
            };
            if !(ty.contains("&str") || ty.contains("&'static str")) {
                continue;
            }
            let value = &value[..value.find(';').unwrap_or(value.len())];
            for (i, lit) in value.split('"').enumerate() {
                if i % 2 == 1 {
                    names.insert(lit.to_string());
                }
            }
        }
    }
    for s in MATMUL_TF32_VARIANTS.iter().chain(&MATMUL_3XTF32_VARIANTS) {
        names.insert(s.name.to_string());
    }
    // Kernels of the sm_90a module only: the wgmma matmuls, the persistent
    // decode step (bulk copies on mbarriers) and its layernorm folds, and the
    // cluster sampler.
    // (`SM90A_WGMMA_TILES` lists every wgmma family, so a new one is checked here too.)
    let mut wgmma: BTreeSet<String> = SM90A_WGMMA_TILES
        .iter()
        .flat_map(|family| family.iter())
        .map(|s| s.name.to_string())
        .collect();
    for k in [
        gpu_kernels::params::decode_step::DECODE_STEP,
        gpu_kernels::params::decode_step::DECODE_STEP_BF16,
        gpu_kernels::params::decode_step::DECODE_STEP_TRACED,
        gpu_kernels::params::decode_step::DECODE_STEP_BF16_TRACED,
        gpu_kernels::params::decode_step::DECODE_STEP_ROWS,
        gpu_kernels::params::decode_step::DECODE_STEP_ROWS_BF16,
        gpu_kernels::params::decode_step::DECODE_STEP_ROWS_TRACED,
        gpu_kernels::params::decode_step::DECODE_STEP_ROWS_BF16_TRACED,
        gpu_kernels::params::decode_step::DECODE_STEP_FOLD,
        gpu_kernels::params::decode_step::DECODE_STEP_FOLD_BF16,
        gpu_kernels::params::sample::SAMPLE_CLUSTER_FORWARD,
    ] {
        assert!(names.remove(k), "{k} was not found in {}", dir.display());
        wgmma.insert(k.to_string());
    }
    // The constants the tests and host use directly must be among them.
    for n in [
        names::SAXPY,
        gpu_kernels::params::matmul::MATMUL_FORWARD,
        gpu_kernels::params::sample::SAMPLE_FORWARD,
        gpu_kernels::params::decode::DECODE_GEMV,
    ] {
        assert!(names.contains(n), "{n} was not found in {}", dir.display());
    }
    (names, wgmma)
}

/// `.visible .entry NAME(` lines of a PTX module.
fn ptx_entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap().trim().to_string())
        .collect()
}

/// Both embedded modules have an entry for every kernel name the host can
/// launch (the portable one all but the wgmma tiles, the sm_90a one all),
/// and no entry that no name refers to. A kernel renamed on one side, left
/// out of a module by a `cfg`, or dropped by the build fails here, not at
/// launch time on the GPU machine.
#[test]
fn embedded_ptx_has_every_kernel_entry() {
    let (names, wgmma) = param_kernel_names();
    let portable = ptx_entries(gpu_host::GPU_KERNELS_PTX);
    let hopper = ptx_entries(gpu_host::GPU_KERNELS_SM90A_PTX);
    let all: BTreeSet<String> = names.union(&wgmma).cloned().collect();
    let missing =
        |want: &BTreeSet<String>, have: &BTreeSet<String>| -> Vec<String> { want.difference(have).cloned().collect() };
    assert!(names.len() > 30, "only {} kernel names found: {names:?}", names.len());
    assert!(!wgmma.is_empty());
    assert_eq!(
        missing(&names, &portable),
        Vec::<String>::new(),
        "missing from GPU_KERNELS_PTX"
    );
    assert_eq!(
        missing(&all, &hopper),
        Vec::<String>::new(),
        "missing from GPU_KERNELS_SM90A_PTX"
    );
    assert_eq!(
        missing(&portable, &names),
        Vec::<String>::new(),
        "entries of GPU_KERNELS_PTX with no name in params"
    );
    assert_eq!(
        missing(&hopper, &all),
        Vec::<String>::new(),
        "entries of GPU_KERNELS_SM90A_PTX with no name in params"
    );
    // wgmma cannot be expressed in PTX for a portable target.
    let leaked: Vec<_> = wgmma.intersection(&portable).collect();
    assert!(leaked.is_empty(), "wgmma kernels in the portable module: {leaked:?}");
    println!(
        "{} kernel names; entries: {} portable, {} sm_90a",
        all.len(),
        portable.len(),
        hopper.len()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn saxpy_matches_cpu() {
    let Some(gpu) = skip::gpu() else { return };
    let n = 1_000_003usize;
    let mut rng = crate::seed::rng();
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
