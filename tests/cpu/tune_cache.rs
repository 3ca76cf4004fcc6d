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
    // Each bad input, and what its message must say (so a wrong message,
    // not only a missing error, fails).
    for (bad, says) in [
        ("not json", "expected ident"),
        (r#"{"shapes": {}}"#, r#"no "device" string"#),
        (r#"{"device": "X"}"#, r#"no "shapes" object"#),
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
        (r#"{"device": "X", "shapes": {"1,2,3": {}}}"#, r#"1,2,3: no "best""#),
    ] {
        let err = TuneCache::parse(bad).unwrap_err();
        assert!(err.contains(says), "{bad}: the message {err:?} does not say {says:?}");
    }
}
