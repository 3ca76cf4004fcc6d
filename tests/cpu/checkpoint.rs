//! Checkpoint loaders (llm.c and safetensors) and the random-checkpoint fixtures.

use host::model::fixtures::{self, HfTensor};
use host::model::llmc::{self, Header};
use host::model::safetensors as st;
use host::model::{Checkpoint, DType, Format, FormatError, ModelConfig, Tensor, Weights};
use rand::Rng;

use crate::common::Scratch;

/// A fresh seed per run, printed so a failure can be replayed.
fn fresh_seed() -> u64 {
    let seed = crate::seed::rng().random();
    eprintln!("fixture seed {seed}");
    seed
}

/// Every tensor with a name, in a fixed order.
fn named<'a>(w: &Weights<'a>) -> Vec<(String, Tensor<'a>)> {
    let mut out = vec![("wte".to_string(), w.wte), ("wpe".to_string(), w.wpe)];
    for (l, lw) in w.layers.iter().enumerate() {
        let ts = [
            ("ln1w", lw.ln1w),
            ("ln1b", lw.ln1b),
            ("qkvw", lw.qkvw),
            ("qkvb", lw.qkvb),
            ("attprojw", lw.attprojw),
            ("attprojb", lw.attprojb),
            ("ln2w", lw.ln2w),
            ("ln2b", lw.ln2b),
            ("fcw", lw.fcw),
            ("fcb", lw.fcb),
            ("fcprojw", lw.fcprojw),
            ("fcprojb", lw.fcprojb),
        ];
        out.extend(ts.into_iter().map(|(n, t)| (format!("{n}[{l}]"), t)));
    }
    out.push(("lnfw".to_string(), w.lnfw));
    out.push(("lnfb".to_string(), w.lnfb));
    out
}

/// Asserts both weight sets hold the same logical values; `a` may have a
/// padded wte (zero rows past the vocabulary).
fn assert_same_values(a: &Weights<'_>, b: &Weights<'_>, round: impl Fn(f32) -> f32) {
    assert_eq!(a.config, b.config);
    let (na, nb) = (named(a), named(b));
    assert_eq!(na.len(), nb.len());
    let c = a.config.channels;
    let v = a.config.vocab_size;
    for ((name, ta), (_, tb)) in na.iter().zip(&nb) {
        let (fa, fb) = (ta.to_f32(), tb.to_f32());
        if name == "wte" {
            assert_eq!(fa.len(), a.config.padded_vocab_size * c);
            assert_eq!(fb.len(), v * c, "safetensors wte has only vocab rows");
            assert!(
                fa[v * c..].iter().all(|x| *x == 0.0),
                "padded rows of llm.c wte are zero"
            );
            let fa = &fa[..v * c];
            assert!(fa.iter().zip(fb.iter()).all(|(x, y)| round(*x) == *y), "{name} differs");
            continue;
        }
        assert_eq!(ta.shape, tb.shape, "{name} shape");
        assert_eq!(fa.len(), fb.len());
        let bad = fa.iter().zip(fb.iter()).position(|(x, y)| round(*x) != *y);
        assert!(bad.is_none(), "{name} differs at {bad:?}");
    }
}

fn configs() -> [ModelConfig; 3] {
    // Degenerate but valid: one head of size 1, one token, one position.
    let minimal = ModelConfig {
        max_seq_len: 1,
        vocab_size: 1,
        padded_vocab_size: ModelConfig::pad_vocab(1),
        num_layers: 1,
        num_heads: 1,
        channels: 1,
    };
    [fixtures::tiny_config(), fixtures::odd_config(), minimal]
}

#[test]
fn llmc_and_safetensors_loaders_agree() {
    for cfg in configs() {
        let seed = fresh_seed();
        let llmc =
            Checkpoint::from_bytes(fixtures::llmc_bytes(&cfg, seed, DType::F32).unwrap(), "a.bin", None).unwrap();
        assert_eq!(llmc.format(), Format::Llmc);
        assert_eq!(*llmc.config(), cfg);
        let wl = llmc.weights().unwrap();
        for prefix in [false, true] {
            let bytes = fixtures::safetensors_bytes(&cfg, seed, prefix, DType::F32).unwrap();
            let hf = Checkpoint::from_bytes(bytes, "b.safetensors", Some(cfg.num_heads)).unwrap();
            assert_eq!(hf.format(), Format::Safetensors);
            assert_eq!(*hf.config(), cfg);
            let wh = hf.weights().unwrap();
            assert_same_values(&wl, &wh, |x| x);
            // Conv1D weights are transposed, vectors and embeddings are not.
            let l0 = &wh.layers[0];
            assert!(l0.qkvw.transposed && l0.attprojw.transposed && l0.fcw.transposed && l0.fcprojw.transposed);
            assert!(!l0.qkvb.transposed && !l0.ln1w.transposed && !wh.wte.transposed && !wh.wpe.transposed);
            assert!(named(&wl).iter().all(|(_, t)| !t.transposed));
        }
    }
}

#[test]
fn bf16_and_f16_checkpoints_hold_rounded_values() {
    let cfg = fixtures::tiny_config();
    let seed = fresh_seed();
    let f32_bytes = fixtures::llmc_bytes(&cfg, seed, DType::F32).unwrap();
    let base = Checkpoint::from_bytes(f32_bytes, "f32.bin", None).unwrap();
    let wb = base.weights().unwrap();

    let bf = Checkpoint::from_bytes(fixtures::llmc_bytes(&cfg, seed, DType::BF16).unwrap(), "bf16.bin", None).unwrap();
    assert_eq!(bf.dtype(), DType::BF16);
    let to_bf16 = |x: f32| half::bf16::from_f32(x).to_f32();
    let wbf = bf.weights().unwrap();
    // Compare llm.c bf16 against llm.c f32 (both padded) value by value.
    for ((name, a), (_, b)) in named(&wb).iter().zip(&named(&wbf)) {
        assert_eq!(b.dtype, DType::BF16);
        assert_eq!(b.bytes.len(), a.len() * 2);
        assert!(
            a.to_f32().iter().zip(b.to_f32().iter()).all(|(x, y)| to_bf16(*x) == *y),
            "{name}"
        );
    }
    assert!(
        fixtures::llmc_bytes(&cfg, seed, DType::F16).is_err(),
        "llm.c has no f16 format"
    );

    for (dtype, round) in [
        (DType::BF16, to_bf16 as fn(f32) -> f32),
        (DType::F16, (|x| half::f16::from_f32(x).to_f32()) as fn(f32) -> f32),
    ] {
        let bytes = fixtures::safetensors_bytes(&cfg, seed, true, dtype).unwrap();
        let hf = Checkpoint::from_bytes(bytes, "h.safetensors", Some(cfg.num_heads)).unwrap();
        assert_eq!(hf.dtype(), dtype);
        assert_same_values(&wb, &hf.weights().unwrap(), round);
    }
}

#[test]
fn seeds_change_values_and_scales_are_gpt2_like() {
    let cfg = fixtures::tiny_config();
    let seed = fresh_seed();
    let a = fixtures::random_params(&cfg, seed).unwrap();
    let again = fixtures::random_params(&cfg, seed).unwrap();
    let b = fixtures::random_params(&cfg, seed.wrapping_add(1)).unwrap();
    assert_eq!(a.tensors, again.tensors, "same seed, same values");
    assert_ne!(a.tensors, b.tensors, "another seed, other values");
    let stats = |v: &[f32]| {
        let n = v.len() as f64;
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / n;
        let var = v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    };
    let names = llmc::TENSOR_NAMES;
    let idx = |n: &str| names.iter().position(|x| *x == n).unwrap();
    let (m, s) = stats(&a.tensors[idx("qkvw")]);
    assert!(m.abs() < 0.002 && (s - 0.02).abs() < 0.002, "qkvw mean {m} std {s}");
    let (m, s) = stats(&a.tensors[idx("ln1w")]);
    assert!((m - 1.0).abs() < 0.05 && s > 0.01, "ln1w mean {m} std {s}");
    let (_, s) = stats(&a.tensors[idx("fcb")]);
    assert!(s > 0.005, "biases are not zero");
}

#[test]
fn open_files_of_both_formats_with_config_json() {
    let dir = Scratch::new("ckpt-test");
    let cfg = fixtures::odd_config();
    let seed = fresh_seed();
    let bin = dir.path().join("model.bin");
    fixtures::write_llmc(&bin, &cfg, seed, DType::F32).unwrap();
    let ck = Checkpoint::open(&bin).unwrap();
    assert_eq!((ck.format(), *ck.config()), (Format::Llmc, cfg));
    // llm.c files ignore a config.json beside them, even a broken one.
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    assert_eq!(*Checkpoint::open(&bin).unwrap().config(), cfg);
    std::fs::remove_file(dir.path().join("config.json")).unwrap();

    let sf = dir.path().join("model.safetensors");
    fixtures::write_safetensors(&sf, &cfg, seed, false).unwrap();
    // C = 96 is no standard GPT-2 width: without config.json the head count is unknown.
    let err = Checkpoint::open(&sf).unwrap_err();
    assert!(
        matches!(err.kind, FormatError::UnknownHeadCount { channels: 96 }),
        "{err}"
    );
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    fixtures::write_hf_config(dir.path(), &cfg).unwrap();
    let hf = Checkpoint::open(&sf).unwrap();
    assert_eq!(*hf.config(), cfg);
    assert_same_values(&ck.weights().unwrap(), &hf.weights().unwrap(), |x| x);

    // A broken config.json is reported, naming it.
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let err = Checkpoint::open(&sf).unwrap_err();
    assert!(
        matches!(err.kind, FormatError::ConfigJson(ref m) if m.contains("config.json")),
        "{err}"
    );
    std::fs::write(dir.path().join("config.json"), r#"{"n_head": -3}"#).unwrap();
    assert!(matches!(
        Checkpoint::open(&sf).unwrap_err().kind,
        FormatError::ConfigJson(_)
    ));
    // A config.json whose head count does not divide C.
    std::fs::write(dir.path().join("config.json"), r#"{"n_head": 5}"#).unwrap();
    assert!(matches!(
        Checkpoint::open(&sf).unwrap_err().kind,
        FormatError::BadSize { field: "channels", .. }
    ));

    let missing = dir.path().join("nope.bin");
    let err = Checkpoint::open(&missing).unwrap_err();
    assert!(
        matches!(err.kind, FormatError::Io(_)) && err.to_string().contains("nope.bin"),
        "{err}"
    );
    assert!(matches!(
        Checkpoint::open(dir.path()).unwrap_err().kind,
        FormatError::NotAFile
    ));
    let empty = dir.path().join("empty.bin");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(Checkpoint::open(&empty).unwrap_err().kind, FormatError::Empty));
}

#[test]
fn standard_width_needs_no_config_json() {
    // C = 768 (GPT-2 124M's width) with few layers and a small vocabulary.
    let cfg = ModelConfig {
        max_seq_len: 16,
        vocab_size: 50,
        padded_vocab_size: ModelConfig::pad_vocab(50),
        num_layers: 1,
        num_heads: 12,
        channels: 768,
    };
    let bytes = fixtures::safetensors_bytes(&cfg, fresh_seed(), true, DType::BF16).unwrap();
    let ck = Checkpoint::from_bytes(bytes, "m.safetensors", None).unwrap();
    assert_eq!(*ck.config(), cfg);
    assert_eq!(st::standard_num_heads(1024), Some(16));
    assert_eq!(st::standard_num_heads(1280), Some(20));
    assert_eq!(st::standard_num_heads(1600), Some(25));
    assert_eq!(st::standard_num_heads(64), None);
}

/// GPT-2's published sizes (llm.c's padded vocabulary).
fn gpt2_sizes() -> [(ModelConfig, &'static str); 4] {
    let base = ModelConfig::GPT2_124M;
    let with = |l, nh, c| ModelConfig {
        num_layers: l,
        num_heads: nh,
        channels: c,
        ..base
    };
    [
        (base, "124M"),
        (with(24, 16, 1024), "355M"),
        (with(36, 20, 1280), "774M"),
        (with(48, 25, 1600), "1558M"),
    ]
}

#[test]
fn header_of_every_gpt2_size_parses_without_the_body() {
    for (cfg, name) in gpt2_sizes() {
        for dtype in [DType::F32, DType::BF16] {
            let header = Header { config: cfg, dtype };
            let bytes = header.to_bytes();
            assert_eq!(bytes.len(), llmc::HEADER_BYTES);
            let parsed = llmc::parse_header(&bytes).unwrap();
            assert_eq!(parsed, header, "{name}");
            // Independent count: sum of the 16 shapes.
            let c = cfg.channels;
            let per_layer = 2 * c + 3 * c * c + 3 * c + c * c + c + 2 * c + 4 * c * c + 4 * c + 4 * c * c + c;
            let n = cfg.padded_vocab_size * c + cfg.max_seq_len * c + cfg.num_layers * per_layer + 2 * c;
            assert_eq!(llmc::num_parameters(&cfg).unwrap(), n);
            assert_eq!(n, cfg.num_parameters());
            assert_eq!(parsed.file_len().unwrap(), llmc::HEADER_BYTES + n * dtype.size());
            // The header alone is a truncated file.
            match llmc::parse(&bytes) {
                Err(FormatError::LengthMismatch { expected, actual }) => {
                    assert_eq!(
                        (expected as usize, actual as usize),
                        (parsed.file_len().unwrap(), llmc::HEADER_BYTES)
                    )
                }
                other => panic!("{name}: expected LengthMismatch, got {other:?}"),
            }
        }
    }
    // llm.c's published count for GPT-2 124M with the padded vocabulary.
    const GPT2_124M_PADDED_PARAMS: usize = 124_475_904;
    assert_eq!(
        llmc::num_parameters(&ModelConfig::GPT2_124M).unwrap(),
        GPT2_124M_PADDED_PARAMS
    );
}

/// Header bytes of `cfg` with field `i` replaced by `value`.
fn header_with(cfg: &ModelConfig, i: usize, value: i32) -> Vec<u8> {
    let mut h = Header {
        config: *cfg,
        dtype: DType::F32,
    }
    .to_bytes();
    h[i * 4..i * 4 + 4].copy_from_slice(&value.to_le_bytes());
    h
}

#[test]
fn bad_llmc_headers_give_specific_errors() {
    let cfg = fixtures::tiny_config();
    let f = |i, v| llmc::parse_header(&header_with(&cfg, i, v));
    assert!(matches!(
        f(llmc::field::MAGIC, 12345),
        Err(FormatError::BadMagic { found: 12345, .. })
    ));
    assert!(matches!(
        f(llmc::field::VERSION, 4),
        Err(FormatError::UnsupportedVersion { found: 4, .. })
    ));
    assert!(matches!(
        f(llmc::field::VERSION, 1),
        Err(FormatError::UnsupportedVersion { found: 1, .. })
    ));
    for (i, name) in [
        (llmc::field::MAX_SEQ_LEN, "max_seq_len"),
        (llmc::field::VOCAB_SIZE, "vocab_size"),
        (llmc::field::NUM_LAYERS, "num_layers"),
        (llmc::field::NUM_HEADS, "num_heads"),
        (llmc::field::CHANNELS, "channels"),
        (llmc::field::PADDED_VOCAB_SIZE, "padded_vocab_size"),
    ] {
        for v in [0, -1, i32::MIN, i32::MAX] {
            match f(i, v) {
                Err(FormatError::BadSize { field, .. }) => assert_eq!(field, name, "value {v}"),
                other => panic!("{name} = {v}: {other:?}"),
            }
        }
    }
    // Sizes that disagree with each other.
    assert!(matches!(
        f(llmc::field::NUM_HEADS, 3),
        Err(FormatError::BadSize { field: "channels", .. })
    ));
    assert!(matches!(
        f(llmc::field::PADDED_VOCAB_SIZE, 299),
        Err(FormatError::BadSize {
            field: "padded_vocab_size",
            ..
        })
    ));
    // Valid but different sizes: the body no longer matches.
    let mut bytes = fixtures::llmc_bytes(&cfg, fresh_seed(), DType::F32).unwrap();
    bytes[..llmc::HEADER_BYTES].copy_from_slice(&header_with(&cfg, llmc::field::NUM_LAYERS, 3));
    assert!(matches!(llmc::parse(&bytes), Err(FormatError::LengthMismatch { .. })));
    // A bf16 header on an f32 body.
    bytes[..llmc::HEADER_BYTES].copy_from_slice(&header_with(&cfg, llmc::field::VERSION, llmc::VERSION_BF16));
    assert!(matches!(llmc::parse(&bytes), Err(FormatError::LengthMismatch { .. })));

    // Through format detection: other llm.c files and unknown magics.
    let other = |magic: i32| {
        let mut b = header_with(&cfg, llmc::field::MAGIC, magic);
        b.resize(4096, 0);
        Checkpoint::from_bytes(b, "x.bin", None).unwrap_err()
    };
    assert!(matches!(
        other(llmc::STATE_MAGIC).kind,
        FormatError::WrongLlmcFile { what: "debug state" }
    ));
    assert!(matches!(
        other(llmc::TOKENIZER_MAGIC).kind,
        FormatError::WrongLlmcFile { what: "tokenizer" }
    ));
    let err = other(20240301);
    assert!(matches!(err.kind, FormatError::UnrecognizedFormat(..)), "{err}");
    assert!(err.to_string().contains("x.bin"));
}

#[test]
fn truncated_or_extended_llmc_files_are_rejected() {
    let cfg = fixtures::tiny_config();
    let full = fixtures::llmc_bytes(&cfg, fresh_seed(), DType::BF16).unwrap();
    assert!(Checkpoint::from_bytes(full.clone(), "ok.bin", None).is_ok());
    let mut rng = crate::seed::rng();
    // Every cut inside the header, a few around the end, many random ones.
    let mut cuts: Vec<usize> = (0..=llmc::HEADER_BYTES + 8).collect();
    cuts.extend(full.len() - 8..full.len());
    cuts.extend((0..300).map(|_| rng.random_range(0..full.len())));
    for cut in cuts {
        let r = Checkpoint::from_bytes(full[..cut].to_vec(), "cut.bin", None);
        assert!(r.is_err(), "truncated at {cut} of {} accepted", full.len());
        if cut >= llmc::HEADER_BYTES {
            assert!(matches!(r.unwrap_err().kind, FormatError::LengthMismatch { .. }));
        }
    }
    for extra in [1, 2, 3, 4, 1000] {
        let mut longer = full.clone();
        longer.extend((0..extra).map(|_| rng.random::<u8>()));
        let err = Checkpoint::from_bytes(longer, "long.bin", None).unwrap_err();
        assert!(matches!(err.kind, FormatError::LengthMismatch { .. }), "{err}");
        assert!(err.to_string().contains("trailing"), "{err}");
    }
}

#[test]
fn truncated_or_corrupted_safetensors_are_rejected() {
    let cfg = fixtures::tiny_config();
    let full = fixtures::safetensors_bytes(&cfg, fresh_seed(), true, DType::F32).unwrap();
    let nh = Some(cfg.num_heads);
    assert!(Checkpoint::from_bytes(full.clone(), "ok.safetensors", nh).is_ok());
    let header_end = 8 + u64::from_le_bytes(full[..8].try_into().unwrap()) as usize;
    let mut rng = crate::seed::rng();
    let mut cuts: Vec<usize> = (0..=header_end + 8).collect();
    cuts.extend((0..300).map(|_| rng.random_range(0..full.len())));
    for cut in cuts {
        assert!(
            Checkpoint::from_bytes(full[..cut].to_vec(), "cut.safetensors", nh).is_err(),
            "cut at {cut}"
        );
    }
    let mut longer = full.clone();
    longer.push(0);
    assert!(Checkpoint::from_bytes(longer, "long.safetensors", nh).is_err());
    // Random byte flips in the header: an error or (rarely, e.g. in a
    // name's digit) a different valid file, never a panic.
    for _ in 0..300 {
        let mut b = full.clone();
        let i = rng.random_range(0..header_end);
        b[i] = rng.random();
        let _ = Checkpoint::from_bytes(b, "flip.safetensors", nh);
    }
    // A header length larger than the file / absurd.
    let mut b = full.clone();
    b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(Checkpoint::from_bytes(b, "huge.safetensors", nh).is_err());
}

/// Parses hand-edited tensor lists.
fn parse_tensors(tensors: &[HfTensor], num_heads: Option<usize>) -> Result<ModelConfig, FormatError> {
    let bytes = fixtures::serialize_safetensors(tensors).unwrap();
    st::parse(&bytes, num_heads).map(|w| w.config)
}

#[test]
fn safetensors_tensor_set_is_checked() {
    let cfg = fixtures::tiny_config();
    let nh = Some(cfg.num_heads);
    let seed = fresh_seed();
    for prefix in [false, true] {
        let base = fixtures::hf_tensors(&cfg, seed, prefix, DType::F32).unwrap();
        let pre = if prefix { st::PREFIX } else { "" };
        assert_eq!(parse_tensors(&base, nh).unwrap(), cfg);

        let without = |name: &str| -> Vec<HfTensor> {
            let full = format!("{pre}{name}");
            assert!(base.iter().any(|t| t.name == full), "{full} exists");
            base.iter().filter(|t| t.name != full).cloned().collect()
        };
        for name in [
            "wte.weight",
            "wpe.weight",
            "ln_f.weight",
            "ln_f.bias",
            "h.1.mlp.c_fc.weight",
            "h.0.attn.c_proj.bias",
        ] {
            match parse_tensors(&without(name), nh) {
                Err(FormatError::MissingTensor(m)) => assert_eq!(m, name),
                other => panic!("without {name}: {other:?}"),
            }
        }
        // A whole layer 0 missing while layer 1 exists.
        let no_layer0: Vec<HfTensor> = base.iter().filter(|t| !t.name.contains("h.0.")).cloned().collect();
        assert!(matches!(
            parse_tensors(&no_layer0, nh),
            Err(FormatError::LayerIndices(_))
        ));

        let with = |t: HfTensor| -> Vec<HfTensor> { base.iter().cloned().chain([t]).collect() };
        let c = cfg.channels;
        let vals = |n: usize| -> Vec<f32> { (0..n).map(|i| i as f32 * 0.5 + 1.0).collect() };
        // Extra tensors.
        for name in ["foo.weight", "h.0.attn.c_attn.extra", "h.00.ln_1.weight", "ln_g.weight"] {
            match parse_tensors(
                &with(HfTensor::new(format!("{pre}{name}"), vec![c], &vals(c), DType::F32)),
                nh,
            ) {
                Err(FormatError::UnexpectedTensor(n)) => assert!(n.contains(name), "{n}"),
                other => panic!("with {name}: {other:?}"),
            }
        }
        // Duplicate under the other naming.
        let other_pre = if prefix { "" } else { st::PREFIX };
        let dup = HfTensor::new(format!("{other_pre}ln_f.bias"), vec![c], &vals(c), DType::F32);
        assert!(matches!(
            parse_tensors(&with(dup), nh),
            Err(FormatError::UnexpectedTensor(_))
        ));
        // Ignored buffers and a tied lm_head.
        let t = cfg.max_seq_len;
        let mask = HfTensor::new(
            format!("{pre}h.0.attn.bias"),
            vec![1, 1, t, t],
            &vals(t * t),
            DType::F32,
        );
        let mut ok = with(mask);
        ok.push(HfTensor::new(
            format!("{pre}h.1.attn.masked_bias"),
            vec![],
            &[-1e4],
            DType::F32,
        ));
        ok.push(HfTensor::new(
            st::LM_HEAD,
            vec![cfg.vocab_size, c],
            &vals(cfg.vocab_size * c),
            DType::F32,
        ));
        assert_eq!(parse_tensors(&ok, nh).unwrap(), cfg);
        let bad_head = HfTensor::new(
            st::LM_HEAD,
            vec![cfg.vocab_size - 1, c],
            &vals((cfg.vocab_size - 1) * c),
            DType::F32,
        );
        assert!(matches!(
            parse_tensors(&with(bad_head), nh),
            Err(FormatError::TensorShape { .. })
        ));

        // Misshaped: c_attn stored (3C, C) instead of Conv1D's (C, 3C).
        let replace = |name: &str, t: HfTensor| -> Vec<HfTensor> {
            let full = format!("{pre}{name}");
            base.iter()
                .map(|x| {
                    if x.name == full {
                        HfTensor {
                            name: full.clone(),
                            ..t.clone()
                        }
                    } else {
                        x.clone()
                    }
                })
                .collect()
        };
        let qkv = HfTensor::new("", vec![3 * c, c], &vals(3 * c * c), DType::F32);
        match parse_tensors(&replace("h.1.attn.c_attn.weight", qkv), nh) {
            Err(FormatError::TensorShape { name, expected, actual }) => {
                assert!(name.ends_with("h.1.attn.c_attn.weight"));
                assert_eq!((expected, actual), (vec![c, 3 * c], vec![3 * c, c]));
            }
            other => panic!("{other:?}"),
        }
        let bias_2d = HfTensor::new("", vec![1, c], &vals(c), DType::F32);
        assert!(matches!(
            parse_tensors(&replace("ln_f.bias", bias_2d), nh),
            Err(FormatError::TensorShape { .. })
        ));
        let wte_3d = HfTensor::new("", vec![1, cfg.vocab_size, c], &vals(cfg.vocab_size * c), DType::F32);
        assert!(matches!(
            parse_tensors(&replace("wte.weight", wte_3d), nh),
            Err(FormatError::TensorRank { .. })
        ));
        let wpe_narrow = HfTensor::new(
            "",
            vec![cfg.max_seq_len, c - 1],
            &vals(cfg.max_seq_len * (c - 1)),
            DType::F32,
        );
        assert!(matches!(
            parse_tensors(&replace("wpe.weight", wpe_narrow), nh),
            Err(FormatError::TensorShape { .. })
        ));

        // One tensor of another float dtype: mixed.
        let bf = HfTensor::new("", vec![c], &vals(c), DType::BF16);
        match parse_tensors(&replace("h.0.ln_2.weight", bf), nh) {
            Err(FormatError::MixedDtypes {
                found: DType::BF16,
                expected: DType::F32,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // An unsupported dtype.
        let ints = HfTensor {
            name: String::new(),
            shape: vec![c],
            dtype: safetensors::Dtype::I32,
            data: vec![1; c * 4],
        };
        match parse_tensors(&replace("h.1.ln_1.bias", ints), nh) {
            Err(FormatError::UnsupportedDtype { name, dtype }) => {
                assert!(name.ends_with("h.1.ln_1.bias"));
                assert_eq!(dtype, "I32");
            }
            other => panic!("{other:?}"),
        }
        // All tensors f64: unsupported (the first one checked is wte).
        let all_f64: Vec<HfTensor> = base
            .iter()
            .map(|t| HfTensor {
                dtype: safetensors::Dtype::F64,
                data: [t.data.clone(), t.data.clone()].concat(),
                ..t.clone()
            })
            .collect();
        assert!(matches!(
            parse_tensors(&all_f64, nh),
            Err(FormatError::UnsupportedDtype { .. })
        ));
        // No head count for a non-standard width.
        assert!(matches!(
            parse_tensors(&base, None),
            Err(FormatError::UnknownHeadCount { channels: 64 })
        ));
        // An empty file (header only).
        assert!(matches!(parse_tensors(&[], nh), Err(FormatError::MissingTensor(_))));
    }
}

#[test]
fn random_llmc_headers_never_panic() {
    let cfg = fixtures::tiny_config();
    let valid = fixtures::llmc_bytes(&cfg, fresh_seed(), DType::F32).unwrap();
    let mut rng = crate::seed::rng();
    let interesting = [
        0,
        1,
        2,
        3,
        4,
        5,
        64,
        128,
        300,
        384,
        i32::MAX,
        i32::MIN,
        -1,
        1 << 16,
        1 << 20,
        1 << 24,
    ];
    let mut accepted = 0;
    for _ in 0..3000 {
        let mut b = valid.clone();
        // Rewrite one to three size fields with interesting or random values.
        for _ in 0..rng.random_range(1..=3) {
            let field = rng.random_range(llmc::field::MAX_SEQ_LEN..=llmc::field::PADDED_VOCAB_SIZE);
            let v = if rng.random_bool(0.7) {
                interesting[rng.random_range(0..interesting.len())]
            } else {
                rng.random()
            };
            b[field * 4..field * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        if rng.random_bool(0.3) {
            b.truncate(rng.random_range(0..b.len()));
        }
        if let Ok(w) = llmc::parse(&b) {
            accepted += 1;
            let expected = Header {
                config: w.config,
                dtype: DType::F32,
            }
            .file_len()
            .unwrap();
            assert_eq!(expected, b.len());
            assert!(named(&w).iter().all(|(_, t)| t.bytes.len() == t.len() * 4));
        }
    }
    eprintln!("{accepted} mutated headers happened to be consistent");
}
