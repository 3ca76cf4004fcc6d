//! Opening a checkpoint file: memory-map it, detect its format (llm.c `.bin`
//! or Hugging Face safetensors), parse and validate it once into a
//! [`Layout`], and hand out zero-copy [`Weights`] views from that layout.
//!
//! The parsers themselves work on `&[u8]` ([`super::llmc::parse`],
//! [`super::safetensors::parse`]) so they can be fuzzed without files.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::config::ModelConfig;
pub use super::format::FormatError;
use super::llmc;
use super::safetensors as st;
use super::weights::{DType, Layout, Weights};

/// Which on-disk format a checkpoint is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// llm.c's `gpt2_*.bin`: a 256-int32 header then the 16 parameter tensors.
    Llmc,
    /// Hugging Face `model.safetensors` (Conv1D weights stored (in, out)).
    Safetensors,
}

/// A checkpoint problem, naming the file.
#[derive(Debug)]
pub struct CheckpointError {
    pub path: PathBuf,
    pub kind: FormatError,
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {}: {}", self.path.display(), self.kind)
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.kind.source()
    }
}

/// The checkpoint's bytes: a read-only file map, or a buffer (tests, fuzzing).
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// Thin wrapper around the one `unsafe` call of the loader.
///
/// Safety contract (memmap2's): the mapped file must not be modified or
/// truncated by anyone while the map lives, or reads of it are undefined
/// behaviour. A checkpoint is a read-only input that nothing in this program
/// writes while it is open; users must not rewrite it during a run either.
fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: see the contract above; the map is read-only.
    unsafe { memmap2::Mmap::map(file) }
}

/// An opened checkpoint: its bytes, format and validated layout (config
/// and where every tensor lies).
pub struct Checkpoint {
    path: PathBuf,
    bytes: Bytes,
    format: Format,
    layout: Layout,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("config", &self.layout.config)
            .field("dtype", &self.layout.dtype())
            .field("len", &self.bytes.as_slice().len())
            .finish()
    }
}

/// Name of the Hugging Face config file looked for next to a safetensors file.
pub const HF_CONFIG_FILE: &str = "config.json";

impl Checkpoint {
    /// Memory-maps `path`, detects its format and validates it completely
    /// (header, sizes, every tensor's presence, shape and dtype).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let err = |kind: FormatError| CheckpointError {
            path: path.to_path_buf(),
            kind,
        };
        let file = File::open(path).map_err(|e| err(e.into()))?;
        let meta = file.metadata().map_err(|e| err(e.into()))?;
        if !meta.is_file() {
            return Err(err(FormatError::NotAFile));
        }
        if meta.len() == 0 {
            return Err(err(FormatError::Empty));
        }
        let map = map_file(&file).map_err(|e| err(e.into()))?;
        // Only safetensors needs config.json (for the head count).
        let num_heads = match path.parent() {
            Some(dir) if llmc::first_int(&map) != Some(llmc::MAGIC) => {
                read_hf_num_heads(&dir.join(HF_CONFIG_FILE)).map_err(err)?
            }
            _ => None,
        };
        Self::build(path.to_path_buf(), Bytes::Mapped(map), num_heads)
    }

    /// A checkpoint held in memory (tests, fuzzing). `name` is used in error
    /// messages; `num_heads` stands in for a safetensors `config.json`.
    pub fn from_bytes(
        bytes: Vec<u8>,
        name: impl Into<PathBuf>,
        num_heads: Option<usize>,
    ) -> Result<Checkpoint, CheckpointError> {
        Self::build(name.into(), Bytes::Owned(bytes), num_heads)
    }

    fn build(path: PathBuf, bytes: Bytes, num_heads: Option<usize>) -> Result<Checkpoint, CheckpointError> {
        match parse_any_layout(bytes.as_slice(), num_heads) {
            Ok((format, layout)) => Ok(Checkpoint {
                path,
                bytes,
                format,
                layout,
            }),
            Err(kind) => Err(CheckpointError { path, kind }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn config(&self) -> &ModelConfig {
        &self.layout.config
    }

    /// The dtype shared by all tensors.
    pub fn dtype(&self) -> DType {
        self.layout.dtype()
    }

    /// Where every tensor lies in [`Checkpoint::bytes`], as opening found it.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The raw bytes of the whole file.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Zero-copy views of every parameter, from the layout that opening
    /// the checkpoint validated: nothing is parsed again, so this never
    /// fails (the `Result` keeps callers' error paths as they were).
    pub fn weights(&self) -> Result<Weights<'_>, CheckpointError> {
        Ok(self.layout.weights(self.bytes.as_slice()))
    }
}

/// Detects the format of `bytes` and parses it. llm.c files are recognised
/// by their magic number; anything else must be safetensors.
pub fn parse_any(bytes: &[u8], num_heads: Option<usize>) -> Result<(Format, Weights<'_>), FormatError> {
    let (format, layout) = parse_any_layout(bytes, num_heads)?;
    Ok((format, layout.weights(bytes)))
}

/// [`parse_any`], giving where the tensors lie (owned) instead of views.
pub fn parse_any_layout(bytes: &[u8], num_heads: Option<usize>) -> Result<(Format, Layout), FormatError> {
    if bytes.is_empty() {
        return Err(FormatError::Empty);
    }
    match llmc::first_int(bytes) {
        Some(llmc::MAGIC) => return Ok((Format::Llmc, llmc::parse_layout(bytes)?)),
        Some(llmc::STATE_MAGIC) => {
            return Err(FormatError::WrongLlmcFile { what: "debug state" });
        }
        Some(llmc::TOKENIZER_MAGIC) => {
            return Err(FormatError::WrongLlmcFile { what: "tokenizer" });
        }
        _ => {}
    }
    match st::parse_layout(bytes, num_heads) {
        Ok(layout) => Ok((Format::Safetensors, layout)),
        Err(FormatError::Safetensors(e)) => Err(FormatError::UnrecognizedFormat(llmc::MAGIC, e)),
        Err(e) => Err(e),
    }
}

/// Reads `n_head` from a Hugging Face `config.json` if the file exists (the
/// other sizes are inferred from the tensors themselves). A config.json that
/// exists but cannot be read or parsed is an error naming the file.
pub fn read_hf_num_heads(path: &Path) -> Result<Option<usize>, FormatError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(FormatError::ConfigJson(format!("{}: {e}", path.display()))),
    };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| FormatError::ConfigJson(format!("{}: {e}", path.display())))?;
    match value.get("n_head").or_else(|| value.get("num_attention_heads")) {
        None => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(FormatError::ConfigJson(format!(
                "{}: n_head = {v} is not a positive integer",
                path.display()
            ))),
        },
    }
}
