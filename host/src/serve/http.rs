//! The HTTP side: axum routes for the OpenAI completions API, models,
//! health and Prometheus metrics. Handlers check a request completely
//! (JSON, fields, tokenized length against the context) before queueing it,
//! so a bad request costs the engine nothing and never disturbs others.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::api::{
    ApiError, CompletionRequest, DEFAULT_MAX_TOKENS, FinishReason, Usage, choice_json, completion_json,
    parse_completion_request,
};
use super::engine::{Command, Event, Job, Metrics};
use crate::sample::Sampler;
use crate::tokenizer::Gpt2Tokenizer;

/// Seconds a client is told to wait (`Retry-After`) when the queue is full.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The sizes a server was started with, which requests are checked against.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Positions per sequence (prompt + completion).
    pub max_seq_len: usize,
    /// The model's vocabulary (a prompt token beyond it is refused).
    pub vocab_size: usize,
    /// KV cache slots (running sequences at most).
    pub slots: usize,
    /// Jobs that may wait for a slot before requests get 429.
    pub max_queue: usize,
}

/// What every handler shares.
pub struct AppState {
    pub commands: Sender<Command>,
    pub tokenizer: Arc<Gpt2Tokenizer>,
    pub metrics: Arc<Metrics>,
    /// The name `/v1/models` lists and replies carry.
    pub model_id: String,
    pub limits: ServerLimits,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(
        commands: Sender<Command>,
        tokenizer: Arc<Gpt2Tokenizer>,
        metrics: Arc<Metrics>,
        model_id: String,
        limits: ServerLimits,
    ) -> AppState {
        AppState {
            commands,
            tokenizer,
            metrics,
            model_id,
            limits,
            next_id: AtomicU64::new(0),
        }
    }
}

/// The routes; anything else is a 404 (405 for a wrong method) with an
/// error object.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = json_response(status, &self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS.as_u16() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        resp
    }
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND.as_u16(),
        message: "no such route; the API serves POST /v1/completions, GET /v1/models, GET /health, GET /metrics".into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("not_found"),
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED.as_u16(),
        message: "method not allowed on this route".into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("method_not_allowed"),
    }
}

fn unavailable(message: &str) -> ApiError {
    ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE.as_u16(),
        message: message.into(),
        kind: "server_error",
        param: None,
        code: None,
    }
}

fn server_error(message: String) -> ApiError {
    ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR.as_u16(),
        message,
        kind: "server_error",
        param: None,
        code: None,
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{"id": state.model_id, "object": "model", "created": 0, "owned_by": "gpt2"}],
        }),
    )
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.metrics.engine_stopped.load(Ordering::Relaxed) {
        return unavailable("the engine has stopped").into_response();
    }
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let m = &state.metrics;
    let load = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::Relaxed);
    let load64 = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let gauges: [(&str, &str, &str, String); 10] = [
        (
            "gpt2_queue_depth",
            "gauge",
            "Prompts waiting for a KV cache slot.",
            load(&m.queued).to_string(),
        ),
        (
            "gpt2_running_sequences",
            "gauge",
            "Sequences in the running batch.",
            load(&m.running).to_string(),
        ),
        (
            "gpt2_kv_slots_in_use",
            "gauge",
            "KV cache slots held by sequences.",
            load(&m.running).to_string(),
        ),
        (
            "gpt2_kv_slots_total",
            "gauge",
            "KV cache slots (--max-running).",
            state.limits.slots.to_string(),
        ),
        (
            "gpt2_kv_positions_in_use",
            "gauge",
            "KV cache positions held, over all slots.",
            load(&m.kv_positions).to_string(),
        ),
        (
            "gpt2_kv_positions_total",
            "gauge",
            "KV cache positions, over all slots.",
            (state.limits.slots * state.limits.max_seq_len).to_string(),
        ),
        (
            "gpt2_tokens_per_second",
            "gauge",
            "Generated tokens per second over the last second.",
            format!("{:.3}", m.tokens_per_second()),
        ),
        (
            "gpt2_generated_tokens_total",
            "counter",
            "Completion tokens generated.",
            load64(&m.generated_tokens_total).to_string(),
        ),
        (
            "gpt2_prompt_tokens_total",
            "counter",
            "Prompt tokens accepted.",
            load64(&m.prompt_tokens_total).to_string(),
        ),
        (
            "gpt2_requests_rejected_total",
            "counter",
            "Requests refused because the queue was full.",
            load64(&m.rejected_total).to_string(),
        ),
    ];
    let mut text = String::new();
    for (name, kind, help, value) in gauges.iter().chain(std::iter::once(&(
        "gpt2_requests_total",
        "counter",
        "Completion requests accepted.",
        load64(&m.requests_total).to_string(),
    ))) {
        text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
    }
    let mut resp = (StatusCode::OK, text).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// A request checked against the model: its prompts' tokens and lengths.
struct Planned {
    prompts: Vec<Vec<u32>>,
    max_tokens: Vec<usize>,
}

fn plan(state: &AppState, req: &CompletionRequest) -> Result<Planned, ApiError> {
    let mut prompts = Vec::with_capacity(req.prompts.len());
    let mut max_tokens = Vec::with_capacity(req.prompts.len());
    let window = state.limits.max_seq_len;
    for (i, text) in req.prompts.iter().enumerate() {
        let ids = state
            .tokenizer
            .encode(text)
            .map_err(|e| ApiError::invalid(Some("prompt"), format!("cannot tokenize prompt {i}: {e}")))?;
        if ids.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), format!("prompt {i} has no tokens")));
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= state.limits.vocab_size) {
            return Err(ApiError::invalid(
                Some("prompt"),
                format!(
                    "prompt {i} has token {bad}, outside this model's vocabulary of {}",
                    state.limits.vocab_size
                ),
            ));
        }
        if ids.len() >= window {
            return Err(ApiError::invalid(
                Some("prompt"),
                format!(
                    "prompt {i} is {} tokens long; this server's context is {window} tokens, \
                     so a prompt may have at most {} to leave room for a completion",
                    ids.len(),
                    window - 1
                ),
            ));
        }
        let room = window - ids.len();
        let m = match req.max_tokens {
            None => DEFAULT_MAX_TOKENS.min(room),
            Some(m) if m <= room => m,
            Some(m) => {
                return Err(ApiError::invalid(
                    Some("max_tokens"),
                    format!(
                        "this server's maximum context length is {window} tokens, however you requested {} tokens \
                         ({} in prompt {i}; {m} for the completion)",
                        ids.len().saturating_add(m),
                        ids.len()
                    ),
                ));
            }
        };
        prompts.push(ids);
        max_tokens.push(m);
    }
    Ok(Planned { prompts, max_tokens })
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // A body over axum's size limit, or one that could not be read: the
    // same error object as every other refusal.
    let body = body.map_err(|e| ApiError {
        status: e.status().as_u16(),
        message: e.body_text(),
        kind: "invalid_request_error",
        param: None,
        code: None,
    })?;
    let req = parse_completion_request(&body)?;
    let planned = plan(&state, &req)?;
    let sampler = Sampler::new(req.sampling).map_err(|e| ApiError::invalid(None, format!("{e:#}")))?;
    let n = planned.prompts.len();

    if n > state.limits.max_queue {
        return Err(ApiError::invalid(
            Some("prompt"),
            format!(
                "{n} prompts can never fit this server's queue of {}",
                state.limits.max_queue
            ),
        ));
    }
    // Admission: room in the queue for every prompt, or 429.
    let metrics = &state.metrics;
    if metrics
        .queued
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
            (q + n <= state.limits.max_queue).then_some(q + n)
        })
        .is_err()
    {
        metrics.rejected_total.fetch_add(1, Ordering::Relaxed);
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS.as_u16(),
            message: format!(
                "the server is busy: {} prompts are already waiting (--max-queue); retry later",
                state.limits.max_queue
            ),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        });
    }
    let prompt_tokens: usize = planned.prompts.iter().map(Vec::len).sum();
    let (tx, rx) = unbounded_channel();
    let jobs = planned
        .prompts
        .into_iter()
        .zip(planned.max_tokens)
        .enumerate()
        .map(|(index, (prompt, max_tokens))| Job {
            index,
            prompt,
            max_tokens,
            settings: sampler.row(),
            stop: req.stop.clone(),
            events: tx.clone(),
        })
        .collect();
    drop(tx);
    if state.commands.send(Command::Submit(jobs)).is_err() {
        metrics.queued.fetch_sub(n, Ordering::AcqRel);
        return Err(unavailable("the engine has stopped"));
    }
    metrics.requests_total.fetch_add(1, Ordering::Relaxed);
    metrics
        .prompt_tokens_total
        .fetch_add(prompt_tokens as u64, Ordering::Relaxed);

    let id = format!(
        "cmpl-{:x}{:08x}",
        unix_now(),
        state.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let model = req.model.clone().unwrap_or_else(|| state.model_id.clone());
    let reply = Reply {
        id,
        created: unix_now(),
        model,
        n,
        prompt_tokens,
    };
    if req.stream {
        Ok(stream_response(reply, rx, req.include_usage))
    } else {
        collect_response(reply, rx).await
    }
}

/// What every chunk or reply of one request repeats.
struct Reply {
    id: String,
    created: u64,
    model: String,
    n: usize,
    prompt_tokens: usize,
}

impl Reply {
    fn object(&self, choices: Vec<Value>, usage: Option<Usage>) -> Value {
        completion_json(&self.id, self.created, &self.model, choices, usage)
    }
}

async fn collect_response(reply: Reply, mut rx: UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut texts = vec![String::new(); reply.n];
    let mut finish: Vec<Option<FinishReason>> = vec![None; reply.n];
    let mut completion_tokens = 0;
    let mut remaining = reply.n;
    while remaining > 0 {
        match rx.recv().await {
            Some(Event::Text { index, text }) => texts[index].push_str(&text),
            Some(Event::Done {
                index,
                finish: f,
                completion_tokens: c,
            }) => {
                finish[index] = Some(f);
                completion_tokens += c;
                remaining -= 1;
            }
            Some(Event::Failed { message, .. }) => return Err(server_error(message)),
            None => return Err(unavailable("the server is shutting down; the request was cancelled")),
        }
    }
    let choices = texts
        .iter()
        .zip(&finish)
        .enumerate()
        .map(|(i, (text, f))| choice_json(i, text, *f))
        .collect();
    let usage = Usage {
        prompt_tokens: reply.prompt_tokens,
        completion_tokens,
    };
    Ok(json_response(StatusCode::OK, &reply.object(choices, Some(usage))))
}

/// Where a stream is.
enum Phase {
    Events,
    Usage,
    Done,
    End,
}

struct StreamState {
    reply: Reply,
    rx: UnboundedReceiver<Event>,
    remaining: usize,
    completion_tokens: usize,
    include_usage: bool,
    phase: Phase,
}

fn sse(data: &str) -> Bytes {
    Bytes::from(format!("data: {data}\n\n"))
}

/// SSE in OpenAI's format: one `text_completion` chunk per piece of text, a
/// chunk with each choice's `finish_reason`, the usage chunk when asked,
/// then `data: [DONE]`. An error mid-stream is sent as an `error` object
/// (the status line has gone out already).
fn stream_response(reply: Reply, rx: UnboundedReceiver<Event>, include_usage: bool) -> Response {
    let state = StreamState {
        remaining: reply.n,
        reply,
        rx,
        completion_tokens: 0,
        include_usage,
        phase: Phase::Events,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        let bytes = match st.phase {
            Phase::Events => match st.rx.recv().await {
                Some(Event::Text { index, text }) => {
                    sse(&st.reply.object(vec![choice_json(index, &text, None)], None).to_string())
                }
                Some(Event::Done {
                    index,
                    finish,
                    completion_tokens,
                }) => {
                    st.completion_tokens += completion_tokens;
                    st.remaining -= 1;
                    if st.remaining == 0 {
                        st.phase = if st.include_usage { Phase::Usage } else { Phase::Done };
                    }
                    sse(&st
                        .reply
                        .object(vec![choice_json(index, "", Some(finish))], None)
                        .to_string())
                }
                Some(Event::Failed { message, .. }) => {
                    st.phase = Phase::Done;
                    sse(&server_error(message).body().to_string())
                }
                None => {
                    st.phase = Phase::End;
                    sse(&unavailable("the server is shutting down; the request was cancelled")
                        .body()
                        .to_string())
                }
            },
            Phase::Usage => {
                st.phase = Phase::Done;
                let usage = Usage {
                    prompt_tokens: st.reply.prompt_tokens,
                    completion_tokens: st.completion_tokens,
                };
                sse(&st.reply.object(Vec::new(), Some(usage)).to_string())
            }
            Phase::Done => {
                st.phase = Phase::End;
                sse("[DONE]")
            }
            Phase::End => return None,
        };
        Some((Ok::<Bytes, Infallible>(bytes), st))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}
