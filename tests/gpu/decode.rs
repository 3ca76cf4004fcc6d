//! The fused decode step (`gpu::ops::decode`, `DecodePath`): the graph
//! replay against the same kernels launched eagerly (same tokens, logits
//! within 1e-6), both against the per-op kernels and the CPU reference,
//! with and without programmatic dependent launch, with each launch knob
//! (bit for bit the same), windowed, at the row
//! limit and past it; decode attention with rows at different positions
//! against a plain CPU attention; the step that ends by sampling against
//! the sampler's CPU twin; pipelined generation against unpipelined.

use gpu_kernels::params::decode_step::DECODE_STEP_MAX_ROWS;
use gpu_kernels::params::sample::SampleRow;
use host::bench::step_trace::phase_times;
use host::cpu::CpuModel;
use host::cpu::ops as cpu;
use host::generate::{Backend, LogitsWanted, StopReason, generate};
use host::gpu::Gpu;
use host::gpu::engine::{DecodePath, DecodeTuning, GpuEngine, PREFETCH_AHEAD_TRY_BYTES, Precision};
use host::gpu::ops::decode::{DecodeLaunch, DecodeWorkspace, decode_attention};
use host::gpu::ops::decode_step::decode_step_fold;
use host::gpu::ops::weight::WeightRef;
use host::gpu::shape::{DecodeAttentionShape, KvRows, SampleShape};
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::llmc_bytes;
use host::model::{DType, ModelConfig};
use host::sample::{Sampler, SamplingParams};
use rand::Rng;

use crate::kernels::{CacheElem, check, down, poisoned, random_vec};

/// Graph replay against the eager launches of the same kernels.
const GRAPH_TOL: f32 = 1e-6;
/// The fused kernels against the per-op ones (other summation orders).
const PATHS_TOL: f32 = 1e-4;
/// The FP32 bar against the CPU reference.
const CPU_TOL: f32 = 1e-3;
/// bf16: the fused GEMV against the per-op bf16 tensor-core matmul, and the
/// GPU against its CPU twin (`CpuModel::new_bf16`). Both sides multiply the
/// same bf16 values, but an f32 difference of one ulp upstream can move an
/// activation across a bf16 rounding boundary (a 2^-8 relative step), and
/// prefill attention runs on TF32 tensor cores under bf16: measured errors
/// are printed, this bound has a few times margin over them.
const BF16_TOL: f32 = 5e-2;
/// An L2 prefetch distance shorter than one layer's weights of the test
/// models, so each kernel's request spans pieces of several weights.
const PREFETCH_SMALL_BYTES: usize = 64 << 10;

/// A small model with GPT-2's head size (64), which the fused kernels need:
/// L=2, NH=3, C=192, V=1000 (padded to 1024), maxT=160. (Also the
/// server tests' model: `serve.rs`.)
pub(crate) fn head64_config() -> ModelConfig {
    let vocab_size = 1000;
    ModelConfig {
        max_seq_len: 160,
        vocab_size,
        padded_vocab_size: ModelConfig::pad_vocab(vocab_size),
        num_layers: 2,
        num_heads: 3,
        channels: 192,
    }
}

fn checkpoint(cfg: &ModelConfig, seed: u64) -> Checkpoint {
    let bytes = llmc_bytes(cfg, seed, DType::F32).unwrap();
    Checkpoint::from_bytes(bytes, "random.bin", Some(cfg.num_heads)).unwrap()
}

/// Greedy-decode `steps` tokens after a random prompt of `prompt` tokens
/// per row on `path`; returns every step's last-position logits and ids.
fn run_path(
    eng: &mut GpuEngine,
    path: DecodePath,
    pdl: bool,
    prompt: &[u32],
    b: usize,
    t: usize,
    steps: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    eng.set_decode_path(path, pdl);
    eng.forward(prompt, b, t, 0, LogitsWanted::Last).unwrap();
    let mut logits = vec![eng.logits().unwrap()];
    let mut ids = vec![eng.argmax().unwrap()];
    for s in 0..steps {
        assert_eq!(eng.decode_path_in_use(b), path, "the engine took another path");
        let next = ids.last().unwrap().clone();
        eng.forward(&next, b, 1, t + s, LogitsWanted::Last).unwrap();
        logits.push(eng.logits().unwrap());
        ids.push(eng.argmax().unwrap());
    }
    (logits, ids)
}

/// Every step's last-position logits after the prompt, feeding `ids[s]` at
/// step `s` (the tokens another run chose), on `path` with PDL and the
/// engine's current tuning; checks that each step's own choice is the
/// argmax of its logits.
fn forced_path(
    eng: &mut GpuEngine,
    path: DecodePath,
    prompt: &[u32],
    b: usize,
    t: usize,
    ids: &[Vec<u32>],
) -> Vec<Vec<f32>> {
    eng.set_decode_path(path, true);
    eng.forward(prompt, b, t, 0, LogitsWanted::Last).unwrap();
    let mut logits = vec![eng.logits().unwrap()];
    for (s, step_ids) in ids.iter().take(ids.len() - 1).enumerate() {
        eng.forward(step_ids, b, 1, t + s, LogitsWanted::Last).unwrap();
        let l = eng.logits().unwrap();
        let chosen = eng.argmax().unwrap();
        let vp = l.len() / b;
        let v = eng.config().vocab_size;
        for (r, &id) in chosen.iter().enumerate() {
            let row = &l[r * vp..r * vp + v];
            let best = row
                .iter()
                .enumerate()
                .fold(0, |bi, (i, &x)| if x > row[bi] { i } else { bi });
            assert_eq!(
                id as usize, best,
                "step {s} row {r}: the step chose {id}, its logits' argmax is {best}"
            );
        }
        logits.push(l);
    }
    logits
}

/// `tuning` with the persistent step wherever it serves the batch (the
/// default takes it at one row only).
fn persistent_everywhere(tuning: DecodeTuning) -> DecodeTuning {
    DecodeTuning {
        persistent: true,
        persistent_max_rows: DECODE_STEP_MAX_ROWS as usize,
        persistent_max_rows_bf16: DECODE_STEP_MAX_ROWS as usize,
        persistent_rows_max_keys: usize::MAX,
        persistent_rows_max_keys_bf16: usize::MAX,
        ..tuning
    }
}

/// At two rows and more the persistent step serves steps whose rows attend
/// to few enough keys (`DecodeTuning::persistent_rows_max_keys`) and the
/// chain the later ones:
/// a generation that crosses it, fed by the host and fed by the device
/// (which captures the chain's graph mid-run), against the chain alone.
fn switch_to_chain(
    eng: &mut GpuEngine,
    prompt: &[u32],
    (b, t, steps, window): (usize, usize, usize, usize),
    ids: &[Vec<u32>],
    chain_logits: &[Vec<f32>],
    tol: f32,
    what: &dyn Fn(&str) -> String,
) {
    // Steps run at positions t..t + steps; the first half persistent, or
    // with a window, the steps before the keys stop growing.
    let keys_at = |p: usize| if window > 0 { (p + 1).min(window) } else { p + 1 };
    let mut switch_pos = t + (steps - 1) / 2;
    if window > 0 {
        switch_pos = switch_pos.min(window.saturating_sub(2)).max(t);
    }
    eng.set_decode_tuning(DecodeTuning {
        persistent_rows_max_keys: keys_at(switch_pos),
        persistent_rows_max_keys_bf16: keys_at(switch_pos),
        ..persistent_everywhere(DecodeTuning::default())
    });
    assert!(eng.decode_step_is_persistent(b, switch_pos));
    // A window already full at the prompt: no step attends to more keys.
    let crosses = keys_at(switch_pos + 1) > keys_at(switch_pos);
    if crosses {
        assert!(!eng.decode_step_is_persistent(b, switch_pos + 1));
    }
    let how = if crosses {
        format!("persistent up to position {switch_pos}, then the chain,")
    } else {
        format!("persistent throughout (window {window} full),")
    };
    let switched = forced_path(eng, DecodePath::Graph, prompt, b, t, ids);
    check(
        &what(&format!("{how} vs the chain")),
        &switched.concat(),
        &chain_logits.concat(),
        tol,
        0.0,
    );
    eng.set_decode_path(DecodePath::Graph, true);
    eng.forward(prompt, b, t, 0, LogitsWanted::Last).unwrap();
    eng.forward(&ids[0], b, 1, t, LogitsWanted::Last).unwrap();
    let mut fed = vec![eng.logits().unwrap()];
    let v = eng.config().vocab_size;
    for (s, step_ids) in ids.iter().enumerate().take(steps).skip(1) {
        let chosen = eng.argmax().unwrap();
        if &chosen != step_ids {
            // The paths' logits differ by up to `tol`, so a row whose two
            // best logits are that close may choose either: past such a
            // choice the runs feed other tokens and compare no longer. Any
            // other difference is a failure.
            let reference = &chain_logits[s];
            let vp = reference.len() / b;
            for (r, (&got, &want)) in chosen.iter().zip(step_ids).enumerate() {
                let gap = top2_gap(&reference[r * vp..r * vp + v]);
                assert!(
                    got == want || gap <= 2.0 * tol,
                    "{}: the device-fed step {s} row {r} chose {got}, not {want}, though its best logit leads by {gap:.3e} (paths agree within {tol:.1e})",
                    what("switch")
                );
            }
            println!(
                "{}: step {s} took the other side of a near tie (within 2 x {tol:.1e}); compared up to it",
                what("switch")
            );
            break;
        }
        eng.decode_on_device(1).unwrap();
        fed.push(eng.logits().unwrap());
    }
    check(
        &what(&format!("device-fed, {how} vs the chain")),
        &fed.concat(),
        &chain_logits[1..=fed.len()].concat(),
        tol,
        0.0,
    );
}

/// How far a row's best logit leads its second best.
fn top2_gap(row: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in row {
        if x > first {
            (first, second) = (x, first);
        } else if x > second {
            second = x;
        }
    }
    first - second
}

/// Whether two runs' per-step logits are equal bit for bit.
fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    let (a, b) = (a.concat(), b.concat());
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every path on one checkpoint: graph = eager (with and without PDL),
/// both within `PATHS_TOL` of the per-op kernels on the same tokens, and
/// the CPU reference fed the same tokens within the FP32 bar.
fn paths_agree(cfg: &ModelConfig, b: usize, t: usize, steps: usize, window: usize) {
    paths_agree_in(cfg, b, t, steps, window, Precision::Fp32);
}

/// [`paths_agree`] in `precision` (FP32's tolerances, or [`BF16_TOL`]
/// against the per-op kernels and the bf16 CPU twin under bf16).
fn paths_agree_in(cfg: &ModelConfig, b: usize, t: usize, steps: usize, window: usize, precision: Precision) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let seed: u64 = crate::seed::rng().random();
    eprintln!("decode paths: checkpoint seed {seed}");
    let ck = checkpoint(cfg, seed);
    let w = ck.weights().unwrap();
    let bf16 = precision == Precision::Bf16;
    let (paths_tol, cpu_tol) = if bf16 {
        (BF16_TOL, BF16_TOL)
    } else {
        (PATHS_TOL, CPU_TOL)
    };
    let mut eng = GpuEngine::new(gpu, &w, b, t + steps + 1, precision).unwrap();
    eng.set_attention_window(window);
    let mut rng = crate::seed::rng();
    let prompt: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let (graph_logits, graph_ids) = run_path(&mut eng, DecodePath::Graph, true, &prompt, b, t, steps);
    let what = |p: &str| {
        format!(
            "{p} {precision:?} L={} C={} B={b} T={t} W={window}",
            cfg.num_layers, cfg.channels
        )
    };
    for (path, pdl) in [
        (DecodePath::Graph, false),
        (DecodePath::Eager, true),
        (DecodePath::Eager, false),
    ] {
        let (logits, ids) = run_path(&mut eng, path, pdl, &prompt, b, t, steps);
        assert_eq!(ids, graph_ids, "{path:?} pdl={pdl} chose other tokens than the graph");
        check(
            &what(&format!("{path:?} pdl={pdl} vs graph")),
            &logits.concat(),
            &graph_logits.concat(),
            GRAPH_TOL,
            0.0,
        );
    }
    // The chain of fused kernels, whatever the default step is: the launch
    // knobs change no value. The L2 prefetch (a hint) over the whole stream
    // or split into pieces, fewer blocks per SM, the early PDL trigger give
    // the same results bit for bit.
    let chain = DecodeTuning {
        persistent: false,
        ..DecodeTuning::default()
    };
    eng.set_decode_tuning(chain);
    assert!(!eng.decode_step_is_persistent(b, t));
    let chain_logits = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
    for tuning in [
        DecodeTuning {
            prefetch_ahead_bytes: PREFETCH_AHEAD_TRY_BYTES,
            gemv_blocks_per_sm: 1,
            gemv_block_warps: 2,
            tensor_cores: true,
            early_trigger: true,
            persistent: false,
            trace: false,
            step_ring_slots: 0,
            step_ring_fill: false,
            persistent_max_rows: 1,
            persistent_max_rows_bf16: 1,
            persistent_rows_max_keys: 0,
            persistent_rows_max_keys_bf16: 0,
            fold_layernorms: true,
        },
        DecodeTuning {
            prefetch_ahead_bytes: PREFETCH_SMALL_BYTES,
            gemv_blocks_per_sm: 0,
            gemv_block_warps: 0,
            tensor_cores: true,
            early_trigger: false,
            persistent: false,
            trace: false,
            step_ring_slots: 0,
            step_ring_fill: false,
            persistent_max_rows: 1,
            persistent_max_rows_bf16: 1,
            persistent_rows_max_keys: 0,
            persistent_rows_max_keys_bf16: 0,
            fold_layernorms: true,
        },
    ] {
        eng.set_decode_tuning(tuning);
        let logits = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
        assert!(
            same_bits(&logits, &chain_logits),
            "{}: {tuning:?} changed the logits",
            what("chain")
        );
    }
    // The GEMVs without tensor cores (bf16 at two rows and more takes them
    // by default): the same products in another summation order.
    eng.set_decode_tuning(DecodeTuning {
        persistent: false,
        tensor_cores: false,
        ..DecodeTuning::default()
    });
    let simt_logits = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
    check(
        &what("chain without tensor cores vs chain"),
        &simt_logits.concat(),
        &chain_logits.concat(),
        paths_tol,
        0.0,
    );
    // The persistent step (where it serves this batch: up to 8 rows on the
    // sm_90a module, two and more on tensor cores) against the chain, graph
    // and eager: the same math in other summation orders.
    eng.set_decode_tuning(persistent_everywhere(DecodeTuning::default()));
    let persistent = eng.decode_step_is_persistent(b, t);
    assert_eq!(
        persistent,
        eng.gpu().has_wgmma() && b <= DECODE_STEP_MAX_ROWS as usize,
        "the persistent step serves up to {DECODE_STEP_MAX_ROWS} rows on the sm_90a module"
    );
    let mut persistent_logits = None;
    if persistent {
        let logits = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
        let eager = forced_path(&mut eng, DecodePath::Eager, &prompt, b, t, &graph_ids);
        check(
            &what("persistent graph vs eager"),
            &logits.concat(),
            &eager.concat(),
            GRAPH_TOL,
            0.0,
        );
        check(
            &what("persistent step vs fused chain"),
            &logits.concat(),
            &chain_logits.concat(),
            paths_tol,
            0.0,
        );
        // Another ring: other tile boundaries, so other summation orders
        // (the default fills shared memory with 2 or 3 slots, except for
        // f32 at one row; these take slots of a block's widest share).
        for slots in [2, 3, 4] {
            eng.set_decode_tuning(persistent_everywhere(DecodeTuning {
                step_ring_slots: slots,
                ..DecodeTuning::default()
            }));
            if eng.decode_step_is_persistent(b, t) {
                let ring = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
                check(
                    &what(&format!("persistent step, {slots} ring slots, vs the default ring")),
                    &ring.concat(),
                    &logits.concat(),
                    paths_tol,
                    0.0,
                );
            }
        }
        // One row of bf16 weights with the layernorms not folded
        // (`decode_step_fold`): the row normalised in the step, as the
        // library runs it without folds (f32 weights always do).
        if b == 1 && bf16 {
            eng.set_decode_tuning(persistent_everywhere(DecodeTuning {
                fold_layernorms: false,
                ..DecodeTuning::default()
            }));
            let unfolded = forced_path(&mut eng, DecodePath::Graph, &prompt, b, t, &graph_ids);
            check(
                &what("persistent step, layernorms not folded, vs folded"),
                &unfolded.concat(),
                &logits.concat(),
                paths_tol,
                0.0,
            );
        }
        if b > 1 && steps > 1 {
            switch_to_chain(
                &mut eng,
                &prompt,
                (b, t, steps, window),
                &graph_ids,
                &chain_logits,
                paths_tol,
                &what,
            );
        }
        eng.set_decode_tuning(DecodeTuning::default());
        persistent_logits = Some(logits);
    }
    // The traced kernel (a diagnostic) computes the same bits, and its
    // trace reads as a whole step.
    if persistent {
        eng.set_decode_tuning(persistent_everywhere(DecodeTuning {
            trace: true,
            ..DecodeTuning::default()
        }));
        let traced = forced_path(&mut eng, DecodePath::Eager, &prompt, b, t, &graph_ids);
        let words = eng.decode_step_trace().unwrap().expect("a traced step ran");
        eng.set_decode_tuning(persistent_everywhere(DecodeTuning::default()));
        let eager = forced_path(&mut eng, DecodePath::Eager, &prompt, b, t, &graph_ids);
        assert!(
            same_bits(&traced, &eager),
            "{}: the traced step changed the logits",
            what("persistent")
        );
        let phases = phase_times(&words, eng.gpu().sm_count(), cfg.num_layers).expect("a whole trace");
        assert!(
            phases.iter().all(|p| p.period > 0.0 && p.work_max >= p.work_med),
            "{}: {phases:?}",
            what("trace")
        );
    }
    eng.set_decode_tuning(DecodeTuning::default());
    // The per-op kernels, fed the graph's tokens.
    eng.set_decode_path(DecodePath::Unfused, false);
    let mut cpu = if bf16 {
        CpuModel::new_bf16(&w, b, t + steps + 1).unwrap()
    } else {
        CpuModel::new(&w, b, t + steps + 1).unwrap()
    };
    cpu.set_attention_window(window);
    eng.forward(&prompt, b, t, 0, LogitsWanted::Last).unwrap();
    cpu.forward(&prompt, b, t, 0, LogitsWanted::Last).unwrap();
    let (mut unfused, mut on_cpu) = (vec![eng.logits().unwrap()], vec![cpu.logits().unwrap()]);
    for (s, ids) in graph_ids.iter().take(steps).enumerate() {
        assert_eq!(eng.decode_path_in_use(b), DecodePath::Unfused);
        eng.forward(ids, b, 1, t + s, LogitsWanted::Last).unwrap();
        cpu.forward(ids, b, 1, t + s, LogitsWanted::Last).unwrap();
        unfused.push(eng.logits().unwrap());
        on_cpu.push(cpu.logits().unwrap());
    }
    check(
        &what("graph vs per-op kernels"),
        &graph_logits.concat(),
        &unfused.concat(),
        paths_tol,
        0.0,
    );
    check(
        &what("graph vs CPU"),
        &graph_logits.concat(),
        &on_cpu.concat(),
        cpu_tol,
        0.0,
    );
    if let Some(logits) = persistent_logits {
        check(
            &what("persistent step vs CPU"),
            &logits.concat(),
            &on_cpu.concat(),
            cpu_tol,
            0.0,
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_equals_eager_and_cpu() {
    paths_agree(&head64_config(), 3, 5, 40, 0);
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_windowed() {
    // Window 9 < the 20 positions reached, and chunk boundaries crossed.
    paths_agree(&head64_config(), 2, 7, 13, 9);
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_eight_rows_and_long_cache() {
    // 8 rows (the fused kernels' limit), past two 64-key chunks.
    paths_agree(&head64_config(), 8, 70, 80, 0);
}

/// The one-row step's layernorm folds (`decode_step_fold`, in the sm_90a
/// module with the step) against their CPU twin over the weights' stored
/// values: f32 and bf16 weights, with and without a bias, odd column counts.
#[test]
#[ignore = "needs a GPU"]
fn decode_step_fold_matches_cpu() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    for &(oc, c, with_bias) in &[(2304, 768, true), (37, 64, false), (9, 1024, true)] {
        let (w, ln_w, ln_b, lin_b) = (
            random_vec(oc * c, 0.1),
            random_vec(c, 1.0),
            random_vec(c, 1.0),
            random_vec(oc, 1.0),
        );
        let (dln_w, dln_b, dlin_b) = (
            gpu.upload(&ln_w).unwrap(),
            gpu.upload(&ln_b).unwrap(),
            gpu.upload(&lin_b).unwrap(),
        );
        let w16: Vec<half::bf16> = w.iter().map(|&x| half::bf16::from_f32(x)).collect();
        let (dw, dw16) = (gpu.upload(&w).unwrap(), gpu.upload(&w16).unwrap());
        // c products of at most 1 * 0.1 each, summed in another order.
        let atol = 4.0 * f32::EPSILON * c as f32 * 0.1;
        for bf16 in [false, true] {
            let stored: Vec<f32> = if bf16 {
                w16.iter().map(|x| x.to_f32()).collect()
            } else {
                w.clone()
            };
            let mut want = vec![0f32; 2 * oc];
            cpu::decode_step_fold(
                &mut want,
                (&ln_w, &ln_b),
                &stored,
                with_bias.then_some(&lin_b[..]),
                oc,
                c,
            );
            let mut out = poisoned(&gpu, 2 * oc);
            let weight = if bf16 {
                WeightRef::Bf16(&dw16)
            } else {
                WeightRef::F32(&dw)
            };
            decode_step_fold(
                &gpu,
                &mut out,
                (&dln_w, &dln_b),
                weight,
                with_bias.then_some(&dlin_b),
                oc,
                c,
            )
            .unwrap();
            check(
                &format!("decode_step_fold oc={oc} c={c} bias={with_bias} bf16={bf16}"),
                &down(&gpu, &out),
                &want,
                atol,
                0.0,
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn decode_persistent_one_row() {
    // One row: the persistent step on the sm_90a module. Past one 128-key
    // attention item (the blocks' partials merged across the grid) and
    // the chain's 64-key chunks; then windowed, within one item and over two.
    paths_agree(&head64_config(), 1, 120, 30, 0);
    paths_agree(&head64_config(), 1, 7, 13, 9);
    paths_agree(&head64_config(), 1, 140, 12, 130);
    // bf16: the GEMV phases' rows pass flagged, not through grid barriers.
    paths_agree_in(&head64_config(), 1, 20, 12, 0, Precision::Bf16);
    paths_agree_in(&head64_config(), 1, 140, 12, 130, Precision::Bf16);
    // bf16 past 4 items of 128 keys: attproj's staging polls the flagged
    // partials 4 at a time, so the fifth takes a second batch.
    let long = ModelConfig {
        max_seq_len: 700,
        ..head64_config()
    };
    paths_agree_in(&long, 1, 600, 6, 0, Precision::Bf16);
}

/// The persistent step at its smallest (a few steps of a 2-layer model):
/// the size compute-sanitizer's racecheck can finish. FP32 (grid barriers
/// between phases) and bf16 (flagged rows).
#[test]
#[ignore = "needs a GPU"]
fn decode_persistent_small() {
    paths_agree(&head64_config(), 1, 3, 2, 0);
    paths_agree_in(&head64_config(), 1, 3, 2, 0, Precision::Bf16);
}

/// The GEMVs of two rows and more at their smallest, FP32 (the chain's
/// 3xTF32 tensor-core kernels; the persistent step's FMA tiles, at 3 rows
/// and at all 8, whose loop reads every staged row unpredicated) and bf16
/// (tensor cores): the size compute-sanitizer's racecheck can finish.
#[test]
#[ignore = "needs a GPU"]
fn decode_mma_small() {
    paths_agree(&head64_config(), 3, 3, 2, 0);
    paths_agree(&head64_config(), 8, 3, 2, 0);
    paths_agree_in(&head64_config(), 3, 3, 2, 0, Precision::Bf16);
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_124m() {
    paths_agree(&ModelConfig::GPT2_124M, 1, 16, 24, 0);
    // Eight rows: the persistent step (FMA tiles for f32 weights) on
    // GPT-2's own shapes, against the chain and the CPU.
    paths_agree(&ModelConfig::GPT2_124M, 8, 16, 8, 0);
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_bf16() {
    // bf16 weights: every row-count kernel (3 rows: the 4-row one; 8 rows).
    paths_agree_in(&head64_config(), 3, 5, 40, 0, Precision::Bf16);
    paths_agree_in(&head64_config(), 8, 70, 20, 9, Precision::Bf16);
}

#[test]
#[ignore = "needs a GPU"]
fn decode_graph_124m_bf16() {
    paths_agree_in(&ModelConfig::GPT2_124M, 1, 16, 24, 0, Precision::Bf16);
    // Eight rows: the tensor-core GEMV on GPT-2's own shapes (c = 768 and
    // 3072, the 50304-column LM head with its greedy end).
    paths_agree_in(&ModelConfig::GPT2_124M, 8, 16, 8, 0, Precision::Bf16);
}

/// An engine built for more rows than the fused kernels serve decodes the
/// larger batches on the per-op kernels and the smaller ones fused.
#[test]
#[ignore = "needs a GPU"]
fn decode_past_the_row_limit_falls_back() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = head64_config();
    let ck = checkpoint(&cfg, crate::seed::rng().random());
    let w = ck.weights().unwrap();
    let mut eng = GpuEngine::new(gpu, &w, 9, 32, Precision::Fp32).unwrap();
    assert_eq!(eng.decode_path_in_use(9), DecodePath::Unfused);
    assert_eq!(eng.decode_path_in_use(8), DecodePath::Graph);
    let prompt: Vec<u32> = (0..9 * 4).map(|i| (i * 37 % cfg.vocab_size) as u32).collect();
    let (logits9, _) = run_path(&mut eng, DecodePath::Unfused, false, &prompt, 9, 4, 3);
    // Row 0 of the batch of 9 equals the same row decoded alone, fused.
    let (logits1, _) = run_path(&mut eng, DecodePath::Graph, true, &prompt[..4], 1, 4, 3);
    let vp = cfg.padded_vocab_size;
    let row0 = |l: &Vec<Vec<f32>>| l.iter().flat_map(|s| s[..vp].to_vec()).collect::<Vec<f32>>();
    check(
        "row 0 of 9 (per-op) vs alone (fused)",
        &row0(&logits9),
        &row0(&logits1),
        PATHS_TOL,
        0.0,
    );
}

/// A static batch past the fused kernels' rows, with the fused path on,
/// steps through the per-row graph (the server's step: one CUDA graph per
/// 8-row bucket, idle rows padding it) and agrees with the prefill kernels
/// launched one by one; at 10 rows of 12 the bucket is padded with idle rows.
#[test]
#[ignore = "needs a GPU"]
fn decode_past_the_row_limit_takes_the_per_row_graph() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = head64_config();
    let ck = checkpoint(&cfg, crate::seed::rng().random());
    let w = ck.weights().unwrap();
    let mut eng = GpuEngine::new(gpu, &w, 12, 32, Precision::Fp32).unwrap();
    for b in [12usize, 10] {
        let prompt: Vec<u32> = (0..b * 4).map(|i| (i * 37 % cfg.vocab_size) as u32).collect();
        let (want, ids) = run_path(&mut eng, DecodePath::Unfused, false, &prompt, b, 4, 4);
        let got = forced_path(&mut eng, DecodePath::Graph, &prompt, b, 4, &ids);
        assert_eq!(eng.decode_path_in_use(b), DecodePath::Unfused, "past the fused rows");
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            check(
                &format!("{b} rows, step {s}: per-row graph vs per-op"),
                g,
                w,
                PATHS_TOL,
                0.0,
            );
        }
    }
}

/// Decode attention with every row at its own position (the state a
/// scheduler batching requests of different ages would hand it), against a
/// plain softmax attention on the CPU; unwritten output is NaN-poisoned. The
/// last row is idle (at `max_t`: a free slot of a server's batch): its
/// output stays untouched. Mapped: rows read the cache rows `cache_row`
/// names (two rows share one, as a prefill's tokens do), and the last row
/// is idle by a cache row past the cache instead. Over f32 caches and
/// bf16 ones (the reference reads the same bf16 values, widened).
#[test]
#[ignore = "needs a GPU"]
fn decode_attention_rows_at_different_positions() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    decode_attention_rows_in::<f32>(&gpu);
    decode_attention_rows_in::<half::bf16>(&gpu);
}

/// [`decode_attention_rows_at_different_positions`] over caches of `E`.
fn decode_attention_rows_in<E: CacheElem>(gpu: &Gpu) {
    let (n, nh, hs, max_t) = (6usize, 3usize, 64usize, 300usize);
    let c = nh * hs;
    let idle = n - 1;
    for (window, mapped) in [(0usize, false), (70, false), (0, true), (70, true)] {
        let mut pos: Vec<u32> = vec![0, 63, 64, 200, 299, max_t as u32];
        let cache_row: Vec<u32> = if mapped {
            vec![3, 0, 0, 4, 1, n as u32]
        } else {
            (0..n as u32).collect()
        };
        if mapped {
            pos[idle] = 10;
        }
        let dmap = gpu.upload(&cache_row).unwrap();
        let q = random_vec(n * c, 1.0);
        let kept = |x: Vec<f32>| -> Vec<f32> { x.into_iter().map(E::kept).collect() };
        let kc = kept(random_vec(n * nh * max_t * hs, 1.0));
        let vc = kept(random_vec(n * nh * max_t * hs, 1.0));
        let mut ws = DecodeWorkspace::new(gpu, n, nh, max_t).unwrap();
        let mut out = poisoned(gpu, n * c);
        let (dq, dk, dv, dpos) = (
            gpu.upload(&q).unwrap(),
            E::up(gpu, &kc),
            E::up(gpu, &vc),
            gpu.upload(&pos).unwrap(),
        );
        for pdl in [false, true] {
            decode_attention(
                gpu,
                &mut ws,
                DecodeLaunch::new(pdl),
                &mut out,
                &dq,
                KvRows {
                    k_cache: &dk,
                    v_cache: &dv,
                    pos: &dpos,
                    cache_row: mapped.then_some(&dmap),
                },
                DecodeAttentionShape { rows: n, c, nh, window },
            )
            .unwrap();
            let got = down(gpu, &out);
            assert!(
                got[idle * c..].iter().all(|x| x.is_nan()),
                "the idle row's output was written"
            );
            let got = &got[..idle * c];
            let mut want = vec![0f32; idle * c];
            for r in 0..idle {
                let p = pos[r] as usize;
                let lo = if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
                let cr = cache_row[r] as usize;
                for h in 0..nh {
                    let qv = &q[r * c + h * hs..r * c + (h + 1) * hs];
                    let key = |j: usize| &kc[((cr * nh + h) * max_t + j) * hs..][..hs];
                    let val = |j: usize| &vc[((cr * nh + h) * max_t + j) * hs..][..hs];
                    let scores: Vec<f64> = (lo..=p)
                        .map(|j| qv.iter().zip(key(j)).map(|(a, b)| (a * b) as f64).sum::<f64>() / (hs as f64).sqrt())
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hs {
                        let o: f64 = (lo..=p).zip(&e).map(|(j, w)| w * val(j)[d] as f64).sum::<f64>() / z;
                        want[r * c + h * hs + d] = o as f32;
                    }
                }
            }
            check(
                &format!(
                    "decode attention, {} cache, window {window}, mapped {mapped}, pdl {pdl}",
                    std::any::type_name::<E>()
                ),
                got,
                &want,
                1e-5,
                0.0,
            );
        }
    }
}

/// Sampling settings that leave real randomness in a random model's logits.
fn sampled_row(seed: u64) -> SampleRow {
    Sampler::new(SamplingParams {
        temperature: 0.9,
        top_k: 50,
        top_p: 0.95,
        seed: Some(seed),
    })
    .unwrap()
    .row()
}

/// The fused step that ends by sampling (graph and eager): every step's
/// ids equal the CPU twin of the sampler applied to the same step's logits
/// with the position as the draw counter, the device feeds them to the
/// next step, and `argmax()` still gives the argmax.
#[test]
#[ignore = "needs a GPU"]
fn decode_graph_samples_like_the_cpu_twin() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = head64_config();
    let seed: u64 = crate::seed::rng().random();
    eprintln!("sampled decode: seed {seed}");
    let ck = checkpoint(&cfg, seed);
    let w = ck.weights().unwrap();
    let (b, t, steps) = (3, 4, 24);
    let mut eng = GpuEngine::new(gpu, &w, b, t + steps + 2, Precision::Fp32).unwrap();
    let mut rng = crate::seed::rng();
    let prompt: Vec<u32> = (0..b * t).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect();
    let rows: Vec<SampleRow> = (0..b as u64).map(|r| sampled_row(seed ^ r)).collect();
    for (path, pdl) in [(DecodePath::Graph, true), (DecodePath::Eager, false)] {
        eng.set_decode_path(path, pdl);
        eng.prepare_sampling(Some(&rows)).unwrap();
        eng.forward(&prompt, b, t, 0, LogitsWanted::Last).unwrap();
        let mut ids = eng.sample(&rows, t).unwrap();
        let mut differs_from_argmax = false;
        for s in 0..steps {
            let pos = t + s;
            eng.forward(&ids, b, 1, pos, LogitsWanted::Last).unwrap();
            let logits = eng.logits().unwrap();
            ids = eng.sample(&rows, pos + 1).unwrap();
            let mut twin = vec![0u32; b];
            host::cpu::sample::sample_forward(
                &mut twin,
                &logits,
                &rows,
                Some(&vec![(pos + 1) as u32; b]),
                None,
                SampleShape {
                    n: b,
                    v: cfg.vocab_size,
                    row_stride: cfg.padded_vocab_size,
                },
            );
            assert_eq!(
                ids, twin,
                "{path:?} step {s}: the device's sample differs from the twin's"
            );
            let argmax = eng.argmax().unwrap();
            let want: Vec<u32> = (0..b)
                .map(|r| {
                    let row = &logits[r * cfg.padded_vocab_size..][..cfg.vocab_size];
                    host::cpu::sample::argmax(row)
                })
                .collect();
            assert_eq!(argmax, want, "{path:?} step {s}: argmax after a sampled step");
            differs_from_argmax |= argmax != ids;
        }
        assert!(
            differs_from_argmax,
            "{path:?}: {steps} sampled steps never left the argmax"
        );
        eng.prepare_sampling(None).unwrap();
    }
}

/// A backend that hides `choose_and_step`, so `generate` runs unpipelined
/// on the same engine and kernels.
struct Unpipelined<'a>(&'a mut GpuEngine);

impl Backend for Unpipelined<'_> {
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn max_seq_len(&self) -> usize {
        self.0.max_seq_len()
    }
    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> anyhow::Result<()> {
        self.0.forward(tokens, b, t, pos0, want)
    }
    fn logits(&mut self) -> anyhow::Result<Vec<f32>> {
        self.0.logits()
    }
    fn argmax(&mut self) -> anyhow::Result<Vec<u32>> {
        self.0.argmax()
    }
    fn prepare_sampling(&mut self, rows: Option<&[SampleRow]>) -> anyhow::Result<()> {
        self.0.prepare_sampling(rows)
    }
    fn sample(&mut self, rows: &[SampleRow], pos: usize) -> anyhow::Result<Vec<u32>> {
        self.0.sample(rows, pos)
    }
}

/// `generate` pipelined (the device runs step k+1 while the host reads
/// step k) gives the same tokens as unpipelined, greedy and sampled, with
/// prompts of different lengths (teacher forcing first) and rows that stop
/// early; and it stops at the context limit as the unpipelined loop does.
#[test]
#[ignore = "needs a GPU"]
fn pipelined_generation_equals_unpipelined() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let cfg = head64_config();
    let seed: u64 = crate::seed::rng().random();
    eprintln!("pipelined generation: seed {seed}");
    let ck = checkpoint(&cfg, seed);
    let w = ck.weights().unwrap();
    let max_t = 48;
    let mut eng = GpuEngine::new(gpu, &w, 3, max_t, Precision::Fp32).unwrap();
    let mut rng = crate::seed::rng();
    let mut prompt = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..cfg.vocab_size as u32)).collect() };
    let prompts = vec![prompt(5), prompt(9), prompt(6)];
    for temperature in [0.0, 0.9] {
        for max_new in [1, 7, 30, 100] {
            let params = SamplingParams {
                temperature,
                top_k: 50,
                top_p: 0.95,
                seed: Some(seed),
            };
            let run = |backend: &mut dyn Backend| {
                let mut streamed = Vec::new();
                let g = generate(
                    backend,
                    &prompts,
                    max_new,
                    &mut Sampler::new(params).unwrap(),
                    |r, id| streamed.push((r, id)),
                )
                .unwrap();
                (g.tokens, g.stop, g.positions, streamed)
            };
            let piped = run(&mut eng);
            let plain = run(&mut Unpipelined(&mut eng));
            assert_eq!(
                piped, plain,
                "T={temperature} max_new={max_new}: pipelined generation differs"
            );
            if max_new == 100 {
                assert!(piped.1.contains(&StopReason::ContextLimit), "{:?}", piped.1);
            }
        }
    }
}
