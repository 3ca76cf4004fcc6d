//! The `host` binary end to end on the CPU with a small random checkpoint of
//! GPT-2's vocabulary: streaming output, exit codes and error messages.
//!
//! The binary is (re)built by `cargo build --profile test -p host --bins`
//! into this test's own target directory (so it is never stale); without
//! cargo (a bundle copied to another machine) the bundle's `bin/host` (the
//! layout of `scripts/gpu-bundle.sh`: `gpu-out/tests/cpu`, `gpu-out/bin/host`)
//! or a `host` in the test's profile directory is used. The tests skip when
//! there is none (each printing `SKIPPED: ...` through `crate::skip`), and
//! fail instead under `GPT2_REQUIRE_GPU=1` (the GPU runner, whose bundle must
//! have it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use host::cpu::CpuModel;
use host::generate::generate;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::write_llmc;
use host::model::{DType, ModelConfig};
use host::sample::{Sampler, SamplingParams};
use host::tokenizer::Gpt2Tokenizer;

use crate::common::Scratch;

/// Small model with GPT-2's vocabulary, so the real tokenizer applies.
fn cli_config() -> ModelConfig {
    ModelConfig {
        max_seq_len: 32,
        vocab_size: 50257,
        padded_vocab_size: 50304,
        num_layers: 1,
        num_heads: 2,
        channels: 16,
    }
}

/// The `host` binary (see `crate::common::host_package_bin`).
fn host_bin() -> Option<&'static Path> {
    crate::common::host_package_bin("host")
}

/// A fixture checkpoint in a fresh temp dir (kept for the test's life).
struct Fixture {
    dir: Scratch,
    weights: PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let dir = Scratch::new(&format!("cli-{name}"));
        let weights = dir.path().join("model.bin");
        write_llmc(&weights, &cli_config(), 42, DType::F32).unwrap();
        Fixture { dir, weights }
    }
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .output()
        .expect("running host")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn greedy_cpu_run_streams_the_same_text_as_the_library() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("greedy");
    let prompt = "Hello world, this is";
    let n = 10;
    let out = run(
        bin,
        &[
            "--cpu",
            "--weights",
            fx.weights.to_str().unwrap(),
            "--temperature",
            "0",
            "-n",
            "10",
            prompt,
        ],
    );
    assert!(out.status.success(), "exit {:?}: {}", out.status, stderr(&out));

    // The same generation through the library.
    let tok = Gpt2Tokenizer::default_files().unwrap();
    let ckpt = Checkpoint::open(&fx.weights).unwrap();
    let ids = tok.encode(prompt).unwrap();
    let mut model = CpuModel::new(&ckpt.weights().unwrap(), 1, ids.len() + n).unwrap();
    let mut s = Sampler::new(SamplingParams::GREEDY).unwrap();
    let g = generate(&mut model, &[ids], n, &mut s, |_, _| {}).unwrap();
    let want = format!("{prompt}{}\n", tok.decode(&g.tokens[0]).unwrap());
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{} tokens generated (", g.generated)) && err.contains("tokens/s)"),
        "{err}"
    );
}

#[test]
fn seed_is_printed_and_repeats_the_run() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("seed");
    let w = fx.weights.to_str().unwrap();
    let first = run(
        bin,
        &["--cpu", "--weights", w, "-n", "8", "--temperature", "1.5", "Once upon"],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    let err = stderr(&first);
    let seed = err
        .split_whitespace()
        .skip_while(|w| *w != "--seed")
        .nth(1)
        .unwrap_or_else(|| panic!("no seed printed: {err}"))
        .trim_end_matches(|c: char| !c.is_ascii_digit());
    let again = run(
        bin,
        &[
            "--cpu",
            "--weights",
            w,
            "-n",
            "8",
            "--temperature",
            "1.5",
            "--seed",
            seed,
            "Once upon",
        ],
    );
    assert_eq!(first.stdout, again.stdout, "same seed, same text");
}

#[test]
fn batch_of_prompts_prints_each_continuation() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("batch");
    let out = run(
        bin,
        &[
            "--cpu",
            "--weights",
            fx.weights.to_str().unwrap(),
            "-n",
            "4",
            "--seed",
            "1",
            "One",
            "Two three",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("--- prompt 1 ---\nOne") && text.contains("--- prompt 2 ---\nTwo three"),
        "{text}"
    );
}

#[test]
fn context_window_stops_with_a_message_not_an_error() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("window");
    let w = fx.weights.to_str().unwrap();
    let prompt = "one two three four five six seven eight nine ten eleven twelve"; // 12 tokens
    let out = run(
        bin,
        &["--cpu", "--weights", w, "-n", "100", "--temperature", "0", prompt],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("context window of 32"), "{err}");
    assert!(err.contains("20 tokens generated"), "{err}");
}

#[test]
fn bad_inputs_fail_with_clear_messages() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("errors");
    let w = fx.weights.to_str().unwrap();
    let garbage = fx.dir.path().join("garbage.bin");
    std::fs::write(&garbage, b"definitely not a checkpoint").unwrap();
    let long_prompt = "word ".repeat(40).trim_end().to_string(); // 40 tokens > 32 positions
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (vec!["--cpu", "--weights", w, ""], 1, "empty"),
        (vec!["--cpu", "--weights", w], 1, "no prompt"),
        (vec!["--cpu", "--weights", w, "-n", "0", "hi"], 1, "at least 1"),
        (vec!["--cpu", "--weights", w, "-n", "-3", "hi"], 2, "-3"),
        (vec!["--cpu", "--weights", w, "--bogus", "hi"], 2, "--bogus"),
        (
            vec!["--cpu", "--weights", w, "--temperature", "-1", "hi"],
            1,
            "temperature",
        ),
        (vec!["--cpu", "--weights", w, "--top-p", "0", "hi"], 1, "top-p"),
        (vec!["--cpu", "--weights", w, "--precision", "fp8", "hi"], 2, "fp8"),
        (
            vec!["--cpu", "--weights", "/definitely/missing.bin", "hi"],
            1,
            "does not exist",
        ),
        (
            vec!["--cpu", "--weights", garbage.to_str().unwrap(), "hi"],
            1,
            "garbage.bin",
        ),
        (vec!["--cpu", "--weights", w, long_prompt.as_str()], 1, "40 tokens"),
        (
            vec!["--cpu", "--weights", w, "--prompt-file", "/definitely/missing.txt"],
            1,
            "missing.txt",
        ),
    ];
    for (args, code, needle) in cases {
        let out = run(bin, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: stderr lacks {needle:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
    // The long prompt's message names both numbers.
    let err = stderr(&run(bin, &["--cpu", "--weights", w, long_prompt.as_str()]));
    assert!(err.contains("32"), "{err}");
}

/// Without `--cpu` the program runs on the GPU or fails; it never falls back
/// to the CPU silently. Where this process finds no usable GPU, the default
/// device must fail with a message that points at `--cpu`; where it finds one,
/// the run must succeed. On every machine a device that does not exist must
/// fail, which a silent CPU fallback would not.
#[test]
fn without_cpu_flag_a_missing_gpu_is_a_clear_error() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("gpu");
    let w = fx.weights.to_str().unwrap();
    let no_gpu_here = host::gpu::Gpu::new(0).err();

    let out = run(bin, &["--weights", w, "-n", "2", "hi"]);
    let err = stderr(&out);
    match &no_gpu_here {
        Some(why) => {
            eprintln!("no usable GPU here ({why}): the CLI must fail");
            assert_eq!(
                out.status.code(),
                Some(1),
                "succeeded without a GPU (a CPU fallback?): {err}"
            );
            assert!(err.contains("--cpu") && !err.contains("panicked"), "{err}");
            assert!(out.stdout.is_empty(), "generated text without a GPU");
        }
        None => assert!(out.status.success(), "a usable GPU, but the CLI failed: {err}"),
    }

    // No machine has GPU number 4096: running on it must fail, cleanly.
    let out = run(bin, &["--device", "4096", "--weights", w, "-n", "2", "hi"]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "--device 4096 did not fail (a CPU fallback?): {err}"
    );
    assert!(!err.contains("panicked") && out.stdout.is_empty(), "{err}");
    if no_gpu_here.is_none() {
        assert!(err.contains("4096"), "{err}");
    } else {
        assert!(err.contains("--cpu"), "{err}");
    }
}

/// `--attention-window W` gives the library's sliding-window generation.
#[test]
fn attention_window_flag_matches_the_library() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("window");
    let (prompt, n) = ("Hello world, this is a longer prompt", 12);
    let tok = Gpt2Tokenizer::default_files().unwrap();
    let ckpt = Checkpoint::open(&fx.weights).unwrap();
    let ids = tok.encode(prompt).unwrap();
    let greedy = |window: usize| {
        let mut model = CpuModel::new(&ckpt.weights().unwrap(), 1, ids.len() + n).unwrap();
        model.set_attention_window(window);
        let mut s = Sampler::new(SamplingParams::GREEDY).unwrap();
        generate(&mut model, std::slice::from_ref(&ids), n, &mut s, |_, _| {})
            .unwrap()
            .tokens[0]
            .clone()
    };
    // A window whose greedy text differs from full attention's, so a CLI
    // that ignored the flag would print the wrong text (a random model's
    // greedy text can be the same for some windows: search the first few).
    let full = greedy(0);
    let (window, g) = (1..=8)
        .map(|w| (w, greedy(w)))
        .find(|(_, g)| *g != full)
        .expect("no attention window of 1 to 8 changes this fixture's greedy text");
    let w = window.to_string();
    let args = [
        "--cpu",
        "--weights",
        fx.weights.to_str().unwrap(),
        "--temperature",
        "0",
        "-n",
        "12",
    ];
    let out = run(bin, &[&args[..], &["--attention-window", &w, prompt]].concat());
    assert!(out.status.success(), "exit {:?}: {}", out.status, stderr(&out));
    let want = format!("{prompt}{}\n", tok.decode(&g).unwrap());
    assert_eq!(String::from_utf8_lossy(&out.stdout), want, "window {window}");
}

/// The programs carry their tokenizer: from a directory with no
/// `weights/gpt2` and without `GPT2_TOKENIZER_DIR`, the CLI still runs.
#[test]
fn runs_from_any_directory() {
    let Some(bin) = host_bin() else { return };
    let fx = Fixture::new("anywhere");
    let out = Command::new(bin)
        .current_dir(fx.dir.path())
        .env_remove("GPT2_TOKENIZER_DIR")
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .args([
            "--cpu",
            "--weights",
            "model.bin",
            "--temperature",
            "0",
            "-n",
            "4",
            "Hello",
        ])
        .output()
        .expect("running host");
    assert!(out.status.success(), "exit {:?}: {}", out.status, stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Hello"));
}
