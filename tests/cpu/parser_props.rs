//! Property-based fuzzing of the checkpoint parsers inside `cargo test`, with
//! a bounded budget (the cargo-fuzz targets in fuzz/ explore far longer but
//! need a nightly toolchain and a separate run).
//!
//! Every input goes through the entry points the fuzz targets use
//! (`checkpoint::parse_any`, `llmc::parse`, `safetensors::parse`,
//! `Checkpoint::from_bytes` and `Checkpoint::weights`): none may panic, and a
//! parse that succeeds must hand out views that agree with its config. On top
//! of arbitrary bytes, structured mutations of small valid files check the
//! outcome exactly: an llm.c file is accepted iff an independent model of the
//! format (below) says it is valid; a mutated safetensors file is rejected
//! unless the mutation keeps it valid (a name without the `transformer.`
//! prefix, a tied `lm_head.weight`, an ignored `attn.bias` buffer, metadata,
//! header padding).
//!
//! The committed fuzz corpus (fuzz/corpus/<target>/) and crashers
//! (fuzz/regressions/<target>/) are replayed through the same checks.
//!
//! The runner is seeded: a fixed seed by default (no flakes), or
//! `PROPTEST_RNG_SEED=N` to explore others; `PROPTEST_CASES=N` changes the
//! number of cases per property. A failure prints the seed and the minimal
//! failing input.

use std::path::{Path, PathBuf};

use host::model::checkpoint::parse_any;
use host::model::safetensors as st;
use host::model::{Checkpoint, DType, Format, FormatError, Tensor, Weights, format, llmc};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

/// Seed of the runner unless PROPTEST_RNG_SEED is set.
const DEFAULT_SEED: u64 = 0x6770_7432_7072_6f70;
/// Cases per property unless PROPTEST_CASES is set.
const DEFAULT_CASES: u32 = 1500;

/// Runs `test` on `cases` inputs of `strategy` with the seeded config; on
/// failure panics with the seed and proptest's minimal failing input.
fn check<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let mut config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(DEFAULT_SEED);
    }
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    let seed = match config.rng_seed {
        RngSeed::Fixed(s) => s.to_string(),
        RngSeed::Random => "random".to_string(),
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{name}: {e}\n(seed {seed}, {cases} cases; replay with PROPTEST_RNG_SEED={seed})");
    }
}

// ---------------------------------------------------------------------------
// Invariants of a successful parse and the entry points of the fuzz targets.

/// Checks that a view has the expected logical shape, the byte length of
/// that shape and lies inside the parsed buffer.
fn check_tensor(name: &str, t: &Tensor<'_>, shape: [usize; 2], dtype: DType, buf: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(t.shape, shape, "{} shape", name);
    prop_assert_eq!(t.dtype, dtype, "{} dtype", name);
    prop_assert_eq!(
        t.bytes.len(),
        shape[0] * shape[1] * dtype.size(),
        "{} byte length",
        name
    );
    let (start, end) = (buf.as_ptr() as usize, buf.as_ptr() as usize + buf.len());
    let p = t.bytes.as_ptr() as usize;
    prop_assert!(
        t.bytes.is_empty() || (p >= start && p + t.bytes.len() <= end),
        "{} is not a view of the input",
        name
    );
    prop_assert_eq!(t.to_f32().len(), shape[0] * shape[1], "{} to_f32 length", name);
    Ok(())
}

/// What every successfully parsed checkpoint must satisfy.
fn check_weights(w: &Weights<'_>, buf: &[u8]) -> Result<(), TestCaseError> {
    let cfg = w.config;
    let (c, l) = (cfg.channels, cfg.num_layers);
    prop_assert!(c > 0 && cfg.num_heads > 0 && c % cfg.num_heads == 0, "{:?}", cfg);
    prop_assert!(cfg.max_seq_len > 0 && cfg.vocab_size > 0 && l > 0, "{:?}", cfg);
    prop_assert!(cfg.padded_vocab_size >= cfg.vocab_size, "{:?}", cfg);
    prop_assert_eq!(w.layers.len(), l);
    let dtype = w.wte.dtype;
    // wte has all padded rows (llm.c) or only the real ones (safetensors).
    let wte_rows = w.wte.shape[0];
    prop_assert!(
        wte_rows == cfg.vocab_size || wte_rows == cfg.padded_vocab_size,
        "wte has {} rows",
        wte_rows
    );
    check_tensor("wte", &w.wte, [wte_rows, c], dtype, buf)?;
    check_tensor("wpe", &w.wpe, [cfg.max_seq_len, c], dtype, buf)?;
    check_tensor("lnfw", &w.lnfw, [1, c], dtype, buf)?;
    check_tensor("lnfb", &w.lnfb, [1, c], dtype, buf)?;
    for lw in &w.layers {
        let expected = [
            (&lw.ln1w, [1, c]),
            (&lw.ln1b, [1, c]),
            (&lw.qkvw, [3 * c, c]),
            (&lw.qkvb, [1, 3 * c]),
            (&lw.attprojw, [c, c]),
            (&lw.attprojb, [1, c]),
            (&lw.ln2w, [1, c]),
            (&lw.ln2b, [1, c]),
            (&lw.fcw, [4 * c, c]),
            (&lw.fcb, [1, 4 * c]),
            (&lw.fcprojw, [c, 4 * c]),
            (&lw.fcprojb, [1, c]),
        ];
        for (t, shape) in expected {
            check_tensor("layer tensor", t, shape, dtype, buf)?;
        }
    }
    Ok(())
}

/// Which entry points accepted an input.
#[derive(Debug, Default)]
struct Accepted {
    any: Option<Format>,
    llmc: bool,
    safetensors: bool,
}

/// Runs `data` through every parser entry point (with `num_heads` where one
/// is taken), checks the invariants of each success and that the entry
/// points agree with each other.
fn parse_everywhere(data: &[u8], num_heads: Option<usize>) -> Result<Accepted, TestCaseError> {
    let mut acc = Accepted::default();
    let any = parse_any(data, num_heads);
    if let Ok((format, w)) = &any {
        check_weights(w, data)?;
        acc.any = Some(*format);
    }
    if let Ok(w) = llmc::parse(data) {
        check_weights(&w, data)?;
        acc.llmc = true;
    }
    if let Ok(w) = st::parse(data, num_heads) {
        check_weights(&w, data)?;
        acc.safetensors = true;
    }
    // Without a head count only the standard widths parse.
    if let Ok(w) = st::parse(data, None) {
        check_weights(&w, data)?;
        prop_assert!(st::standard_num_heads(w.config.channels).is_some());
    }
    let is_llmc = llmc::first_int(data) == Some(llmc::MAGIC);
    let expected_any = if is_llmc {
        acc.llmc.then_some(Format::Llmc)
    } else if data.len() >= 4 && [llmc::STATE_MAGIC, llmc::TOKENIZER_MAGIC].contains(&llmc::first_int(data).unwrap()) {
        prop_assert!(
            matches!(any, Err(FormatError::WrongLlmcFile { .. })),
            "an llm.c state/tokenizer file must be named as such"
        );
        None
    } else {
        acc.safetensors.then_some(Format::Safetensors)
    };
    prop_assert_eq!(acc.any, expected_any, "parse_any disagrees with the format parsers");
    match Checkpoint::from_bytes(data.to_vec(), "prop", num_heads) {
        Ok(ck) => {
            prop_assert!(acc.any.is_some(), "Checkpoint accepted what parse_any rejected");
            let w = ck
                .weights()
                .map_err(|e| TestCaseError::fail(format!("reparse failed: {e}")))?;
            check_weights(&w, ck.bytes())?;
            prop_assert_eq!(*ck.config(), w.config);
        }
        Err(e) => {
            prop_assert!(acc.any.is_none(), "Checkpoint rejected what parse_any accepted: {}", e);
            // The message must render (names the file).
            prop_assert!(e.to_string().starts_with("checkpoint prop: "));
        }
    }
    Ok(acc)
}

/// What both fuzz targets do with one input: every entry point, with the
/// head count picked by the first byte, and with llm.c's magic and a version
/// patched in.
fn fuzz_target_replay(data: &[u8]) -> Result<(), TestCaseError> {
    let num_heads = data.first().map(|b| usize::from(*b) + 1);
    parse_everywhere(data, None)?;
    parse_everywhere(data, num_heads)?;
    if data.len() >= 8 {
        let mut patched = data.to_vec();
        patched[..4].copy_from_slice(&llmc::MAGIC.to_le_bytes());
        let version = if data[0] & 1 == 0 {
            llmc::VERSION_F32
        } else {
            llmc::VERSION_BF16
        };
        patched[4..8].copy_from_slice(&version.to_le_bytes());
        parse_everywhere(&patched, None)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (i) Arbitrary bytes.

#[test]
fn arbitrary_bytes_never_panic() {
    let bytes = prop::collection::vec(any::<u8>(), 0..3000);
    check("arbitrary bytes", bytes, |data| fuzz_target_replay(&data));
}

/// Arbitrary bytes behind a plausible safetensors length prefix (the header
/// length small enough to point inside the input), so the JSON path runs.
#[test]
fn arbitrary_safetensors_headers_never_panic() {
    let json_ish = prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(b"{}[]\":,0123456789 ".to_vec()),
            1 => any::<u8>(),
        ],
        0..400,
    );
    let strategy = (json_ish, prop::collection::vec(any::<u8>(), 0..200), 0usize..3);
    check("safetensors-like bytes", strategy, |(header, data, len_mode)| {
        let len = match len_mode {
            0 => header.len() as u64,
            1 => header.len() as u64 + 1,
            _ => (header.len() as u64).saturating_sub(1),
        };
        let mut bytes = len.to_le_bytes().to_vec();
        bytes.extend(&header);
        bytes.extend(&data);
        fuzz_target_replay(&bytes)
    });
}

// ---------------------------------------------------------------------------
// (ii) Structured llm.c files, checked against an independent model of the
// format: 256 little-endian int32 (magic, version, maxT, V, L, NH, C, Vp, then
// reserved), then Vp*C + maxT*C + L*(12*C*C + 13*C) + 2*C values of 4 (v3)
// or 2 (v5) bytes.

/// A small valid llm.c configuration, as the header's int32 fields
/// [maxT, V, L, NH, C, Vp].
fn small_llmc_fields() -> impl Strategy<Value = [i32; 6]> {
    (1i32..=4, 1i32..=6, 1i32..=2, 1i32..=3, 1i32..=3, 0i32..=3)
        .prop_map(|(t, v, l, nh, hs, pad)| [t, v, l, nh, nh * hs, v + pad])
}

/// An edit of the abstract llm.c file.
#[derive(Clone, Debug)]
enum LlmcEdit {
    /// Header int32 `index` (0..256) set to `value`.
    SetInt { index: usize, value: i32 },
    /// The file cut to this fraction of its length (per mille, < 1000).
    Truncate(u32),
    /// Bytes appended.
    Extend(usize),
}

fn interesting_i32() -> impl Strategy<Value = i32> {
    prop_oneof![
        4 => 0i32..=16,
        2 => prop::sample::select(vec![
            -1,
            i32::MIN,
            i32::MAX,
            1 << 12,
            (1 << 12) + 1,
            1 << 16,
            (1 << 16) + 1,
            1 << 20,
            (1 << 20) + 1,
            1 << 24,
            (1 << 24) + 1,
            llmc::VERSION_F32,
            llmc::VERSION_BF16,
            llmc::MAGIC,
            llmc::STATE_MAGIC,
            llmc::TOKENIZER_MAGIC,
        ]),
        1 => any::<i32>(),
    ]
}

fn llmc_edit() -> impl Strategy<Value = LlmcEdit> {
    prop_oneof![
        // Mostly the meaningful fields (magic, version, the six sizes).
        6 => (0usize..8, interesting_i32()).prop_map(|(index, value)| LlmcEdit::SetInt { index, value }),
        1 => (8usize..256, any::<i32>()).prop_map(|(index, value)| LlmcEdit::SetInt { index, value }),
        1 => (0u32..1000).prop_map(LlmcEdit::Truncate),
        1 => (1usize..64).prop_map(LlmcEdit::Extend),
    ]
}

/// Whether the model of the format accepts a file with header `ints` and
/// `len` bytes (only the first 8 ints are read; the rest is reserved).
fn llmc_model_accepts(ints: &[i32; 256], len: usize) -> bool {
    if len < 1024 || ints[0] != llmc::MAGIC {
        return false;
    }
    let size: u128 = match ints[1] {
        3 => 4,
        5 => 2,
        _ => return false,
    };
    let [t, v, l, nh, c, vp]: [i128; 6] = std::array::from_fn(|k| i128::from(ints[2 + k]));
    let limits = [
        (t, format::MAX_SEQ_LEN_LIMIT),
        (v, format::MAX_VOCAB_LIMIT),
        (vp, format::MAX_VOCAB_LIMIT),
        (l, format::MAX_LAYERS_LIMIT),
        (nh, format::MAX_HEADS_LIMIT),
        (c, format::MAX_CHANNELS_LIMIT),
    ];
    if limits.iter().any(|&(x, lim)| x <= 0 || x > lim as i128) || c % nh != 0 || vp < v {
        return false;
    }
    // All positive and bounded: no overflow in i128.
    let params = vp * c + t * c + l * (12 * c * c + 13 * c) + 2 * c;
    1024 + params as u128 * size == len as u128
}

fn llmc_bytes(ints: &[i32; 256], body_len: usize, body_byte: u8) -> Vec<u8> {
    let mut out: Vec<u8> = ints.iter().flat_map(|i| i.to_le_bytes()).collect();
    // Values do not matter to the parser; vary them a little anyway.
    out.extend((0..body_len).map(|i| body_byte.wrapping_add(i as u8)));
    out
}

#[test]
fn valid_llmc_files_parse_to_their_config() {
    let strategy = (small_llmc_fields(), any::<bool>(), any::<u8>());
    check("valid llm.c", strategy, |(fields, bf16, body_byte)| {
        let mut ints = [0i32; 256];
        ints[0] = llmc::MAGIC;
        ints[1] = if bf16 { llmc::VERSION_BF16 } else { llmc::VERSION_F32 };
        ints[2..8].copy_from_slice(&fields);
        let [t, v, l, nh, c, vp] = fields.map(|f| f as usize);
        let params = vp * c + t * c + l * (12 * c * c + 13 * c) + 2 * c;
        let size = if bf16 { 2 } else { 4 };
        let bytes = llmc_bytes(&ints, params * size, body_byte);
        prop_assert!(llmc_model_accepts(&ints, bytes.len()));
        let acc = parse_everywhere(&bytes, None)?;
        prop_assert_eq!(acc.any, Some(Format::Llmc));
        let w = llmc::parse(&bytes).unwrap();
        let cfg = w.config;
        prop_assert_eq!(
            [
                cfg.max_seq_len,
                cfg.vocab_size,
                cfg.num_layers,
                cfg.num_heads,
                cfg.channels,
                cfg.padded_vocab_size
            ],
            [t, v, l, nh, c, vp]
        );
        prop_assert_eq!(w.wte.dtype, if bf16 { DType::BF16 } else { DType::F32 });
        Ok(())
    });
}

#[test]
fn mutated_llmc_files_are_accepted_exactly_when_valid() {
    let strategy = (
        small_llmc_fields(),
        any::<bool>(),
        prop::collection::vec(llmc_edit(), 1..4),
    );
    check("mutated llm.c", strategy, |(fields, bf16, edits)| {
        let mut ints = [0i32; 256];
        ints[0] = llmc::MAGIC;
        ints[1] = if bf16 { llmc::VERSION_BF16 } else { llmc::VERSION_F32 };
        ints[2..8].copy_from_slice(&fields);
        let [t, _, l, _, c, vp] = fields.map(|f| f as usize);
        let params = vp * c + t * c + l * (12 * c * c + 13 * c) + 2 * c;
        let mut len = 1024 + params * if bf16 { 2 } else { 4 };
        for e in &edits {
            match *e {
                LlmcEdit::SetInt { index, value } => ints[index] = value,
                LlmcEdit::Truncate(per_mille) => len = len * per_mille as usize / 1000,
                LlmcEdit::Extend(n) => len += n,
            }
        }
        let mut bytes = llmc_bytes(&ints, params * 4 + 64, 0x3c);
        bytes.resize(len, 0x3c);
        let want = llmc_model_accepts(&ints, len);
        let acc = parse_everywhere(&bytes, None)?;
        prop_assert_eq!(acc.llmc, want, "llmc::parse vs the format model ({} bytes)", len);
        // A truncated header names its length; a bad size names the field.
        match llmc::parse(&bytes) {
            Err(FormatError::TooShortForHeader { len: got, .. }) => prop_assert!(got < 1024 && got == len),
            Err(FormatError::BadMagic { found, .. }) => prop_assert_eq!(found, ints[0]),
            Err(FormatError::UnsupportedVersion { found, .. }) => prop_assert_eq!(found, ints[1]),
            _ => {}
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------
// (ii) Structured safetensors files: an abstract header (entries with a name,
// dtype string, shape and offsets) written by hand, so any field can be made
// wrong, and the data section after it.

#[derive(Clone, Debug)]
struct Entry {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    offsets: [u64; 2],
}

#[derive(Clone, Debug)]
struct StFile {
    entries: Vec<Entry>,
    metadata: Option<String>,
    /// Spaces after the JSON object (the format allows whitespace padding).
    padding: usize,
    data: Vec<u8>,
}

fn dtype_size(dtype: &str) -> u64 {
    match dtype {
        "F32" | "I32" | "U32" => 4,
        "BF16" | "F16" | "I16" | "U16" => 2,
        "F64" | "I64" | "U64" => 8,
        _ => 1,
    }
}

impl StFile {
    /// A valid GPT-2 file of the given sizes; values are arbitrary bytes.
    fn gpt2(t: u64, v: u64, l: u64, c: u64, dtype: &str, prefix: bool) -> StFile {
        let pre = if prefix { st::PREFIX } else { "" };
        let mut tensors: Vec<(String, Vec<u64>)> = vec![
            (format!("{pre}wte.weight"), vec![v, c]),
            (format!("{pre}wpe.weight"), vec![t, c]),
        ];
        for layer in 0..l {
            let shapes = st::layer_tensor_shapes(c as usize);
            for (name, shape) in st::LAYER_TENSORS.iter().zip(shapes) {
                let shape = shape.iter().map(|&d| d as u64).collect();
                tensors.push((format!("{pre}h.{layer}.{name}"), shape));
            }
        }
        tensors.push((format!("{pre}ln_f.weight"), vec![c]));
        tensors.push((format!("{pre}ln_f.bias"), vec![c]));
        let mut file = StFile {
            entries: Vec::new(),
            metadata: None,
            padding: 0,
            data: Vec::new(),
        };
        for (name, shape) in tensors {
            file.push(name, dtype, shape);
        }
        file
    }

    /// Appends a tensor with fresh data at the end of the data section.
    fn push(&mut self, name: String, dtype: &str, shape: Vec<u64>) {
        let start = self.data.len() as u64;
        let n = shape.iter().product::<u64>() * dtype_size(dtype);
        self.data
            .extend((0..n).map(|i| (i as u8).wrapping_mul(29).wrapping_add(7)));
        self.entries.push(Entry {
            name,
            dtype: dtype.to_string(),
            shape,
            offsets: [start, start + n],
        });
    }

    fn header_json(&self) -> String {
        let mut parts = Vec::new();
        if let Some(m) = &self.metadata {
            parts.push(format!("\"__metadata__\":{m}"));
        }
        for e in &self.entries {
            let shape: Vec<String> = e.shape.iter().map(u64::to_string).collect();
            parts.push(format!(
                "{}:{{\"dtype\":{},\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                serde_json::to_string(&e.name).unwrap(),
                serde_json::to_string(&e.dtype).unwrap(),
                shape.join(","),
                e.offsets[0],
                e.offsets[1]
            ));
        }
        format!("{{{}}}{}", parts.join(","), " ".repeat(self.padding))
    }

    fn to_bytes(&self) -> Vec<u8> {
        let header = self.header_json();
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header.as_bytes());
        out.extend(&self.data);
        out
    }
}

/// A small valid safetensors configuration: (maxT, V, L, NH, C, dtype, prefix).
fn small_st_config() -> impl Strategy<Value = (u64, u64, u64, u64, u64, &'static str, bool)> {
    (
        1u64..=4,
        1u64..=6,
        1u64..=2,
        1u64..=3,
        1u64..=3,
        prop::sample::select(vec!["F32", "BF16", "F16"]),
        any::<bool>(),
    )
        .prop_map(|(t, v, l, nh, hs, dtype, prefix)| (t, v, l, nh, nh * hs, dtype, prefix))
}

#[derive(Clone, Debug)]
enum StEdit {
    /// Valid: the `transformer.` prefix removed from or added to one name.
    TogglePrefix(usize),
    /// Valid: a tied LM head of wte's shape.
    LmHead,
    /// Valid: an `h.{i}.attn.bias` causal-mask buffer (any dtype).
    MaskBuffer(String),
    /// Valid: string metadata.
    Metadata,
    /// Valid: whitespace after the JSON object.
    Padding(usize),
    /// Invalid from here on.
    LmHeadWrongShape,
    Remove(usize),
    Rename(usize, String),
    SetDtype(usize, String),
    SetShape(usize, Vec<u64>),
    SetOffsets(usize, [u64; 2]),
    /// The length prefix changed by a non-zero amount (or set to u64::MAX).
    HeaderLen(i64),
    /// A header byte replaced by one that cannot appear in ASCII JSON (not
    /// UTF-8 here, since the header is otherwise ASCII).
    NonUtf8 {
        at: usize,
        byte: u8,
    },
    Truncate(u32),
    Extend(usize),
}

impl StEdit {
    fn keeps_valid(&self) -> bool {
        matches!(
            self,
            StEdit::TogglePrefix(_) | StEdit::LmHead | StEdit::MaskBuffer(_) | StEdit::Metadata | StEdit::Padding(_)
        )
    }
}

fn interesting_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=16,
        2 => prop::sample::select(vec![
            u64::MAX,
            u64::MAX / 2,
            u64::MAX / 4 + 1,
            1 << 32,
            (1 << 32) + 1,
            1 << 40,
            1 << 62,
            usize::MAX as u64,
            i64::MAX as u64,
        ]),
        1 => any::<u64>(),
    ]
}

fn st_edit() -> impl Strategy<Value = StEdit> {
    let idx = 0usize..64;
    prop_oneof![
        idx.clone().prop_map(StEdit::TogglePrefix),
        Just(StEdit::LmHead),
        prop::sample::select(vec!["BOOL", "U8", "F32", "F64"]).prop_map(|d| StEdit::MaskBuffer(d.to_string())),
        Just(StEdit::Metadata),
        (1usize..40).prop_map(StEdit::Padding),
        Just(StEdit::LmHeadWrongShape),
        idx.clone().prop_map(StEdit::Remove),
        (
            idx.clone(),
            prop::sample::select(vec![
                "wte.weight",
                "h.0.attn.bias",
                "h.00.ln_1.weight",
                "h.+0.ln_1.weight",
                "h.7.ln_1.weight",
                "h.18446744073709551616.ln_1.weight",
                "h.0.ln_3.weight",
                "transformer.transformer.wpe.weight",
                "lm_head.weight",
                "",
                "h.0.",
                "h.",
                "\u{e9}t\u{e9}",
                "__metadata__x",
            ])
        )
            .prop_map(|(i, n)| StEdit::Rename(i, n.to_string())),
        (
            idx.clone(),
            prop::sample::select(vec![
                "F32", "BF16", "F16", "F64", "I8", "U8", "I64", "BOOL", "F8_E4M3", "XYZ", ""
            ])
        )
            .prop_map(|(i, d)| StEdit::SetDtype(i, d.to_string())),
        (idx.clone(), prop::collection::vec(interesting_u64(), 0..4)).prop_map(|(i, s)| StEdit::SetShape(i, s)),
        (idx.clone(), interesting_u64(), interesting_u64()).prop_map(|(i, a, b)| StEdit::SetOffsets(i, [a, b])),
        prop_oneof![(-40i64..=40).prop_filter("non-zero", |d| *d != 0), Just(i64::MAX)].prop_map(StEdit::HeaderLen),
        (any::<usize>(), 0x80u8..=0xff).prop_map(|(at, byte)| StEdit::NonUtf8 { at, byte }),
        (0u32..1000).prop_map(StEdit::Truncate),
        (1usize..32).prop_map(StEdit::Extend),
    ]
}

/// Name without the optional prefix.
fn canonical(name: &str) -> &str {
    name.strip_prefix(st::PREFIX).unwrap_or(name)
}

/// Applies `edit` to `file` and returns the bytes, or None when the edit does
/// not apply (it would change nothing).
fn apply(mut file: StFile, edit: &StEdit) -> Option<Vec<u8>> {
    let n = file.entries.len();
    match edit {
        StEdit::TogglePrefix(i) => {
            let e = &mut file.entries[i % n];
            e.name = match e.name.strip_prefix(st::PREFIX) {
                Some(rest) => rest.to_string(),
                None => format!("{}{}", st::PREFIX, e.name),
            };
        }
        StEdit::LmHead | StEdit::LmHeadWrongShape => {
            let (dtype, mut shape) = (file.entries[0].dtype.clone(), file.entries[0].shape.clone());
            if matches!(edit, StEdit::LmHeadWrongShape) {
                shape[0] += 1;
            }
            file.push(st::LM_HEAD.to_string(), &dtype, shape);
        }
        StEdit::MaskBuffer(dtype) => file.push("transformer.h.0.attn.bias".to_string(), dtype, vec![1, 1, 4, 4]),
        StEdit::Metadata => file.metadata = Some("{\"format\":\"pt\",\"note\":\"x\"}".to_string()),
        StEdit::Padding(k) => file.padding += k,
        StEdit::Remove(i) => {
            // Its bytes stay: a gap or trailing bytes, besides the missing tensor.
            file.entries.remove(i % n);
        }
        StEdit::Rename(i, name) => {
            let e = &file.entries[i % n];
            if canonical(name) == canonical(&e.name) {
                return None;
            }
            file.entries[i % n].name = name.clone();
        }
        StEdit::SetDtype(i, d) => {
            if file.entries[i % n].dtype == *d {
                return None;
            }
            file.entries[i % n].dtype = d.clone();
        }
        StEdit::SetShape(i, s) => {
            if file.entries[i % n].shape == *s {
                return None;
            }
            file.entries[i % n].shape = s.clone();
        }
        StEdit::SetOffsets(i, o) => {
            if file.entries[i % n].offsets == *o {
                return None;
            }
            file.entries[i % n].offsets = *o;
        }
        StEdit::HeaderLen(d) => {
            let mut bytes = file.to_bytes();
            let len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            let new = if *d == i64::MAX {
                u64::MAX
            } else {
                len.checked_add_signed(*d)?
            };
            bytes[..8].copy_from_slice(&new.to_le_bytes());
            return Some(bytes);
        }
        StEdit::NonUtf8 { at, byte } => {
            let mut bytes = file.to_bytes();
            let header_len = bytes.len() - file.data.len() - 8;
            bytes[8 + at % header_len] = *byte;
            return Some(bytes);
        }
        StEdit::Truncate(per_mille) => {
            let mut bytes = file.to_bytes();
            bytes.truncate(bytes.len() * *per_mille as usize / 1000);
            return Some(bytes);
        }
        StEdit::Extend(k) => {
            let mut bytes = file.to_bytes();
            bytes.extend(std::iter::repeat_n(0x41, *k));
            return Some(bytes);
        }
    }
    Some(file.to_bytes())
}

#[test]
fn valid_safetensors_files_parse_to_their_config() {
    check(
        "valid safetensors",
        small_st_config(),
        |(t, v, l, nh, c, dtype, prefix)| {
            let bytes = StFile::gpt2(t, v, l, c, dtype, prefix).to_bytes();
            let acc = parse_everywhere(&bytes, Some(nh as usize))?;
            prop_assert_eq!(acc.any, Some(Format::Safetensors));
            let w = st::parse(&bytes, Some(nh as usize)).unwrap();
            let cfg = w.config;
            let [t, v, l, nh, c] = [t, v, l, nh, c].map(|x| x as usize);
            prop_assert_eq!(
                [
                    cfg.max_seq_len,
                    cfg.vocab_size,
                    cfg.num_layers,
                    cfg.num_heads,
                    cfg.channels
                ],
                [t, v, l, nh, c]
            );
            prop_assert_eq!(cfg.padded_vocab_size, v.div_ceil(128) * 128);
            // No head count and a width that is not a published GPT-2 size.
            let unknown = matches!(st::parse(&bytes, None), Err(FormatError::UnknownHeadCount { .. }));
            prop_assert!(unknown, "a width that is no GPT-2 size needs a head count");
            Ok(())
        },
    );
}

#[test]
fn mutated_safetensors_files_are_rejected_unless_still_valid() {
    let strategy = (small_st_config(), st_edit(), any::<u8>());
    check(
        "mutated safetensors",
        strategy,
        |((t, v, l, nh, c, dtype, prefix), edit, other_nh)| {
            let file = StFile::gpt2(t, v, l, c, dtype, prefix);
            let Some(bytes) = apply(file, &edit) else {
                return Ok(());
            };
            let nh = nh as usize;
            let acc = parse_everywhere(&bytes, Some(nh))?;
            prop_assert_eq!(
                acc.safetensors,
                edit.keeps_valid(),
                "safetensors::parse after {:?}",
                edit
            );
            // Any other head count: no panic, and the invariants if accepted.
            parse_everywhere(&bytes, Some(usize::from(other_nh)))?;
            Ok(())
        },
    );
}

/// Several edits at once, some of which may cancel out: only "no panic and
/// consistent if accepted".
#[test]
fn multiply_mutated_safetensors_files_never_panic() {
    let strategy = (small_st_config(), prop::collection::vec(st_edit(), 2..5));
    check(
        "multiply mutated safetensors",
        strategy,
        |((t, v, l, nh, c, dtype, prefix), edits)| {
            let mut bytes = StFile::gpt2(t, v, l, c, dtype, prefix).to_bytes();
            for edit in &edits {
                // Byte-level edits apply to the current bytes; structural ones
                // restart from a file parsed back out of them when possible.
                bytes = match edit {
                    StEdit::Truncate(p) => bytes[..bytes.len() * *p as usize / 1000].to_vec(),
                    StEdit::Extend(k) => {
                        bytes.extend(std::iter::repeat_n(0x41, *k));
                        bytes
                    }
                    StEdit::NonUtf8 { at, byte } if bytes.len() > 8 => {
                        let i = 8 + at % (bytes.len() - 8);
                        bytes[i] = *byte;
                        bytes
                    }
                    _ => apply(StFile::gpt2(t, v, l, c, dtype, prefix), edit).unwrap_or(bytes),
                };
                parse_everywhere(&bytes, Some(nh as usize))?;
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------
// The committed cargo-fuzz corpus and crashers.

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Files of every `<kind>/<target>/` folder under fuzz/ that exists.
fn committed_inputs(kind: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(targets) = std::fs::read_dir(fuzz_dir().join(kind)) else {
        return files;
    };
    for target in targets {
        let target = target.unwrap().path();
        if !target.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&target).unwrap() {
            let f = f.unwrap().path();
            if f.is_file() {
                files.push(f);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn committed_fuzz_corpus_and_crashers_replay_cleanly() {
    for target in ["fuzz_llmc", "fuzz_safetensors"] {
        let dir = fuzz_dir().join("corpus").join(target);
        let n = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
        assert!(n > 0, "no committed corpus in {}", dir.display());
    }
    let mut files = committed_inputs("corpus");
    files.extend(committed_inputs("regressions"));
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if let Err(e) = fuzz_target_replay(&data) {
            panic!("{}: {e}", f.display());
        }
    }
    eprintln!("replayed {} committed fuzz inputs", files.len());
}
