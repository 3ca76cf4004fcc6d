//! GPT-2's byte-level BPE tokenizer (Hugging Face `tokenizers`), from
//! `vocab.json` and `merges.txt` (committed under `weights/gpt2/` and
//! embedded in the programs, so they work from any directory and after
//! `cargo install`), plus a streaming decoder that never splits a UTF-8
//! character.
//!
//! GPT-2 tokens are sequences of bytes, not of characters: a multi-byte
//! character (emoji, CJK) can span several tokens, so decoding tokens one at a
//! time must hold back the bytes of an incomplete character.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// File names inside a tokenizer directory.
pub const VOCAB_FILE: &str = "vocab.json";
pub const MERGES_FILE: &str = "merges.txt";
/// Environment variable naming a directory of tokenizer files to use
/// instead of the embedded ones.
pub const DIR_ENV: &str = "GPT2_TOKENIZER_DIR";
/// GPT-2's `vocab.json` and `merges.txt`, embedded at build time (1.5 MB):
/// a program installed anywhere still has its tokenizer.
const EMBEDDED_VOCAB: &str = include_str!("../../weights/gpt2/vocab.json");
const EMBEDDED_MERGES: &str = include_str!("../../weights/gpt2/merges.txt");
/// How errors name the embedded files.
const EMBEDDED_VOCAB_NAME: &str = "<embedded weights/gpt2/vocab.json>";
const EMBEDDED_MERGES_NAME: &str = "<embedded weights/gpt2/merges.txt>";
/// GPT-2's end-of-text token, a special token of the vocabulary.
pub const EOT_TEXT: &str = "<|endoftext|>";
/// First line of OpenAI's merges file; not a merge.
const MERGES_VERSION_PREFIX: &str = "#version";
/// Shown in place of bytes that are not valid UTF-8 (as `from_utf8_lossy` does).
const REPLACEMENT: char = char::REPLACEMENT_CHARACTER;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read tokenizer file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("tokenizer file {}: {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
    #[error("cannot build the BPE tokenizer from {} and {}: {msg}", vocab.display(), merges.display())]
    Build {
        vocab: PathBuf,
        merges: PathBuf,
        msg: String,
    },
    #[error("cannot encode the text: {0}")]
    Encode(String),
    #[error("cannot decode: {0}")]
    Decode(String),
    #[error("token id {id} is outside the vocabulary ({size} tokens)")]
    UnknownId { id: u32, size: usize },
}

/// GPT-2's byte <-> printable character table (`bytes_to_unicode` of
/// OpenAI's encoder.py): printable Latin-1 bytes map to themselves, the
/// others to U+0100 upwards in byte order.
fn byte_to_char_table() -> [char; 256] {
    const PRINTABLE: [std::ops::RangeInclusive<u8>; 3] = [b'!'..=b'~', 0xA1..=0xAC, 0xAE..=0xFF];
    const FIRST_SHIFTED: u32 = 0x100;
    let mut table = ['\0'; 256];
    let mut next = FIRST_SHIFTED;
    for b in 0..=255u8 {
        let c = if PRINTABLE.iter().any(|r| r.contains(&b)) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(REPLACEMENT);
            next += 1;
            c
        };
        table[usize::from(b)] = c;
    }
    table
}

/// GPT-2's tokenizer.
pub struct Gpt2Tokenizer {
    inner: Tokenizer,
    /// The raw bytes of every token, indexed by id (for streaming).
    token_bytes: Vec<Vec<u8>>,
    eot: u32,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpt2Tokenizer")
            .field("vocab_size", &self.token_bytes.len())
            .field("eot", &self.eot)
            .finish()
    }
}

fn read(path: &Path) -> Result<String, TokenizerError> {
    std::fs::read_to_string(path).map_err(|source| TokenizerError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(path: &Path, msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Invalid {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Parses merges.txt: an optional `#version` line, then one `left right`
/// pair per line.
fn parse_merges(path: &Path, text: &str) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut merges = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if (i == 0 && line.starts_with(MERGES_VERSION_PREFIX)) || line.is_empty() {
            continue;
        }
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => merges.push((a.to_string(), b.to_string())),
            _ => {
                return Err(invalid(
                    path,
                    format!("line {}: expected two tokens separated by a space: {line:?}", i + 1),
                ));
            }
        }
    }
    if merges.is_empty() {
        return Err(invalid(path, "no merges"));
    }
    Ok(merges)
}

impl Gpt2Tokenizer {
    /// Loads the tokenizer from OpenAI/Hugging Face `vocab.json` and `merges.txt`.
    pub fn from_files(vocab_path: &Path, merges_path: &Path) -> Result<Gpt2Tokenizer, TokenizerError> {
        Self::from_texts(vocab_path, &read(vocab_path)?, merges_path, &read(merges_path)?)
    }

    /// GPT-2's own tokenizer, from the files embedded at build time.
    pub fn embedded() -> Result<Gpt2Tokenizer, TokenizerError> {
        Self::from_texts(
            Path::new(EMBEDDED_VOCAB_NAME),
            EMBEDDED_VOCAB,
            Path::new(EMBEDDED_MERGES_NAME),
            EMBEDDED_MERGES,
        )
    }

    /// The tokenizer from the texts of `vocab.json` and `merges.txt`
    /// (`vocab_path` and `merges_path` name them in errors).
    fn from_texts(
        vocab_path: &Path,
        vocab_text: &str,
        merges_path: &Path,
        merges_text: &str,
    ) -> Result<Gpt2Tokenizer, TokenizerError> {
        let vocab: HashMap<String, u32> = serde_json::from_str(vocab_text)
            .map_err(|e| invalid(vocab_path, format!("not a JSON object of token -> id: {e}")))?;
        let merges = parse_merges(merges_path, merges_text)?;

        // Ids must be exactly 0..n so they index `token_bytes`.
        let mut by_id: Vec<Option<&str>> = vec![None; vocab.len()];
        for (token, &id) in &vocab {
            match by_id.get_mut(id as usize) {
                Some(slot @ None) => *slot = Some(token),
                Some(Some(other)) => {
                    return Err(invalid(
                        vocab_path,
                        format!("tokens {other:?} and {token:?} share id {id}"),
                    ));
                }
                None => {
                    return Err(invalid(
                        vocab_path,
                        format!("id {id} of {token:?} is not below {}", vocab.len()),
                    ));
                }
            }
        }
        let eot = *vocab
            .get(EOT_TEXT)
            .ok_or_else(|| invalid(vocab_path, format!("no {EOT_TEXT} token")))?;
        let table = byte_to_char_table();
        let char_to_byte: HashMap<char, u8> = (0..=255u8).map(|b| (table[usize::from(b)], b)).collect();
        // Every slot is filled: n distinct ids below n.
        let token_bytes = by_id
            .iter()
            .map(|t| {
                let t = t.unwrap_or_default();
                // Tokens outside the byte alphabet (none in GPT-2) are their UTF-8.
                t.chars()
                    .map(|c| char_to_byte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| t.as_bytes().to_vec())
            })
            .collect();

        let build_err = |msg: String| TokenizerError::Build {
            vocab: vocab_path.to_path_buf(),
            merges: merges_path.to_path_buf(),
            msg,
        };
        let vocab: Vocab = vocab.into_iter().collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| build_err(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        // GPT-2: no prefix space; the regex splits words like OpenAI's encoder.
        let byte_level = ByteLevel::new(false, true, true);
        inner.with_pre_tokenizer(Some(byte_level));
        inner.with_decoder(Some(byte_level));
        // `<|endoftext|>` in a prompt is the special token, as in Hugging Face's GPT-2.
        inner.add_special_tokens(&[AddedToken::from(EOT_TEXT, true)]);
        Ok(Gpt2Tokenizer {
            inner,
            token_bytes,
            eot,
        })
    }

    /// Loads `vocab.json` and `merges.txt` from `dir`.
    pub fn from_dir(dir: &Path) -> Result<Gpt2Tokenizer, TokenizerError> {
        Self::from_files(&dir.join(VOCAB_FILE), &dir.join(MERGES_FILE))
    }

    /// The tokenizer the programs use: the files in `$GPT2_TOKENIZER_DIR`
    /// when it is set, else the embedded ones ([`Self::embedded`]).
    pub fn default_files() -> Result<Gpt2Tokenizer, TokenizerError> {
        match std::env::var_os(DIR_ENV) {
            Some(dir) => Self::from_dir(Path::new(&dir)),
            None => Self::embedded(),
        }
    }

    /// Number of tokens (50257 for GPT-2).
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The end-of-text token (50256).
    pub fn eot(&self) -> u32 {
        self.eot
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    fn check_id(&self, id: u32) -> Result<(), TokenizerError> {
        if (id as usize) < self.token_bytes.len() {
            Ok(())
        } else {
            Err(TokenizerError::UnknownId {
                id,
                size: self.token_bytes.len(),
            })
        }
    }

    /// Decodes ids to text; bytes that are not valid UTF-8 (a character cut
    /// off at either end) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        ids.iter().try_for_each(|&id| self.check_id(id))?;
        self.inner
            .decode(ids, false)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// The raw bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.check_id(id)?;
        Ok(&self.token_bytes[id as usize])
    }

    /// A decoder for ids arriving one at a time.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }
}

/// Decodes ids one at a time, emitting only whole UTF-8 characters: the bytes
/// of a character split across tokens are held until it is complete. The
/// concatenation of everything emitted (including [`StreamDecoder::finish`])
/// equals [`Gpt2Tokenizer::decode`] of all the ids.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Gpt2Tokenizer,
    /// Bytes of an incomplete trailing character (at most 3).
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text completed by it, if any. Errors on an
    /// id outside the vocabulary (nothing is consumed then).
    pub fn try_push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        let bytes = self.tokenizer.token_bytes(id)?;
        self.pending.extend_from_slice(bytes);
        Ok(self.drain(false))
    }

    /// Like [`Self::try_push`], but an id outside the vocabulary (which a
    /// sampler over the real vocabulary never produces) shows as U+FFFD
    /// instead of an error, so streaming never stops on it.
    pub fn push(&mut self, id: u32) -> Option<String> {
        match self.try_push(id) {
            Ok(text) => text,
            Err(_) => {
                let mut text = self.drain(true).unwrap_or_default();
                text.push(REPLACEMENT);
                Some(text)
            }
        }
    }

    /// Flushes the held bytes of an unfinished character (as U+FFFD).
    pub fn finish(&mut self) -> Option<String> {
        self.drain(true)
    }

    /// Emits every complete character of `pending`, replacing invalid
    /// sequences like `String::from_utf8_lossy`; keeps an incomplete tail
    /// unless `at_end`.
    fn drain(&mut self, at_end: bool) -> Option<String> {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(n) => {
                            out.push(REPLACEMENT);
                            rest = after.get(n..).unwrap_or_default();
                        }
                        None if at_end => {
                            out.push(REPLACEMENT);
                            rest = &[];
                            break;
                        }
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        (!out.is_empty()).then_some(out)
    }
}
