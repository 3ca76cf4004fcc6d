//! The `serve` binary end to end on the CPU: real HTTP over loopback against
//! a small random checkpoint of GPT-2's vocabulary. Every reply is checked
//! against the same generation through the library (or the CLI binary), so
//! a token lost, duplicated or sent to the wrong stream fails a test.
//!
//! The server prints its address as its first stdout line once it accepts
//! connections; tests wait for that line, and for conditions read from
//! `/metrics`, never for fixed times.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use host::cpu::CpuModel;
use host::generate::generate;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::write_llmc;
use host::model::{DType, ModelConfig};
use host::sample::{Sampler, SamplingParams};
use host::tokenizer::Gpt2Tokenizer;
use serde_json::{Value, json};

use crate::common::{Scratch, host_package_bin};

/// Small model with GPT-2's vocabulary, so the real tokenizer applies.
fn serve_config() -> ModelConfig {
    ModelConfig {
        max_seq_len: 64,
        vocab_size: 50257,
        padded_vocab_size: 50304,
        num_layers: 2,
        num_heads: 2,
        channels: 16,
    }
}

/// Bound on anything a test waits for (a reply, a condition, an exit).
const WAIT: Duration = Duration::from_secs(60);
/// Between two reads of `/metrics` while waiting for a condition.
const POLL: Duration = Duration::from_millis(20);

struct Fixture {
    _dir: Scratch,
    weights: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let dir = Scratch::new(&format!("serve-{name}"));
        let weights = dir.path().join("model.bin");
        write_llmc(&weights, &serve_config(), 42, DType::F32).unwrap();
        Fixture { _dir: dir, weights }
    }
}

/// A running server, killed on drop.
struct Server {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    url: String,
    agent: ureq::Agent,
}

impl Server {
    fn start(bin: &Path, fx: &Fixture, extra: &[&str]) -> Server {
        let mut child = Command::new(bin)
            .args(["--cpu", "--port", "0", "--weights"])
            .arg(&fx.weights)
            .args(extra)
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting serve");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the address line");
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "first line {line:?}");
        let agent = ureq::AgentBuilder::new().timeout(WAIT).build();
        Server {
            child,
            _stdout: stdout,
            url,
            agent,
        }
    }

    /// POST a JSON body (given as text, so malformed bodies can be sent):
    /// status, `Retry-After`, body.
    fn post_raw(&self, path: &str, body: &str) -> (u16, Option<String>, String) {
        let resp = match self
            .agent
            .post(&format!("{}{path}", self.url))
            .set("Content-Type", "application/json")
            .send_string(body)
        {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("POST {path}: {e}"),
        };
        let status = resp.status();
        let retry = resp.header("Retry-After").map(str::to_string);
        (status, retry, resp.into_string().expect("reading the reply"))
    }

    fn complete(&self, body: &Value) -> Value {
        let (status, _, text) = self.post_raw("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).expect("a JSON reply")
    }

    fn get(&self, path: &str) -> (u16, String) {
        match self.agent.get(&format!("{}{path}", self.url)).call() {
            Ok(r) | Err(ureq::Error::Status(_, r)) => (r.status(), r.into_string().expect("reading the reply")),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .parse()
            .expect("a number")
    }

    fn wait_for_metric(&self, name: &str, want: f64) {
        let start = Instant::now();
        while self.metric(name) != want {
            assert!(start.elapsed() < WAIT, "{name} never became {want}");
            std::thread::sleep(POLL);
        }
    }

    /// A streaming request, read to its end: the raw body.
    fn stream_raw(&self, body: &Value) -> String {
        let (status, _, text) = self.post_raw("/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{text}");
        text
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a stream says: text per choice, finish reasons, usage, and whether
/// it was framed right (every event `data: ...` + blank line, `[DONE]` last).
#[derive(Debug, Default)]
struct Streamed {
    texts: Vec<String>,
    finish: Vec<Option<String>>,
    usage: Option<Value>,
    chunks: usize,
}

fn parse_sse(raw: &str, n: usize) -> Streamed {
    let mut out = Streamed {
        texts: vec![String::new(); n],
        finish: vec![None; n],
        ..Streamed::default()
    };
    assert!(
        raw.ends_with("data: [DONE]\n\n"),
        "stream does not end with [DONE]: {raw:?}"
    );
    let events: Vec<&str> = raw.strip_suffix("\n\n").unwrap().split("\n\n").collect();
    let (done, chunks) = events.split_last().unwrap();
    assert_eq!(*done, "data: [DONE]");
    for ev in chunks {
        let data = ev
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not an SSE data event: {ev:?}"));
        assert!(!data.contains('\n'), "one line per event: {data:?}");
        let chunk: Value = serde_json::from_str(data).unwrap();
        assert_eq!(chunk["object"], "text_completion", "{chunk}");
        assert!(chunk["id"].as_str().unwrap().starts_with("cmpl-"));
        if let Some(u) = chunk.get("usage") {
            assert!(out.usage.is_none(), "two usage chunks");
            out.usage = Some(u.clone());
        }
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            assert!(out.finish[i].is_none(), "text after the finish chunk of choice {i}");
            out.texts[i].push_str(c["text"].as_str().unwrap());
            if let Some(f) = c["finish_reason"].as_str() {
                out.finish[i] = Some(f.to_string());
            }
        }
        out.chunks += 1;
    }
    out
}

/// The library's generation of `prompts` as one batch (one prompt: the
/// CLI's run), decoded: text and token count per prompt.
fn reference(fx: &Fixture, prompts: &[&str], n: usize, params: SamplingParams) -> Vec<(String, usize)> {
    let tok = Gpt2Tokenizer::default_files().unwrap();
    let ckpt = Checkpoint::open(&fx.weights).unwrap();
    let ids: Vec<Vec<u32>> = prompts.iter().map(|p| tok.encode(p).unwrap()).collect();
    let longest = ids.iter().map(Vec::len).max().unwrap();
    let mut model = CpuModel::new(&ckpt.weights().unwrap(), ids.len(), longest + n).unwrap();
    let mut s = Sampler::new(params).unwrap();
    let g = generate(&mut model, &ids, n, &mut s, |_, _| {}).unwrap();
    g.tokens.iter().map(|t| (tok.decode(t).unwrap(), t.len())).collect()
}

fn greedy(fx: &Fixture, prompt: &str, n: usize) -> (String, usize) {
    reference(fx, &[prompt], n, SamplingParams::GREEDY).remove(0)
}

fn finish_for(tokens: usize, max_tokens: usize) -> &'static str {
    if tokens == max_tokens { "length" } else { "stop" }
}

fn serve_bin() -> Option<&'static Path> {
    host_package_bin("serve")
}

#[test]
fn greedy_reply_equals_the_cli_run() {
    let Some(bin) = serve_bin() else { return };
    let Some(cli) = host_package_bin("host") else { return };
    let fx = Fixture::new("cli");
    let server = Server::start(bin, &fx, &[]);
    let prompt = "Hello world, this is";
    let n = 12;
    let reply = server.complete(&json!({"model": "gpt2", "prompt": prompt, "max_tokens": n, "temperature": 0}));
    let out = Command::new(cli)
        .args(["--cpu", "--temperature", "0", "-n", &n.to_string(), "--weights"])
        .arg(&fx.weights)
        .arg(prompt)
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert!(out.status.success());
    let cli_text = String::from_utf8(out.stdout).unwrap();
    let cli_completion = cli_text.strip_prefix(prompt).unwrap().strip_suffix('\n').unwrap();
    assert_eq!(reply["choices"][0]["text"], cli_completion, "{reply}");
    assert_eq!(reply["object"], "text_completion");
    assert_eq!(reply["model"], "gpt2");
    let (want, tokens) = greedy(&fx, prompt, n);
    assert_eq!(want, cli_completion);
    assert_eq!(reply["choices"][0]["finish_reason"], finish_for(tokens, n));
    assert_eq!(reply["choices"][0]["index"], 0);
    let prompt_tokens = Gpt2Tokenizer::default_files().unwrap().encode(prompt).unwrap().len();
    assert_eq!(reply["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(reply["usage"]["completion_tokens"], tokens);
    assert_eq!(reply["usage"]["total_tokens"], prompt_tokens + tokens);
}

#[test]
fn concurrent_clients_each_get_their_own_tokens() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("concurrent");
    // Fewer slots than clients: some wait in the queue, slots are reused;
    // a small prefill chunk splits the longer prompts.
    let server = Server::start(bin, &fx, &["--max-running", "4", "--prefill-chunk", "5"]);
    const CLIENTS: usize = 16;
    let words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "night"];
    let cases: Vec<(String, usize, bool)> = (0..CLIENTS)
        .map(|i| {
            let prompt = (0..=i % 7)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ");
            (format!("{prompt} {i}"), 3 + (i * 5) % 17, i % 2 == 0)
        })
        .collect();
    let replies: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = cases
            .iter()
            .map(|(prompt, n, stream)| {
                let server = &server;
                s.spawn(move || {
                    let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": stream});
                    if *stream {
                        let st = parse_sse(&server.stream_raw(&body), 1);
                        (st.texts[0].clone(), st.finish[0].clone().unwrap())
                    } else {
                        let r = server.complete(&body);
                        let c = &r["choices"][0];
                        (
                            c["text"].as_str().unwrap().to_string(),
                            c["finish_reason"].as_str().unwrap().to_string(),
                        )
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((prompt, n, _), (text, finish)) in cases.iter().zip(&replies) {
        let (want, tokens) = greedy(&fx, prompt, *n);
        assert_eq!(text, &want, "prompt {prompt:?}");
        assert_eq!(finish, finish_for(tokens, *n), "prompt {prompt:?}");
    }
    server.wait_for_metric("gpt2_kv_slots_in_use", 0.0);
    assert_eq!(server.metric("gpt2_queue_depth"), 0.0);
    assert_eq!(server.metric("gpt2_requests_total"), CLIENTS as f64);
}

#[test]
fn seeded_sampling_matches_the_library_and_repeats() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("seeded");
    let server = Server::start(bin, &fx, &[]);
    let prompts = ["Once upon a time", "The weather today"];
    let n = 10;
    let body = json!({"prompt": prompts, "max_tokens": n, "temperature": 0.9, "top_k": 50, "top_p": 0.9, "seed": 1234});
    let first = server.complete(&body);
    let again = server.complete(&body);
    assert_eq!(first["choices"], again["choices"], "same seed, same text");
    // A list of prompts samples as the CLI's batch of the same prompts.
    let params = SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.9,
        seed: Some(1234),
    };
    let want = reference(&fx, &prompts, n, params);
    let mut total = 0;
    for (i, (text, tokens)) in want.iter().enumerate() {
        let c = &first["choices"][i];
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], text.as_str(), "choice {i}");
        total += tokens;
    }
    assert_eq!(first["usage"]["completion_tokens"], total);
    // Streamed, the same request gives the same text.
    let mut body = body.clone();
    body["stream"] = json!(true);
    let st = parse_sse(&server.stream_raw(&body), prompts.len());
    for (i, (text, _)) in want.iter().enumerate() {
        assert_eq!(&st.texts[i], text);
    }
    // A different seed gives some other text (a random model's distribution
    // is nearly flat at temperature 0.9).
    body["seed"] = json!(99);
    body["stream"] = json!(false);
    let other = server.complete(&body);
    assert_ne!(other["choices"], first["choices"]);
}

#[test]
fn stream_framing_and_usage() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("sse");
    let server = Server::start(bin, &fx, &[]);
    let n = 9;
    let body = json!({"prompt": "Streaming test", "max_tokens": n, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true}});
    let st = parse_sse(&server.stream_raw(&body), 1);
    let (want, tokens) = greedy(&fx, "Streaming test", n);
    assert_eq!(st.texts[0], want);
    assert_eq!(st.finish[0].as_deref(), Some(finish_for(tokens, n)));
    let usage = st.usage.expect("a usage chunk");
    assert_eq!(usage["completion_tokens"], tokens);
    // One chunk per text piece at most, plus the finish and usage chunks.
    assert!(st.chunks <= tokens + 2, "{} chunks for {tokens} tokens", st.chunks);
}

#[test]
fn stop_strings_cut_the_text() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("stop");
    let server = Server::start(bin, &fx, &[]);
    let prompt = "A list of things:";
    let n = 24;
    let (full, _) = greedy(&fx, prompt, n);
    // A stop string from the middle of the text, spanning tokens likely.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "reference too short: {full:?}");
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    for stream in [false, true] {
        let body = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "stop": [stop, "\u{0}never"], "stream": stream});
        let (text, finish) = if stream {
            let st = parse_sse(&server.stream_raw(&body), 1);
            (st.texts[0].clone(), st.finish[0].clone().unwrap())
        } else {
            let r = server.complete(&body);
            let c = &r["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(text, cut, "stop {stop:?} in {full:?} (stream: {stream})");
        assert_eq!(finish, "stop");
    }
}

#[test]
fn bad_requests_get_openai_errors() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("bad");
    let server = Server::start(bin, &fx, &["--max-seq-len", "32"]);
    let long_prompt = "word ".repeat(40);
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{not json".into(), 400, None),
        ("[1, 2]".into(), 400, None),
        (json!({"prompt": "x", "bogus": 1}).to_string(), 400, None),
        (json!({"prompt": 5}).to_string(), 400, Some("prompt")),
        (json!({"prompt": [1, 2]}).to_string(), 400, Some("prompt")),
        (json!({"max_tokens": 3}).to_string(), 400, Some("prompt")),
        (json!({"prompt": ""}).to_string(), 400, Some("prompt")),
        (json!({"prompt": []}).to_string(), 400, Some("prompt")),
        (
            json!({"prompt": "x", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"prompt": "x", "max_tokens": -3}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": "x", "max_tokens": "ten"}).to_string(), 400, None),
        (
            json!({"prompt": "x", "max_tokens": 40}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (json!({"prompt": long_prompt}).to_string(), 400, Some("prompt")),
        (
            json!({"prompt": "x", "temperature": 2.5}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            json!({"prompt": "x", "temperature": -0.1}).to_string(),
            400,
            Some("temperature"),
        ),
        (json!({"prompt": "x", "top_p": 0}).to_string(), 400, Some("top_p")),
        (json!({"prompt": "x", "top_p": 1.5}).to_string(), 400, Some("top_p")),
        (json!({"prompt": "x", "top_k": -1}).to_string(), 400, Some("top_k")),
        (json!({"prompt": "x", "n": 2}).to_string(), 400, Some("n")),
        (
            json!({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).to_string(),
            400,
            Some("stop"),
        ),
        (json!({"prompt": "x", "stop": 3}).to_string(), 400, Some("stop")),
        (json!({"prompt": "x", "stream": "yes"}).to_string(), 400, None),
        (json!({"prompt": "x", "seed": -1}).to_string(), 400, None),
    ];
    for (body, status, param) in &cases {
        let (got, _, text) = server.post_raw("/v1/completions", body);
        assert_eq!(got, *status, "{body} -> {text}");
        let err: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{body} -> not JSON: {text}"));
        let e = &err["error"];
        assert_eq!(e["type"], "invalid_request_error", "{body} -> {text}");
        assert!(!e["message"].as_str().unwrap().is_empty());
        assert!(e.get("code").is_some() && e.get("param").is_some(), "{text}");
        if let Some(p) = param {
            assert_eq!(e["param"], *p, "{body} -> {text}");
        }
    }
    let (status, text) = server.get("/v1/nowhere");
    assert_eq!(status, 404);
    let err: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(err["error"]["code"], "not_found");
    // Bad requests disturbed nothing: a good one still works.
    let r = server.complete(&json!({"prompt": "Still fine", "max_tokens": 4, "temperature": 0}));
    assert_eq!(r["choices"][0]["text"], greedy(&fx, "Still fine", 4).0);
    // The other routes.
    let (status, text) = server.get("/health");
    assert_eq!((status, text.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, text) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], "gpt2");
    assert_eq!(server.metric("gpt2_kv_slots_total"), 16.0);
}

/// Starts a streaming request with many tokens to come, reads its first
/// chunk (so it holds a slot) and returns the open reader.
fn hold_a_slot(server: &Server, max_tokens: usize) -> BufReader<Box<dyn Read + Send + Sync>> {
    let body = json!({"prompt": "Hold the slot", "max_tokens": max_tokens, "temperature": 0, "stream": true});
    let resp = server
        .agent
        .post(&format!("{}/v1/completions", server.url))
        .send_json(body)
        .expect("the holding request");
    let mut reader = BufReader::new(resp.into_reader());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("data: {"), "{line:?}");
    reader
}

#[test]
fn full_queue_gets_429_and_disconnect_frees_the_slot() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("queue");
    // One slot, one queue place; each step sleeps so the holder lasts
    // (50 tokens x 200 ms) far longer than the test needs it.
    let server = Server::start(
        bin,
        &fx,
        &["--max-running", "1", "--max-queue", "1", "--step-delay-ms", "200"],
    );
    let holder = hold_a_slot(&server, 50);
    assert_eq!(server.metric("gpt2_kv_slots_in_use"), 1.0);
    std::thread::scope(|s| {
        let waiting = s.spawn(|| server.complete(&json!({"prompt": "Queued", "max_tokens": 3, "temperature": 0})));
        server.wait_for_metric("gpt2_queue_depth", 1.0);
        let (status, retry, text) = server.post_raw("/v1/completions", &json!({"prompt": "Too many"}).to_string());
        assert_eq!(status, 429, "{text}");
        assert_eq!(retry.as_deref(), Some("1"));
        let err: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(err["error"]["code"], "queue_full");
        assert_eq!(server.metric("gpt2_requests_rejected_total"), 1.0);
        // The holder's client goes away: its slot is freed at once and the
        // queued request runs to its end.
        drop(holder);
        let r = waiting.join().unwrap();
        assert_eq!(r["choices"][0]["text"], greedy(&fx, "Queued", 3).0);
    });
    server.wait_for_metric("gpt2_kv_slots_in_use", 0.0);
    // The holder was cut short: far fewer than its 50 tokens were made.
    let generated = server.metric("gpt2_generated_tokens_total");
    assert!(generated < 40.0, "{generated} tokens generated");
}

#[test]
fn non_streaming_client_that_disconnects_frees_its_slot() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("hangup");
    let server = Server::start(bin, &fx, &["--step-delay-ms", "200"]);
    let addr = server.url.strip_prefix("http://").unwrap();
    let body = json!({"prompt": "Hang up", "max_tokens": 50, "temperature": 0}).to_string();
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    server.wait_for_metric("gpt2_kv_slots_in_use", 1.0);
    drop(conn);
    // 50 tokens x 200 ms would hold the slot for 10 s; the hang-up frees
    // it long before.
    server.wait_for_metric("gpt2_kv_slots_in_use", 0.0);
    let generated = server.metric("gpt2_generated_tokens_total");
    assert!(generated < 40.0, "{generated} tokens generated");
}

fn kill_term(pid: u32) {
    let status = Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
    assert!(status.success());
}

fn wait_exit(server: &mut Server) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < WAIT, "the server did not exit");
        std::thread::sleep(POLL);
    }
}

#[test]
fn sigterm_finishes_in_flight_streams_and_exits_0() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("sigterm");
    let mut server = Server::start(bin, &fx, &["--step-delay-ms", "20"]);
    let n = 20;
    let mut holder = hold_a_slot(&server, n);
    kill_term(server.pid());
    // The stream in flight runs to its end.
    let mut rest = String::new();
    holder.read_to_string(&mut rest).unwrap();
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest:?}");
    assert!(rest.contains(r#""finish_reason":"length""#) || rest.contains(r#""finish_reason":"stop""#));
    assert!(wait_exit(&mut server).success());
}

#[test]
fn sigterm_grace_period_cancels_and_exits_0() {
    let Some(bin) = serve_bin() else { return };
    let fx = Fixture::new("grace");
    let mut server = Server::start(bin, &fx, &["--step-delay-ms", "200", "--shutdown-grace", "1"]);
    let mut holder = hold_a_slot(&server, 60);
    kill_term(server.pid());
    // 60 tokens x 200 ms outlast the 1 s grace: the stream is cancelled
    // with an error event, and the server exits 0.
    let mut rest = String::new();
    let _ = holder.read_to_string(&mut rest);
    assert!(rest.contains("shutting down"), "{rest:?}");
    assert!(wait_exit(&mut server).success());
}

#[test]
fn load_tool_reports_json() {
    let Some(bin) = serve_bin() else { return };
    let Some(load) = host_package_bin("serve_load") else {
        return;
    };
    let fx = Fixture::new("load");
    let server = Server::start(bin, &fx, &["--max-running", "4"]);
    let out = Command::new(load)
        .args([
            "--url",
            &server.url,
            "--clients",
            "3",
            "--requests",
            "6",
            "--max-tokens",
            "5",
        ])
        .args(["--duration", "60", "--request-timeout", "60"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["completed"], 6, "{report}");
    assert_eq!(report["failed"], 0);
    let tokens = report["completion_tokens"].as_u64().unwrap();
    assert!(tokens > 0 && tokens <= 30, "{report}");
    assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(report["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    assert!(report["ttft_ms"]["p99"].as_f64().unwrap() >= report["ttft_ms"]["p50"].as_f64().unwrap());
    assert_eq!(server.metric("gpt2_generated_tokens_total"), tokens as f64);
    // Anything but loopback is refused.
    let out = Command::new(load)
        .args(["--url", "http://192.0.2.1:80"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
}

/// The GPU server refuses what it cannot serve with a clear message, exit
/// code 1 and nothing on stdout: on a machine without a GPU (CI), for want
/// of one; on the GPU machine, a model whose heads are not GPT-2's 64
/// channels (the decode attention kernel's size). The serving itself on the
/// GPU: tests/gpu/serve.rs and the GPU runner's real-client test.
#[test]
fn gpu_path_refuses_clearly() {
    let Some(bin) = serve_bin() else { return };
    let dir = Scratch::new("serve-gpu-refuses");
    let weights = dir.path().join("heads16.bin");
    // Four heads of 16 channels.
    let cfg = host::model::fixtures::tiny_config();
    write_llmc(&weights, &cfg, 3, DType::F32).unwrap();
    let out = Command::new(bin)
        .args(["--port", "0", "--weights"])
        .arg(&weights)
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("use --cpu") && (err.contains("CUDA") || err.contains("heads of 64 channels")),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

/// The CPU model's [`SlotBackend`] against its one-row `Backend::forward`:
/// two sequences in slots 2 and 0 of one cache (one prefilled in two
/// chunks), decoded together at different positions, choose exactly what
/// each sequence chooses alone, greedy and sampled. This is the oracle a
/// GPU implementation of the trait can be held to.
#[test]
fn cpu_slots_choose_as_one_row_forward() {
    use host::cpu::sample::sample_row;
    use host::generate::{Backend, LogitsWanted};
    use host::model::fixtures::tiny_config;
    use host::serve::backend::{Draw, SlotBackend, SlotChunk, SlotToken};

    let dir = Scratch::new("slots");
    let path = dir.path().join("tiny.bin");
    let cfg = tiny_config();
    write_llmc(&path, &cfg, 5, DType::F32).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let weights = ckpt.weights().unwrap();
    let max_seq_len = 40;
    let mut slots = CpuModel::new(&weights, 3, max_seq_len).unwrap();
    let prompts: [Vec<u32>; 2] = [
        (0..7).map(|i| 3 + 11 * i).collect(),
        (0..12).map(|i| 290 - 7 * i).collect(),
    ];
    let slot_of = [2usize, 0];
    let sampled = Sampler::new(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: Some(5),
    })
    .unwrap()
    .row();
    let greedy_row = Sampler::new(SamplingParams::GREEDY).unwrap().row();
    // Sequence 0 samples, sequence 1 is greedy; stream = sequence index.
    let settings = [sampled, greedy_row];
    let draw = |seq: usize, pos: usize| Draw {
        settings: settings[seq],
        counter: pos as u32,
        stream: seq as u32,
    };

    // The oracle: each sequence alone, one row, through Backend::forward.
    let mut alone: Vec<Vec<u32>> = Vec::new();
    for (seq, prompt) in prompts.iter().enumerate() {
        let mut m = CpuModel::new(&weights, 1, max_seq_len).unwrap();
        m.forward(prompt, 1, prompt.len(), 0, LogitsWanted::Last).unwrap();
        let mut out = Vec::new();
        for pos in prompt.len()..prompt.len() + 6 {
            let logits = m.logits().unwrap();
            let id = sample_row(&logits[..cfg.vocab_size], &settings[seq], pos as u32, seq as u32);
            out.push(id);
            m.forward(&[id], 1, 1, pos, LogitsWanted::Last).unwrap();
        }
        alone.push(out);
    }

    // The slots: sequence 0 prefilled in two chunks, the second in one call
    // with sequence 1's whole prompt (one row each comes back).
    let mut chosen: Vec<Vec<u32>> = vec![Vec::new(); 2];
    slots.prefill(slot_of[0], &prompts[0][..3], 0).unwrap();
    let chunks = [
        SlotChunk {
            slot: slot_of[0],
            tokens: &prompts[0][3..],
            pos0: 3,
        },
        SlotChunk {
            slot: slot_of[1],
            tokens: &prompts[1],
            pos0: 0,
        },
    ];
    slots.prefill_chunks(&chunks).unwrap();
    let ids = slots.choose(&[draw(0, 7), draw(1, 12)]).unwrap();
    chosen[0].push(ids[0]);
    chosen[1].push(ids[1]);
    for _ in 0..5 {
        // Rows in the opposite order of the slots, at different positions.
        let rows: Vec<SlotToken> = (0..2)
            .rev()
            .map(|seq| SlotToken {
                slot: slot_of[seq],
                token: *chosen[seq].last().unwrap(),
                pos: prompts[seq].len() + chosen[seq].len() - 1,
            })
            .collect();
        slots.decode(&rows).unwrap();
        let draws: Vec<Draw> = (0..2)
            .rev()
            .map(|seq| draw(seq, prompts[seq].len() + chosen[seq].len()))
            .collect();
        let ids = slots.choose(&draws).unwrap();
        chosen[1].push(ids[0]);
        chosen[0].push(ids[1]);
    }
    assert_eq!(chosen, alone);

    // Misuse is an error, not a panic.
    assert!(slots.prefill(3, &[1], 0).is_err(), "slot beyond the cache");
    assert!(slots.prefill(0, &[1], max_seq_len).is_err(), "position beyond the slot");
    assert!(slots.prefill(0, &[], 0).is_err(), "an empty chunk");
    assert!(slots.prefill_chunks(&[]).is_err(), "no chunk");
    let one = SlotChunk {
        slot: 1,
        tokens: &[1, 2],
        pos0: 0,
    };
    assert!(
        slots.prefill_chunks(&[one, one]).is_err(),
        "a slot twice in one prefill"
    );
    let bad = SlotChunk { tokens: &[300], ..one };
    assert!(slots.prefill_chunks(&[one, bad]).is_err(), "id beyond the vocabulary");
    let dup = SlotToken {
        slot: 0,
        token: 1,
        pos: 0,
    };
    assert!(slots.decode(&[dup, dup]).is_err(), "a slot twice in one step");
    assert!(
        slots.decode(&[SlotToken { token: 300, ..dup }]).is_err(),
        "id beyond the vocabulary"
    );
    assert!(slots.choose(&[draw(0, 1), draw(1, 1)]).is_err(), "more draws than rows");
}
