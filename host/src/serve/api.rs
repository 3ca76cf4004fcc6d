//! The OpenAI completions API: request parsing and validation, error
//! objects, reply and stream-chunk bodies.
//!
//! Parsing is strict, as the OpenAI API is: unknown fields, wrong types and
//! values out of range are a 400 with an error object naming the field, so a
//! client learns of a typo instead of silently getting defaults.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::sample::Sampler;
use crate::sample::SamplingParams;

/// `max_tokens` when the request leaves it out (OpenAI's default).
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// OpenAI's default temperature.
pub const DEFAULT_TEMPERATURE: f32 = 1.0;
/// Largest temperature OpenAI accepts.
pub const MAX_TEMPERATURE: f32 = 2.0;
/// At most this many stop strings (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;
/// At most this many prompts in one request.
pub const MAX_PROMPTS: usize = 64;

/// An error reply: HTTP status and OpenAI's error object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code: None,
        }
    }

    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// `stream_options` (OpenAI): `include_usage` adds a last chunk with usage.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The body of `POST /v1/completions` as sent. `prompt` and `stop` take
/// several shapes and are checked by hand for clear messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompletionRequest {
    #[serde(default)]
    model: Option<String>,
    prompt: Option<Value>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    top_k: Option<i64>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    stop: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    n: Option<i64>,
    #[serde(default)]
    user: Option<String>,
}

/// A checked completion request.
#[derive(Clone, Debug)]
pub struct CompletionRequest {
    pub model: Option<String>,
    /// One or more prompts (one choice each).
    pub prompts: Vec<String>,
    /// Requested tokens per prompt; `None`: [`DEFAULT_MAX_TOKENS`], cut to
    /// what the context leaves.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Parses and checks a request body (everything that does not need the
/// tokenizer or the model).
pub fn parse_completion_request(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let raw: RawCompletionRequest = serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON"
        } else {
            "the body does not match the completions request"
        };
        ApiError::invalid(None, format!("{what}: {e}"))
    })?;
    let _ = raw.user; // accepted for compatibility, not used
    let prompts = match raw.prompt {
        None => return Err(ApiError::invalid(Some("prompt"), "`prompt` is required")),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid(
                    Some("prompt"),
                    "`prompt` must be a string or a list of strings (token arrays are not supported)",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                Some("prompt"),
                "`prompt` must be a string or a list of strings",
            ));
        }
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(Some("prompt"), "`prompt` is an empty list"));
    }
    if prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!("at most {MAX_PROMPTS} prompts per request, got {}", prompts.len()),
        ));
    }
    if let Some(i) = prompts.iter().position(String::is_empty) {
        return Err(ApiError::invalid(Some("prompt"), format!("prompt {i} is empty")));
    }
    let max_tokens = match raw.max_tokens {
        None => None,
        Some(m) if m >= 1 => Some(usize::try_from(m).unwrap_or(usize::MAX)),
        Some(m) => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                format!("`max_tokens` must be at least 1, got {m}"),
            ));
        }
    };
    let temperature = raw.temperature.unwrap_or(DEFAULT_TEMPERATURE);
    if !(0.0..=MAX_TEMPERATURE).contains(&temperature) {
        return Err(ApiError::invalid(
            Some("temperature"),
            format!("`temperature` must be in [0, {MAX_TEMPERATURE}], got {temperature}"),
        ));
    }
    let top_p = raw.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            Some("top_p"),
            format!("`top_p` must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match raw.top_k {
        None => 0,
        Some(k) if k >= 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                Some("top_k"),
                format!("`top_k` must be >= 0 (0 = no limit), got {k}"),
            ));
        }
    };
    if let Some(n) = raw.n
        && n != 1
    {
        return Err(ApiError::invalid(
            Some("n"),
            format!("only `n` = 1 is supported, got {n}"),
        ));
    }
    let stop = match raw.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid(
                    Some("stop"),
                    "`stop` must be a string or a list of strings",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                Some("stop"),
                "`stop` must be a string or a list of strings",
            ));
        }
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            Some("stop"),
            format!("at most {MAX_STOP_STRINGS} stop strings, got {}", stop.len()),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(Some("stop"), "a stop string is empty"));
    }
    let sampling = SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: raw.seed,
    };
    // The sampler's own checks, so the server and the CLI accept the same.
    Sampler::new(sampling).map_err(|e| ApiError::invalid(None, format!("{e:#}")))?;
    let stream = raw.stream.unwrap_or(false);
    if raw.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            Some("stream_options"),
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    Ok(CompletionRequest {
        model: raw.model,
        prompts,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage: raw.stream_options.is_some_and(|o| o.include_usage),
    })
}

/// Why a choice ended, as OpenAI names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop string or `<|endoftext|>`.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Token counts of a reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    pub fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        })
    }
}

/// One choice of a reply or chunk.
pub fn choice_json(index: usize, text: &str, finish: Option<FinishReason>) -> Value {
    json!({
        "text": text,
        "index": index,
        "logprobs": null,
        "finish_reason": finish.map(FinishReason::as_str),
    })
}

/// A `text_completion` object (a whole reply, or one stream chunk).
pub fn completion_json(id: &str, created: u64, model: &str, choices: Vec<Value>, usage: Option<Usage>) -> Value {
    let mut v = json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    });
    if let Some(u) = usage {
        v["usage"] = u.json();
    }
    v
}
