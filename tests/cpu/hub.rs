//! `host::hub` against a local stand-in for the Hugging Face Hub: a tiny
//! loopback HTTP server answering the range requests hf-hub 0.4 makes.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;

use host::hub::{DEFAULT_FILE, DEFAULT_REPO, HubOptions, LOCAL_WEIGHTS, fetch};
use rand::Rng;

/// Most connections the stand-in serves before it stops (bounded test).
const MAX_CONNECTIONS: usize = 8;
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Serves `payload` at `/<repo>/resolve/main/<file>`; returns the endpoint.
fn serve(payload: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let path = format!("/{DEFAULT_REPO}/resolve/main/{DEFAULT_FILE}");
    std::thread::spawn(move || {
        for stream in listener.incoming().take(MAX_CONNECTIONS) {
            let Ok(mut stream) = stream else { continue };
            stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    range = Some(v.trim().to_string());
                }
            }
            let target = request_line.split_whitespace().nth(1).unwrap_or("");
            if target != path {
                let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                continue;
            }
            let len = payload.len();
            let (start, end) = match range.as_deref().and_then(|r| r.split_once('-')) {
                Some((s, e)) => (s.parse().unwrap_or(0), e.parse().unwrap_or(len - 1)),
                None => (0, len - 1),
            };
            let body = &payload[start..=end.min(len - 1)];
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {start}-{}/{len}\r\n\
                 ETag: \"test-etag\"\r\nX-Repo-Commit: {COMMIT}\r\nConnection: close\r\n\r\n",
                body.len(),
                start + body.len() - 1
            );
            let _ = stream.write_all(head.as_bytes()).and_then(|_| stream.write_all(body));
        }
    });
    endpoint
}

fn temp_cache(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpt2-hub-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn downloads_into_the_cache_then_reuses_it() {
    let mut rng = crate::seed::rng();
    let payload: Vec<u8> = (0..rng.random_range(1000..50_000)).map(|_| rng.random()).collect();
    let cache_dir = temp_cache("ok");
    let opts = HubOptions {
        endpoint: serve(payload.clone()),
        cache_dir: cache_dir.clone(),
        progress: false,
    };
    let path = fetch(DEFAULT_REPO, DEFAULT_FILE, &opts).unwrap();
    assert!(path.starts_with(&cache_dir), "{} outside the cache", path.display());
    assert_eq!(std::fs::read(&path).unwrap(), payload);
    // Second time: from the cache, even with the hub gone.
    let offline = HubOptions {
        endpoint: "http://127.0.0.1:9".into(),
        ..opts
    };
    assert_eq!(fetch(DEFAULT_REPO, DEFAULT_FILE, &offline).unwrap(), path);
    let _ = std::fs::remove_dir_all(&cache_dir);
}

#[test]
fn no_network_explains_how_to_get_the_file() {
    let cache_dir = temp_cache("offline");
    let opts = HubOptions {
        endpoint: "http://127.0.0.1:9".into(),
        cache_dir: cache_dir.clone(),
        progress: false,
    };
    let e = format!("{:#}", fetch(DEFAULT_REPO, DEFAULT_FILE, &opts).unwrap_err());
    assert!(e.contains(LOCAL_WEIGHTS) && e.contains("--weights"), "{e}");
    assert!(
        e.contains("https://huggingface.co/openai-community/gpt2/resolve/main/model.safetensors"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&cache_dir);
}
