//! The TF32 tile cache written by `tune` and read by the engine.

use host::gpu::ops::matmul_tf32::TuneCache;

/// The committed H200 sweep parses and names real kernels.
#[test]
fn committed_h200_cache_parses() {
    let path = TuneCache::default_path("NVIDIA H200");
    assert_eq!(path, std::path::Path::new("weights/tune/nvidia-h200.json"));
    let cache = TuneCache::load(&path).unwrap();
    assert_eq!(cache.device, "NVIDIA H200");
    let tile = cache.tile(8192, 2304, 768).expect("8192,2304,768 was swept");
    assert!(tile.name.starts_with("matmul_forward_tf32_"), "{}", tile.name);
    assert!(
        cache.tile(8192, 2304, 769).is_none(),
        "unswept shapes fall back to the heuristic"
    );
}

#[test]
fn bad_caches_are_errors() {
    let ok = r#"{"device": "X", "shapes": {"1,2,3": {"best": "matmul_forward_tf32_32x64"}}}"#;
    assert_eq!(
        TuneCache::parse(ok).unwrap().tile(1, 2, 3).unwrap().name,
        "matmul_forward_tf32_32x64"
    );
    for bad in [
        "not json",
        r#"{"shapes": {}}"#,
        r#"{"device": "X", "shapes": {"1,2": {"best": "matmul_forward_tf32_32x64"}}}"#,
        r#"{"device": "X", "shapes": {"a,b,c": {"best": "matmul_forward_tf32_32x64"}}}"#,
        r#"{"device": "X", "shapes": {"1,2,3": {"best": "no_such_kernel"}}}"#,
        r#"{"device": "X", "shapes": {"1,2,3": {}}}"#,
    ] {
        let err = TuneCache::parse(bad).unwrap_err();
        assert!(!err.is_empty(), "{bad}");
    }
}
