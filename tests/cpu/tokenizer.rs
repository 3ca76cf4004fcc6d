//! GPT-2 tokenizer: pinned files, known ids, round trips, streaming decode.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use host::tokenizer::{Gpt2Tokenizer, MERGES_FILE, TokenizerError, VOCAB_FILE};
use rand::Rng;

use crate::common::Scratch;
use sha2::{Digest, Sha256};

const VOCAB_SHA256: &str = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783";
const MERGES_SHA256: &str = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5";
const GPT2_VOCAB_SIZE: usize = 50257;
const GPT2_EOT: u32 = 50256;

fn tok() -> &'static Gpt2Tokenizer {
    static TOK: OnceLock<Gpt2Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Gpt2Tokenizer::default_files().expect("weights/gpt2 tokenizer files"))
}

/// Relative to the working directory: cargo runs these tests from the
/// repository root, and so does the GPU runner, wherever the tree was copied.
fn repo_dir() -> PathBuf {
    Path::new("weights").join("gpt2")
}

#[test]
fn tokenizer_files_are_pinned() {
    for (file, want) in [(VOCAB_FILE, VOCAB_SHA256), (MERGES_FILE, MERGES_SHA256)] {
        let bytes = std::fs::read(repo_dir().join(file)).unwrap();
        let got: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want, "{file}");
    }
}

#[test]
fn known_ids() {
    let t = tok();
    assert_eq!(t.vocab_size(), GPT2_VOCAB_SIZE);
    assert_eq!(t.eot(), GPT2_EOT);
    assert_eq!(t.encode("Hello world").unwrap(), [15496, 995]);
    assert_eq!(
        t.encode("Hello world, this is GPT-2.").unwrap(),
        [15496, 995, 11, 428, 318, 402, 11571, 12, 17, 13]
    );
    assert_eq!(t.decode(&[15496, 995]).unwrap(), "Hello world");
    assert_eq!(t.encode("<|endoftext|>").unwrap(), [GPT2_EOT]);
    assert_eq!(t.decode(&[GPT2_EOT]).unwrap(), "<|endoftext|>");
    assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
    // Leading space belongs to the word (no prefix space added).
    assert_eq!(t.encode(" world").unwrap(), [995]);
}

/// A random string mixing ASCII, Latin-1, Greek, CJK, emoji (with ZWJ
/// sequences and skin tones), combining marks and whitespace.
fn random_text(rng: &mut impl Rng) -> String {
    const RANGES: [(u32, u32); 9] = [
        (0x20, 0x7E),
        (0xA0, 0xFF),
        (0x370, 0x3FF),
        (0x4E00, 0x9FFF),
        (0x1F300, 0x1F6FF),
        (0x1F900, 0x1F9FF),
        (0x300, 0x36F),
        (0xAC00, 0xD7A3),
        (0x1F3FB, 0x1F3FF),
    ];
    const SPECIAL: [char; 6] = ['\n', '\t', ' ', '\u{200D}', '\r', '\u{FE0F}'];
    let len = rng.random_range(0..60);
    (0..len)
        .map(|_| {
            if rng.random_bool(0.15) {
                return SPECIAL[rng.random_range(0..SPECIAL.len())];
            }
            let (lo, hi) = RANGES[rng.random_range(0..RANGES.len())];
            char::from_u32(rng.random_range(lo..=hi)).unwrap_or('?')
        })
        .collect()
}

/// Streams `ids` one by one: checks no chunk holds a replacement character
/// (no split character) when the full decode has none, and returns the
/// concatenation.
fn stream(t: &Gpt2Tokenizer, ids: &[u32]) -> String {
    let mut dec = t.stream_decoder();
    let mut out = String::new();
    for &id in ids {
        if let Some(chunk) = dec.push(id) {
            assert!(!chunk.is_empty());
            out.push_str(&chunk);
        }
    }
    if let Some(rest) = dec.finish() {
        out.push_str(&rest);
    }
    out
}

#[test]
fn random_unicode_round_trips_and_streams() {
    let t = tok();
    let mut rng = crate::seed::rng();
    for _ in 0..300 {
        let s = random_text(&mut rng);
        let ids = t.encode(&s).unwrap();
        assert!(ids.iter().all(|&id| (id as usize) < GPT2_VOCAB_SIZE));
        assert_eq!(t.decode(&ids).unwrap(), s, "ids {ids:?}");
        let streamed = stream(t, &ids);
        assert_eq!(streamed, s);
        assert!(!streamed.contains('\u{FFFD}'));
    }
}

#[test]
fn emoji_and_cjk_split_across_tokens_stream_whole() {
    let t = tok();
    let s = "🦀 Rust 你好，世界! 👩‍👩‍👧 Ünïcödé 🎉🎉 𝔘𝔫𝔦";
    let ids = t.encode(s).unwrap();
    // The point of the test: some tokens are not whole characters.
    let partial = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(t.token_bytes(id).unwrap()).is_err())
        .count();
    assert!(partial > 0, "expected tokens holding partial characters");
    let mut dec = t.stream_decoder();
    let mut out = String::new();
    let mut held = 0;
    for &id in &ids {
        match dec.push(id) {
            Some(chunk) => {
                assert!(!chunk.contains('\u{FFFD}'), "split character in {chunk:?}");
                out.push_str(&chunk);
            }
            None => held += 1,
        }
    }
    assert!(held > 0, "some pushes must be held back");
    assert_eq!(dec.finish(), None);
    assert_eq!(out, s);
    assert_eq!(out, t.decode(&ids).unwrap());
}

#[test]
fn stream_matches_lossy_decode_of_cut_sequences() {
    let t = tok();
    let ids = t.encode("a🦀b你c").unwrap();
    let mut rng = crate::seed::rng();
    // Random sub-sequences (cutting characters) and shuffles: the stream
    // must still equal the (lossy) full decode.
    for _ in 0..200 {
        let a = rng.random_range(0..ids.len());
        let b = rng.random_range(a..=ids.len());
        let mut sub = ids[a..b].to_vec();
        if rng.random_bool(0.5) {
            sub.reverse();
        }
        assert_eq!(stream(t, &sub), t.decode(&sub).unwrap(), "{sub:?}");
    }
    // Cut at the end: finish flushes a replacement character.
    let crab = t.encode("🦀").unwrap();
    assert!(crab.len() > 1);
    let mut dec = t.stream_decoder();
    assert_eq!(dec.push(crab[0]), None);
    assert_eq!(dec.finish().as_deref(), Some("\u{FFFD}"));
}

#[test]
fn bad_ids_are_errors_not_panics() {
    let t = tok();
    let bad = GPT2_VOCAB_SIZE as u32;
    assert!(matches!(t.decode(&[15496, bad]), Err(TokenizerError::UnknownId { id, .. }) if id == bad));
    assert!(matches!(t.decode(&[u32::MAX]), Err(TokenizerError::UnknownId { .. })));
    let mut dec = t.stream_decoder();
    assert!(dec.try_push(bad).is_err());
    assert_eq!(dec.push(bad).as_deref(), Some("\u{FFFD}"));
    assert_eq!(dec.push(15496).as_deref(), Some("Hello"));
}

#[test]
fn missing_or_corrupt_files_name_the_file() {
    let dir = Scratch::new("tok-test");
    let (v, m) = (dir.path().join(VOCAB_FILE), dir.path().join(MERGES_FILE));
    let load = || Gpt2Tokenizer::from_files(&v, &m).unwrap_err();
    let names = |e: &TokenizerError, file: &str| assert!(e.to_string().contains(file), "{e}");

    let e = load();
    assert!(matches!(e, TokenizerError::Read { .. }));
    names(&e, VOCAB_FILE);

    std::fs::copy(repo_dir().join(VOCAB_FILE), &v).unwrap();
    let e = load();
    assert!(matches!(e, TokenizerError::Read { .. }));
    names(&e, MERGES_FILE);

    std::fs::write(&m, "#version: 0.2\nĠ t\nthis line has three\n").unwrap();
    let e = load();
    assert!(
        matches!(e, TokenizerError::Invalid { .. }) && e.to_string().contains("line 3"),
        "{e}"
    );
    names(&e, MERGES_FILE);
    std::fs::write(&m, "#version: 0.2\n").unwrap();
    names(&load(), MERGES_FILE);
    // A merge of tokens the vocabulary lacks.
    std::fs::write(&m, "#version: 0.2\nĠ t\nzzzzqq xxxyy\n").unwrap();
    assert!(matches!(load(), TokenizerError::Build { .. }));

    std::fs::copy(repo_dir().join(MERGES_FILE), &m).unwrap();
    for corrupt in [
        "{ not json",
        "[1, 2]",
        r#"{"a": -1}"#,
        r#"{"a": 0, "b": 0}"#,
        r#"{"a": 0, "b": 5}"#,
        r#"{"a": 0}"#,
        "",
    ] {
        std::fs::write(&v, corrupt).unwrap();
        let e = load();
        assert!(matches!(e, TokenizerError::Invalid { .. }), "{corrupt}: {e}");
        names(&e, VOCAB_FILE);
    }
    // Truncated at random points: an error, never a panic.
    let full = std::fs::read(repo_dir().join(VOCAB_FILE)).unwrap();
    let mut rng = crate::seed::rng();
    for _ in 0..5 {
        std::fs::write(&v, &full[..rng.random_range(0..full.len())]).unwrap();
        assert!(Gpt2Tokenizer::from_files(&v, &m).is_err());
    }
}
