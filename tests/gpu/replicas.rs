//! Data-parallel replicas (`gpu::replicas::Replicas`) against one engine.
//! Two replicas on GPU 0 (so these run on a one-GPU machine): each
//! replica's rows equal one engine run on the same sub-batch bit for bit
//! (same kernels, same row counts), greedy and sampled generation
//! included; against one engine running the whole batch (other row counts
//! pick other kernels) the logits agree within FP32 rounding, sampled
//! tokens are equal and greedy ones too except at a near tie; perplexity
//! agrees; uneven splits (3 rows over 2, 1 row over 2); misuse and a
//! panicking worker are errors. Batch generation (`generate_batch`, the
//! whole loop on each replica's rows, prompts of different lengths) equals
//! one engine per sub-batch bit for bit and one engine on the whole batch
//! as above, streams each token once with its row, and with one replica is
//! the engine's own. The sampling stream offset the replicas
//! rely on is checked against the CPU sampler. One test needs two
//! different GPUs: it skips visibly on one, and fails there instead when
//! `GPT2_REQUIRE_MULTI_GPU=1`.

use std::ops::Range;

use host::cpu::sample::sample_row;
use host::generate::{Backend, LogitsWanted, StopReason, generate};
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision};
use host::gpu::replicas::{Replicas, split_rows};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::llmc_bytes;
use host::model::{DType, Weights};
use host::perplexity::{PerplexityConfig, perplexity_with};
use host::sample::{Sampler, SamplingParams};
use rand::Rng;

use crate::decode::head64_config;
use crate::kernels::{check, skip};

/// A replica against one engine running the whole batch, FP32: the row
/// count picks the kernels (GEMV or tensor-core matmul, split-K or not),
/// so the sums run in other orders; the decode tests' bar between paths.
const FULL_BATCH_TOL: f32 = 1e-4;
/// A greedy choice of one engine may differ from the replicas' only where
/// its two best logits are closer than this (twice the logits' tolerance).
const TIE_GAP: f32 = 2.0 * FULL_BATCH_TOL;
/// Relative agreement of the total NLL with one engine's (logits within
/// `FULL_BATCH_TOL`, summed over a few thousand tokens in f64).
const PPL_REL_TOL: f64 = 1e-5;
/// Prompt tokens per row.
const PROMPT_LEN: usize = 7;
/// Tokens generated per row.
const STEPS: usize = 12;
/// Two replicas on GPU 0.
const SAME_GPU: [usize; 2] = [0, 0];

fn checkpoint(seed: u64) -> Checkpoint {
    let cfg = head64_config();
    let bytes = llmc_bytes(&cfg, seed, DType::F32).unwrap();
    Checkpoint::from_bytes(bytes, "random.bin", Some(cfg.num_heads)).unwrap()
}

/// A random checkpoint of the decode tests' model, its seed printed.
fn random_checkpoint(what: &str) -> Checkpoint {
    let seed: u64 = crate::seed::rng().random();
    eprintln!("{what}: checkpoint seed {seed}");
    checkpoint(seed)
}

fn engine(device: usize, w: &Weights, b: usize, max_t: usize) -> GpuEngine {
    GpuEngine::new(Gpu::new(device).unwrap(), w, b, max_t, Precision::Fp32).unwrap()
}

/// Positions a generation of [`STEPS`] tokens after [`PROMPT_LEN`] needs.
const MAX_T: usize = PROMPT_LEN + STEPS + 1;

fn greedy() -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: Some(0),
    })
    .unwrap()
}

fn sampled(seed: u64) -> Sampler {
    Sampler::new(SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: Some(seed),
    })
    .unwrap()
}

fn random_prompts(b: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = crate::seed::rng();
    (0..b)
        .map(|_| (0..PROMPT_LEN).map(|_| rng.random_range(0..vocab as u32)).collect())
        .collect()
}

/// [`STEPS`] tokens per row (the random model's vocabulary has no
/// `<|endoftext|>`, so every row runs to the end).
fn generated(backend: &mut dyn Backend, prompts: &[Vec<u32>], mut sampler: Sampler) -> Vec<Vec<u32>> {
    let g = generate(backend, prompts, STEPS, &mut sampler, |_, _| {}).unwrap();
    assert!(
        g.tokens.iter().all(|t| t.len() == STEPS),
        "a row stopped early: {:?}",
        g.stop
    );
    g.tokens
}

/// The last-position logits of every decode step that `generate` would run
/// to produce `tokens` after `prompts` (of any lengths), fed by teacher
/// forcing: entry `k` chose the tokens at position `shared + k`, where
/// `shared` is the shortest prompt's length.
fn forced_logits(backend: &mut dyn Backend, prompts: &[Vec<u32>], tokens: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let b = prompts.len();
    let shared = prompts.iter().map(Vec::len).min().unwrap();
    let end = prompts
        .iter()
        .zip(tokens)
        .map(|(p, t)| p.len() + t.len())
        .max()
        .unwrap();
    let first: Vec<u32> = prompts.iter().flat_map(|p| p[..shared].iter().copied()).collect();
    backend.forward(&first, b, shared, 0, LogitsWanted::Last).unwrap();
    let mut out = vec![backend.logits().unwrap()];
    let mut fed: Vec<u32> = prompts.iter().map(|p| p[shared - 1]).collect();
    for pos in shared..end - 1 {
        for (r, (p, t)) in prompts.iter().zip(tokens).enumerate() {
            // A finished row is fed its previous token again, as `generate` does.
            if let Some(&id) = p.get(pos).or_else(|| t.get(pos - p.len())) {
                fed[r] = id;
            }
        }
        backend.forward(&fed, b, 1, pos, LogitsWanted::Last).unwrap();
        out.push(backend.logits().unwrap());
    }
    out
}

/// The gap between the two largest of `logits`.
fn top_two_gap(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in logits {
        if x > first {
            second = first;
            first = x;
        } else if x > second {
            second = x;
        }
    }
    first - second
}

/// Rows where `mine` and `theirs` (tokens generated after `prompts`)
/// first differ: up to there `theirs`' backend saw `mine`'s history
/// (`forced`: its logits fed `mine` by teacher forcing, [`forced_logits`]),
/// so that choice must be a near tie.
fn assert_differences_are_near_ties(
    what: &str,
    prompts: &[Vec<u32>],
    mine: &[Vec<u32>],
    theirs: &[Vec<u32>],
    forced: &[Vec<f32>],
    (v, vp): (usize, usize),
) {
    let shared = prompts.iter().map(Vec::len).min().unwrap();
    for (r, (mine, theirs)) in mine.iter().zip(theirs).enumerate() {
        let Some(s) = (0..mine.len().max(theirs.len())).find(|&s| mine.get(s) != theirs.get(s)) else {
            continue;
        };
        let step = prompts[r].len() + s - shared;
        let gap = top_two_gap(&forced[step][r * vp..r * vp + v]);
        assert!(
            gap < TIE_GAP,
            "{what}: row {r} token {s}: one engine chose {:?} and the replicas {:?}, top-two gap {gap:e}",
            theirs.get(s),
            mine.get(s)
        );
        eprintln!("{what}: row {r} token {s}: a near tie (gap {gap:e}) chose differently");
    }
}

/// Generation on `devices` (one replica each) against one engine per
/// sub-batch on the same device (bit for bit, sampling included: each
/// sub-batch engine draws from the streams of its rows) and one engine on
/// `devices[0]` running the whole batch.
fn generation_matches(devices: &[usize], b: usize) {
    let ck = random_checkpoint(&format!("replicas {devices:?} b={b}"));
    let w = ck.weights().unwrap();
    let cfg = w.config;
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let seed: u64 = crate::seed::rng().random();
    let prompts = random_prompts(b, v);

    let mut dp = Replicas::new(devices, &w, b, MAX_T, Precision::Fp32).unwrap();
    let dp_greedy = generated(&mut dp, &prompts, greedy());
    let dp_sampled = generated(&mut dp, &prompts, sampled(seed));
    let dp_forced = forced_logits(&mut dp, &prompts, &dp_greedy);

    let ranges = split_rows(b, devices.len());
    // Built as the replicas are (the first share's rows), so nothing differs.
    let per_replica = ranges[0].len();
    for (&device, range) in devices.iter().zip(&ranges).filter(|(_, r)| !r.is_empty()) {
        let rows = range.clone();
        let mut e = engine(device, &w, per_replica, MAX_T);
        let part = &prompts[rows.clone()];
        assert_eq!(
            generated(&mut e, part, greedy()),
            dp_greedy[rows.clone()],
            "greedy, rows {rows:?}"
        );
        e.set_sample_stream_offset(rows.start).unwrap();
        assert_eq!(
            generated(&mut e, part, sampled(seed)),
            dp_sampled[rows.clone()],
            "sampled, rows {rows:?}"
        );
        // The replica's logits at every step, bit for bit.
        let forced = forced_logits(&mut e, part, &dp_greedy[rows.clone()]);
        for (s, (got, want)) in dp_forced.iter().zip(&forced).enumerate() {
            assert!(
                got[rows.start * vp..rows.end * vp] == want[..],
                "step {s} logits of rows {rows:?} differ"
            );
        }
    }

    let mut one = engine(devices[0], &w, b, MAX_T);
    assert_eq!(
        generated(&mut one, &prompts, sampled(seed)),
        dp_sampled,
        "sampled: replicas against one engine"
    );
    let one_greedy = generated(&mut one, &prompts, greedy());
    let one_forced = forced_logits(&mut one, &prompts, &dp_greedy);
    check(
        &format!("replicas {devices:?} vs one engine, b={b}, every step's logits"),
        &dp_forced.concat(),
        &one_forced.concat(),
        FULL_BATCH_TOL,
        0.0,
    );
    assert_differences_are_near_ties(
        &format!("greedy, replicas {devices:?}, b={b}"),
        &prompts,
        &dp_greedy,
        &one_greedy,
        &one_forced,
        (v, vp),
    );
}

#[test]
#[ignore = "needs a GPU"]
fn replicas_on_one_gpu_generate_like_one_engine() {
    let Some(_gpu) = skip::gpu() else { return };
    // Even, uneven, and a replica without rows.
    for b in [4, 3, 1] {
        generation_matches(&SAME_GPU, b);
    }
}

/// Prompt lengths of [`ragged_prompts`], row by row (cycled): the longest
/// prompt is [`RAGGED_LONGEST`].
const RAGGED_LENGTHS: [usize; 5] = [5, 9, 3, 7, 11];
const RAGGED_LONGEST: usize = 11;
/// Positions of the ragged generations: room for [`STEPS`] tokens after
/// the longest prompt. The runs of `2 * STEPS` tokens stop at it, a row
/// after fewer tokens the longer its prompt.
const RAGGED_MAX_T: usize = RAGGED_LONGEST + STEPS + 1;

/// `b` random prompts of different lengths ([`RAGGED_LENGTHS`]).
fn ragged_prompts(b: usize, vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = crate::seed::rng();
    (0..b)
        .map(|r| {
            (0..RAGGED_LENGTHS[r % RAGGED_LENGTHS.len()])
                .map(|_| rng.random_range(0..vocab as u32))
                .collect()
        })
        .collect()
}

/// What a generation gave: each row's tokens and stop reason, the tokens
/// generated and the positions used, and what `on_token` received, in
/// order.
#[derive(Debug, PartialEq)]
struct Outcome {
    tokens: Vec<Vec<u32>>,
    stop: Vec<StopReason>,
    generated: usize,
    positions: usize,
    streamed: Vec<(usize, u32)>,
}

/// `max_new` tokens a row with `sampler`, through the free `generate`
/// (`batch == false`) or `Backend::generate_batch`.
fn run_generation(
    backend: &mut dyn Backend,
    prompts: &[Vec<u32>],
    max_new: usize,
    mut sampler: Sampler,
    batch: bool,
) -> Outcome {
    let mut streamed = Vec::new();
    let mut on_token = |row: usize, id: u32| streamed.push((row, id));
    let g = if batch {
        backend.generate_batch(prompts, max_new, &mut sampler, &mut on_token)
    } else {
        generate(backend, prompts, max_new, &mut sampler, &mut on_token)
    }
    .unwrap();
    Outcome {
        tokens: g.tokens,
        stop: g.stop,
        generated: g.generated,
        positions: g.positions,
        streamed,
    }
}

/// `on_token` received every generated token exactly once, with its row,
/// in order within each row.
fn assert_streamed_once(out: &Outcome, what: &str) {
    assert_eq!(out.streamed.len(), out.generated, "{what}: tokens streamed");
    assert_eq!(
        out.tokens.iter().map(Vec::len).sum::<usize>(),
        out.generated,
        "{what}: tokens counted"
    );
    for (r, tokens) in out.tokens.iter().enumerate() {
        let got: Vec<u32> = out
            .streamed
            .iter()
            .filter(|&&(row, _)| row == r)
            .map(|&(_, id)| id)
            .collect();
        assert_eq!(&got, tokens, "{what}: tokens streamed for row {r}");
    }
    assert!(
        out.streamed.iter().all(|&(row, _)| row < out.tokens.len()),
        "{what}: a token streamed for a row outside the batch"
    );
}

/// `Backend::generate_batch` of replicas on `devices` (each running the
/// whole loop on its rows) on a batch of `b` prompts of different lengths:
/// bit for bit the free `generate` of one engine per sub-batch (its rows'
/// random streams), and the tokens of one engine running the free
/// `generate` on the whole batch (sampled equal; greedy equal except at a
/// near tie), greedy and sampled, to `max_new` tokens and to the context
/// limit; `on_token` gets every token once with its row.
fn batch_generation_matches(devices: &[usize], b: usize) {
    let ck = random_checkpoint(&format!("batch generation on replicas {devices:?} b={b}"));
    let w = ck.weights().unwrap();
    let cfg = w.config;
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let seed: u64 = crate::seed::rng().random();
    eprintln!("sampling seed {seed}");
    let prompts = ragged_prompts(b, v);
    let ranges = split_rows(b, devices.len());
    let per_replica = ranges[0].len();
    let mut dp = Replicas::new(devices, &w, b, RAGGED_MAX_T, Precision::Fp32).unwrap();
    let mut one = engine(devices[0], &w, b, RAGGED_MAX_T);
    // (what, max_new, sampler): every row to `STEPS`, then every row to the
    // context limit (`2 * STEPS` does not fit after any prompt).
    let runs = [
        ("greedy", STEPS, None),
        ("sampled", STEPS, Some(seed)),
        ("greedy to the limit", 2 * STEPS, None),
        ("sampled to the limit", 2 * STEPS, Some(seed)),
    ];
    let sampler = |s: Option<u64>| s.map_or_else(greedy, sampled);
    for (what, max_new, s) in runs {
        let what = format!("{what}, replicas {devices:?}, b={b}");
        let got = run_generation(&mut dp, &prompts, max_new, sampler(s), true);
        assert_streamed_once(&got, &what);
        if max_new == STEPS {
            assert!(got.tokens.iter().all(|t| t.len() == STEPS), "{what}: {:?}", got.stop);
        } else {
            assert!(
                got.stop.iter().all(|&s| s == StopReason::ContextLimit),
                "{what}: {:?}",
                got.stop
            );
            assert_eq!(got.positions, RAGGED_MAX_T, "{what}");
        }

        // Each replica's rows: one engine on them, bit for bit.
        for (&device, rows) in devices.iter().zip(&ranges).filter(|(_, r)| !r.is_empty()) {
            let mut e = engine(device, &w, per_replica, RAGGED_MAX_T);
            e.set_sample_stream_offset(rows.start).unwrap();
            let part = run_generation(&mut e, &prompts[rows.clone()], max_new, sampler(s), false);
            assert_eq!(part.tokens, got.tokens[rows.clone()], "{what}: rows {rows:?}");
            assert_eq!(part.stop, got.stop[rows.clone()], "{what}: rows {rows:?}");
            assert!(part.positions <= got.positions, "{what}: rows {rows:?}");
        }

        // One engine on the whole batch.
        let want = run_generation(&mut one, &prompts, max_new, sampler(s), false);
        assert_eq!(got.positions, want.positions, "{what}: positions");
        if s.is_some() {
            assert_eq!(got.tokens, want.tokens, "{what}: against one engine");
            assert_eq!(got.stop, want.stop, "{what}: against one engine");
            assert_eq!(got.generated, want.generated, "{what}: against one engine");
            continue;
        }
        let forced = forced_logits(&mut one, &prompts, &got.tokens);
        assert_differences_are_near_ties(&what, &prompts, &got.tokens, &want.tokens, &forced, (v, vp));
    }
}

/// `generate_batch` with one replica is the engine's `generate`, streamed
/// tokens and their order included; over two replicas it checks the batch
/// as `generate` would, and leaves the replicas without a call to continue.
fn batch_generation_edges(device: usize) {
    let ck = random_checkpoint("batch generation edges");
    let w = ck.weights().unwrap();
    let v = w.config.vocab_size;
    let b = 3;
    let prompts = ragged_prompts(b, v);
    let seed: u64 = crate::seed::rng().random();
    eprintln!("sampling seed {seed}");
    let mut alone = Replicas::new(&[device], &w, b, RAGGED_MAX_T, Precision::Fp32).unwrap();
    let mut one = engine(device, &w, b, RAGGED_MAX_T);
    for (what, s) in [("greedy", greedy()), ("sampled", sampled(seed))] {
        let got = run_generation(&mut alone, &prompts, STEPS, s.clone(), true);
        let want = run_generation(&mut one, &prompts, STEPS, s, false);
        assert_eq!(got, want, "{what}: one replica against its engine");
    }

    let mut dp = Replicas::new(&[device, device], &w, b, RAGGED_MAX_T, Precision::Fp32).unwrap();
    let mut s = greedy();
    let mut never = |row: usize, id: u32| panic!("token {id} of row {row} streamed from a batch that fails");
    let mut bad = prompts.clone();
    bad[b - 1][0] = v as u32;
    let e = format!("{:#}", dp.generate_batch(&bad, STEPS, &mut s, &mut never).unwrap_err());
    assert!(e.contains(&format!("prompt {b}")) && e.contains("vocabulary"), "{e}");
    let too_many = vec![prompts[0].clone(); dp.max_batch() + 1];
    let e = format!(
        "{:#}",
        dp.generate_batch(&too_many, STEPS, &mut s, &mut never).unwrap_err()
    );
    assert!(e.contains("exceeds"), "{e}");

    // After a batch the replicas hold no call to read or continue.
    dp.forward(&vec![0; b], b, 1, 0, LogitsWanted::Last).unwrap();
    let out = run_generation(&mut dp, &prompts, STEPS, greedy(), true);
    assert_eq!(out.generated, b * STEPS);
    let e = format!("{:#}", dp.logits().unwrap_err());
    assert!(e.contains("before a successful forward"), "{e}");
    let e = format!(
        "{:#}",
        dp.forward(&vec![0; b], b, 1, 1, LogitsWanted::Last).unwrap_err()
    );
    assert!(e.contains("continues"), "{e}");
    // A call from position 0 runs as before.
    dp.forward(&vec![0; b], b, 1, 0, LogitsWanted::Last).unwrap();
    assert_eq!(dp.argmax().unwrap().len(), b);
    // The step-wise path after a batch is that of fresh replicas, bit for bit.
    let mut fresh = Replicas::new(&[device, device], &w, b, RAGGED_MAX_T, Precision::Fp32).unwrap();
    for (what, s) in [("greedy", greedy()), ("sampled", sampled(seed))] {
        run_generation(&mut dp, &prompts, STEPS, s.clone(), true);
        let after = run_generation(&mut dp, &prompts, STEPS, s.clone(), false);
        let want = run_generation(&mut fresh, &prompts, STEPS, s, false);
        assert_eq!(after, want, "{what}: generate after generate_batch");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn replicas_generate_batch_like_one_engine() {
    let Some(_gpu) = skip::gpu() else { return };
    // Even, uneven, and a replica without rows.
    for b in [4, 3, 1] {
        batch_generation_matches(&SAME_GPU, b);
    }
    batch_generation_edges(0);
}

/// The rows of `ranges[i]` from `all` (`per_row` values a row).
fn rows_of(all: &[f32], range: &Range<usize>, per_row: usize) -> Vec<f32> {
    all[range.start * per_row..range.end * per_row].to_vec()
}

#[test]
#[ignore = "needs a GPU"]
fn replica_logits_equal_sub_batch_engines_bitwise() {
    let Some(_gpu) = skip::gpu() else { return };
    let ck = random_checkpoint("replica logits");
    let w = ck.weights().unwrap();
    let cfg = w.config;
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let mut rng = crate::seed::rng();
    for b in [3, 4, 1] {
        let prompt: Vec<u32> = (0..b * PROMPT_LEN).map(|_| rng.random_range(0..v as u32)).collect();
        let step: Vec<u32> = (0..b).map(|_| rng.random_range(0..v as u32)).collect();
        let mut dp = Replicas::new(&SAME_GPU, &w, b, MAX_T, Precision::Fp32).unwrap();
        let run = |backend: &mut dyn Backend| {
            backend
                .forward(&prompt, backend_rows(&prompt), PROMPT_LEN, 0, LogitsWanted::All)
                .unwrap();
            let prefill = backend.logits().unwrap();
            let prefill_ids = backend.argmax().unwrap();
            backend
                .forward(&step, step.len(), 1, PROMPT_LEN, LogitsWanted::Last)
                .unwrap();
            (
                prefill,
                prefill_ids,
                backend.logits().unwrap(),
                backend.argmax().unwrap(),
            )
        };
        let (dp_prefill, dp_prefill_ids, dp_step, dp_step_ids) = run(&mut dp);
        assert_eq!(dp_prefill.len(), b * PROMPT_LEN * vp);
        assert_eq!(dp_step.len(), b * vp);
        let ranges = split_rows(b, SAME_GPU.len());
        for range in ranges.iter().filter(|r| !r.is_empty()) {
            let mut e = engine(0, &w, ranges[0].len(), MAX_T);
            let part = |all: &[u32], per_row: usize| all[range.start * per_row..range.end * per_row].to_vec();
            let (prompt_r, step_r) = (part(&prompt, PROMPT_LEN), part(&step, 1));
            e.forward(&prompt_r, range.len(), PROMPT_LEN, 0, LogitsWanted::All)
                .unwrap();
            assert!(
                rows_of(&dp_prefill, range, PROMPT_LEN * vp) == e.logits().unwrap(),
                "b={b} prefill {range:?}"
            );
            assert_eq!(
                dp_prefill_ids[range.clone()],
                e.argmax().unwrap()[..],
                "b={b} prefill ids {range:?}"
            );
            e.forward(&step_r, range.len(), 1, PROMPT_LEN, LogitsWanted::Last)
                .unwrap();
            assert!(
                rows_of(&dp_step, range, vp) == e.logits().unwrap(),
                "b={b} step {range:?}"
            );
            assert_eq!(
                dp_step_ids[range.clone()],
                e.argmax().unwrap()[..],
                "b={b} step ids {range:?}"
            );
        }
        let (one_prefill, _, one_step, _) = run(&mut engine(0, &w, b, MAX_T));
        check(
            &format!("b={b} prefill, replicas vs one engine"),
            &dp_prefill,
            &one_prefill,
            FULL_BATCH_TOL,
            0.0,
        );
        check(
            &format!("b={b} step, replicas vs one engine"),
            &dp_step,
            &one_step,
            FULL_BATCH_TOL,
            0.0,
        );
    }
}

/// Rows of a prompt of [`PROMPT_LEN`] tokens a row.
fn backend_rows(prompt: &[u32]) -> usize {
    prompt.len() / PROMPT_LEN
}

/// Perplexity of random tokens on `devices` against one engine on
/// `devices[0]`, at batches that split evenly and unevenly.
fn perplexity_matches(devices: &[usize]) {
    let ck = random_checkpoint(&format!("replicas {devices:?} perplexity"));
    let w = ck.weights().unwrap();
    let mut rng = crate::seed::rng();
    let cfg = w.config;
    let tokens: Vec<u32> = (0..cfg.max_seq_len * 3)
        .map(|_| rng.random_range(0..cfg.vocab_size as u32))
        .collect();
    let window = cfg.max_seq_len / 2;
    for batch in [4, 3] {
        let config = PerplexityConfig {
            window,
            stride: window / 2,
            batch,
        };
        let mut dp = Replicas::new(devices, &w, batch, window, Precision::Fp32).unwrap();
        let dp_report = perplexity_with(&mut dp, &tokens, &config, |_, _| {}).unwrap();
        let mut one = engine(devices[0], &w, batch, window);
        let one_report = perplexity_with(&mut one, &tokens, &config, |_, _| {}).unwrap();
        assert_eq!(dp_report.tokens_scored, one_report.tokens_scored);
        let rel = (dp_report.total_nll - one_report.total_nll).abs() / one_report.total_nll.abs();
        eprintln!(
            "batch {batch}: perplexity {:.6} (replicas) vs {:.6}, relative NLL difference {rel:.2e}",
            dp_report.perplexity(),
            one_report.perplexity()
        );
        assert!(rel < PPL_REL_TOL, "batch {batch}: relative NLL difference {rel:e}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn replicas_perplexity_equals_one_engine() {
    let Some(_gpu) = skip::gpu() else { return };
    perplexity_matches(&SAME_GPU);
}

#[test]
#[ignore = "needs a GPU"]
fn sample_stream_offset_draws_from_offset_streams() {
    let Some(gpu) = skip::gpu() else { return };
    let ck = random_checkpoint("stream offset");
    let w = ck.weights().unwrap();
    let cfg = w.config;
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    let b = 3;
    let mut e = GpuEngine::new(gpu, &w, b, MAX_T, Precision::Fp32).unwrap();
    let mut rng = crate::seed::rng();
    let prompt: Vec<u32> = (0..b * PROMPT_LEN).map(|_| rng.random_range(0..v as u32)).collect();
    let rows = vec![sampled(rng.random()).row(); b];
    let twin = |logits: &[f32], pos: usize, offset: usize| -> Vec<u32> {
        (0..b)
            .map(|r| sample_row(&logits[r * vp..r * vp + v], &rows[0], pos as u32, (offset + r) as u32))
            .collect()
    };
    for offset in [0, 5, 1] {
        e.set_sample_stream_offset(offset).unwrap();
        // Eager sampling after a prefill.
        e.prepare_sampling(None).unwrap();
        e.forward(&prompt, b, PROMPT_LEN, 0, LogitsWanted::Last).unwrap();
        let logits = e.logits().unwrap();
        let ids = e.sample(&rows, PROMPT_LEN).unwrap();
        assert_eq!(ids, twin(&logits, PROMPT_LEN, offset), "eager, offset {offset}");
        // The fused step's own sampling.
        e.prepare_sampling(Some(&rows)).unwrap();
        e.forward(&ids, b, 1, PROMPT_LEN, LogitsWanted::Last).unwrap();
        let logits = e.logits().unwrap();
        let ids = e.sample(&rows, PROMPT_LEN + 1).unwrap();
        assert_eq!(
            ids,
            twin(&logits, PROMPT_LEN + 1, offset),
            "decode step, offset {offset}"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn replicas_report_misuse_and_a_panicking_worker() {
    let Some(_gpu) = skip::gpu() else { return };
    let ck = checkpoint(1);
    let w = ck.weights().unwrap();
    let v = w.config.vocab_size as u32;
    let b = 4;
    let mut dp = Replicas::new(&SAME_GPU, &w, b, MAX_T, Precision::Fp32).unwrap();
    assert_eq!(dp.max_batch(), b);
    assert_eq!(dp.devices(), SAME_GPU);
    let err = |r: anyhow::Result<()>| format!("{:#}", r.unwrap_err());
    let tokens = |rows: usize, t: usize| vec![v - 1; rows * t];
    let e = err(dp.forward(&tokens(b + 1, 1), b + 1, 1, 0, LogitsWanted::Last));
    assert!(e.contains("exceeds"), "{e}");
    let e = err(dp.forward(&tokens(b, 1), b, 1, 3, LogitsWanted::Last));
    assert!(e.contains("continues"), "{e}");
    assert!(format!("{:#}", dp.logits().unwrap_err()).contains("before a successful forward"));
    dp.forward(&tokens(b, 2), b, 2, 0, LogitsWanted::Last).unwrap();
    // Fewer rows at a later position would move rows to other replicas.
    let e = err(dp.forward(&tokens(b - 1, 1), b - 1, 1, 2, LogitsWanted::Last));
    assert!(e.contains("continues"), "{e}");
    let e = err(dp.forward(&[v], 1, 1, 0, LogitsWanted::Last));
    assert!(e.contains("vocabulary"), "{e}");
    // An error inside a replica names its GPU.
    let e = format!(
        "{:#}",
        dp.with_each(|i, _| {
            anyhow::ensure!(i == 0, "replica says no");
            Ok(())
        })
        .unwrap_err()
    );
    assert!(e.contains("replica 1 on GPU 0") && e.contains("replica says no"), "{e}");
    // A panicking worker becomes an error, and stays one.
    let e = format!(
        "{:#}",
        dp.with_each(|i, _| -> anyhow::Result<()> {
            assert!(i != 1, "worker panics on purpose");
            Ok(())
        })
        .unwrap_err()
    );
    assert!(
        e.contains("replica 1") && e.contains("panicked") && e.contains("on purpose"),
        "{e}"
    );
    let e = err(dp.forward(&tokens(b, 1), b, 1, 0, LogitsWanted::Last));
    assert!(e.contains("replica 1") && e.contains("stopped"), "{e}");
}

#[test]
#[ignore = "needs a GPU"]
fn replicas_on_two_gpus_match_one_gpu() {
    // The check (skip, or fail under GPT2_REQUIRE_MULTI_GPU=1) the TP tests make.
    if crate::tensor_parallel::two_gpus().is_none() {
        return;
    }
    let devices = [0, 1];
    for b in [8, 3] {
        generation_matches(&devices, b);
        batch_generation_matches(&devices, b);
    }
    perplexity_matches(&devices);
}

/// The server's interface over two replicas on GPU 0 (slots interleaved
/// over them, a decode step split by replica) runs the serve tests'
/// schedule against the CPU reference at the FP32 bar.
#[test]
#[ignore = "needs a GPU"]
fn slot_replicas_on_one_gpu_match_cpu() {
    crate::serve::schedule_matches_cpu_on(Precision::Fp32, crate::serve::FP32_TOL, |gpu, w| {
        drop(gpu);
        let (slots, max_t, chunk) = (crate::serve::SLOTS, crate::serve::MAX_T, crate::serve::CHUNK);
        let replicas = Replicas::for_slots(&SAME_GPU, w, slots, max_t, chunk, Precision::Fp32).unwrap();
        assert_eq!(host::serve::backend::SlotBackend::slots(&replicas), slots);
        Box::new(replicas)
    });
}
