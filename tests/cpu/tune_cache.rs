//! The TF32 tile cache written by `tune` and read by the engine.

use gpu_host::shape::MatmulShape;
use host::gpu::ops::matmul_tf32::TuneCache;

/// The committed sweeps are embedded, parse and name real kernels; the
/// user's cache lies under the cache directory by GPU name.
#[test]
fn committed_caches_are_embedded() {
    for device in ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] {
        let cache = TuneCache::embedded(device).unwrap_or_else(|| panic!("no embedded cache for {device}"));
        assert_eq!(cache.device, device);
    }
    assert!(TuneCache::embedded("NVIDIA A100-SXM4-80GB").is_none());
    if let Some(path) = TuneCache::user_path("NVIDIA H200") {
        assert!(path.ends_with("gpt2/tune/nvidia-h200.json"), "{}", path.display());
    }
    let cache = TuneCache::embedded("NVIDIA H200").unwrap();
    let tile = cache
        .tile(MatmulShape::new(8192, 2304, 768))
        .expect("8192,2304,768 was swept");
    assert!(tile.name.starts_with("matmul_forward_tf32_"), "{}", tile.name);
    assert!(
        cache.tile(MatmulShape::new(8192, 2304, 769)).is_none(),
        "unswept shapes fall back to the heuristic"
    );
}

#[test]
fn bad_caches_are_errors() {
    let ok = r#"{"device": "X", "shapes": {"1,2,3": {"best": "matmul_forward_tf32_32x64"}}}"#;
    assert_eq!(
        TuneCache::parse(ok)
            .unwrap()
            .tile(MatmulShape::new(1, 2, 3))
            .unwrap()
            .name,
        "matmul_forward_tf32_32x64"
    );
    // Each bad input, and what its message must say (so a wrong message,
    // not only a missing error, fails).
    for (bad, says) in [
        ("not json", "expected ident"),
        (r#"{"shapes": {}}"#, "missing field `device`"),
        (r#"{"device": "X"}"#, "missing field `shapes`"),
        (
            r#"{"device": "X", "shapes": {"1,2": {"best": "matmul_forward_tf32_32x64"}}}"#,
            r#"shape key "1,2" is not "M,N,K""#,
        ),
        (
            r#"{"device": "X", "shapes": {"a,b,c": {"best": "matmul_forward_tf32_32x64"}}}"#,
            r#"shape key "a,b,c" is not "M,N,K""#,
        ),
        (
            r#"{"device": "X", "shapes": {"1,2,3": {"best": "no_such_kernel"}}}"#,
            r#"1,2,3: unknown kernel "no_such_kernel""#,
        ),
        (r#"{"device": "X", "shapes": {"1,2,3": {}}}"#, "missing field `best`"),
    ] {
        let err = TuneCache::parse(bad).unwrap_err();
        assert!(err.contains(says), "{bad}: the message {err:?} does not say {says:?}");
    }
}
