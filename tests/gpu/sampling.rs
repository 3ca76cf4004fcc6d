//! The sampling kernels (`gpu::ops::sample::sample_forward`: one block a
//! row, and where the sm_90a module is loaded the cluster kernel, eight
//! blocks a row) against their CPU twin (`cpu::sample::sample_forward`),
//! token for token — they apply the same integer rule, so no mismatch is
//! allowed — and their draws against the exact distribution of the CPU
//! `Sampler`'s rule (chi-square). Outputs are poisoned with `0xffff_ffff`
//! (no valid id) before each launch.

#[path = "../common/sample_stats.rs"]
mod sample_stats;

use cudarc::driver::CudaSlice;
use gpu_kernels::params::sample::{SAMPLE_BLOCK, SampleRow};
use host::gpu::Gpu;
use host::gpu::ops::sample::{DeviceSampleRow, Draws, SampleKernel, sample_forward, sample_forward_with};
use host::gpu::shape::SampleShape;
use rand::Rng;
use rand::rngs::StdRng;
use sample_stats::{assert_fits, exact_probs, random_logits, row, test_rng};

use crate::kernels::skip;

/// What no kernel ever writes as an id (`v <= 2^31`).
const POISON: u32 = u32::MAX;
/// GPT-2's vocabulary and its padded row length.
const GPT2_V: usize = 50257;
const GPT2_VP: usize = 50304;

/// One launch's inputs (host side).
struct Batch<'a> {
    logits: &'a [f32],
    rows: &'a [SampleRow],
    counter: Option<&'a [u32]>,
    n: usize,
    v: usize,
    stride: usize,
}

impl Batch<'_> {
    /// The kernel's ids, from a poisoned output; with `next` also checks that
    /// `next_tokens` receives the same ids.
    fn gpu(&self, gpu: &Gpu, kernel: SampleKernel, next: bool) -> Vec<u32> {
        let dl = gpu.upload(self.logits).unwrap();
        let dev_rows: Vec<DeviceSampleRow> = self.rows.iter().map(|&r| DeviceSampleRow(r)).collect();
        let dr = gpu.upload(&dev_rows).unwrap();
        let dc = self.counter.map(|c| gpu.upload(c).unwrap());
        let mut out = gpu.upload(&vec![POISON; self.n]).unwrap();
        let mut dn: Option<CudaSlice<u32>> = next.then(|| gpu.upload(&vec![POISON; self.n]).unwrap());
        sample_forward_with(
            gpu,
            kernel,
            &mut out,
            &dl,
            &dr,
            Draws {
                counter: dc.as_ref(),
                streams: None,
            },
            dn.as_mut(),
            SampleShape {
                n: self.n,
                v: self.v,
                row_stride: self.stride,
            },
        )
        .unwrap();
        let ids = gpu.download(&out).unwrap();
        assert!(!ids.contains(&POISON), "a row's id was never written");
        assert!(ids.iter().all(|&i| (i as usize) < self.v), "an id beyond v");
        if let Some(dn) = dn {
            assert_eq!(gpu.download(&dn).unwrap(), ids, "next_tokens differs from out");
        }
        ids
    }

    /// The CPU twin's ids.
    fn twin(&self) -> Vec<u32> {
        let mut out = vec![POISON; self.n];
        host::cpu::sample::sample_forward(
            &mut out,
            self.logits,
            self.rows,
            self.counter,
            None,
            SampleShape {
                n: self.n,
                v: self.v,
                row_stride: self.stride,
            },
        );
        out
    }

    /// Every kernel of this GPU and the twin agree on every row; returns
    /// those ids.
    fn check(&self, gpu: &Gpu, what: &str) -> Vec<u32> {
        let want = self.twin();
        for kernel in kernels(gpu) {
            let got = self.gpu(gpu, kernel, true);
            let bad: Vec<usize> = (0..self.n).filter(|&i| got[i] != want[i]).collect();
            println!("{what} ({kernel:?}): {} rows, {} mismatches", self.n, bad.len());
            if let Some(&i) = bad.first() {
                panic!(
                    "{what} ({kernel:?}): row {i} ({:?}, counter {:?}): GPU {} twin {} ({} rows differ)",
                    self.rows[i],
                    self.counter.map(|c| c[i]),
                    got[i],
                    want[i],
                    bad.len()
                );
            }
        }
        want
    }
}

/// The kernels this GPU runs: one block a row everywhere, the cluster kernel
/// where the sm_90a module is loaded.
fn kernels(gpu: &Gpu) -> Vec<SampleKernel> {
    let mut k = vec![SampleKernel::PerRow];
    if gpu.has_wgmma() {
        k.push(SampleKernel::Cluster);
    }
    k
}

/// A row of logits in one of several styles: GPT-2-like (normal, shifted
/// far negative), spread out, peaked, or quantised (many exact ties).
fn styled_logits(rng: &mut StdRng, v: usize) -> Vec<f32> {
    match rng.random_range(0..5) {
        0 => random_logits(rng, v, 3.0).into_iter().map(|l| l - 80.0).collect(),
        1 => random_logits(rng, v, 10.0),
        2 => {
            let mut l = random_logits(rng, v, 1.0);
            let hot = rng.random_range(0..v);
            l[hot] += 12.0;
            l
        }
        3 => random_logits(rng, v, 2.0)
            .into_iter()
            .map(|l| (l * 2.0).round() / 2.0)
            .collect(),
        _ => random_logits(rng, v, 2.0),
    }
}

/// Settings drawn from the values the engine and the tests care about.
fn random_row(rng: &mut StdRng, v: usize) -> SampleRow {
    const TEMPERATURES: [f32; 7] = [0.0, 0.5, 0.8, 1.0, 1.5, 100.0, 1e-3];
    const TOP_PS: [f32; 7] = [1.0, 0.95, 0.9, 0.5, 0.05, 1e-30, 0.999];
    let top_ks = [0, 1, 2, 5, 40, 1000, v as u32 + 5];
    let pick = |rng: &mut StdRng, n: usize| rng.random_range(0..n);
    row(
        TEMPERATURES[pick(rng, TEMPERATURES.len())],
        top_ks[pick(rng, top_ks.len())],
        TOP_PS[pick(rng, TOP_PS.len())],
        rng.random(),
    )
}

/// `n` rows of `stride` floats: `v` styled logits, then NaN padding (which
/// must never be read).
fn padded_rows(rng: &mut StdRng, n: usize, v: usize, stride: usize) -> Vec<f32> {
    let mut logits = vec![f32::NAN; n * stride];
    for r in 0..n {
        logits[r * stride..r * stride + v].copy_from_slice(&styled_logits(rng, v));
    }
    logits
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_matches_twin_token_for_token() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = test_rng("gpu_matches_twin_token_for_token");
    for &(n, v, stride) in &[
        (48, GPT2_V, GPT2_VP),
        (16, 1000, 1000),
        (7, 513, 600),
        (3, (1 << 20) + 3, (1 << 20) + 3),
    ] {
        let logits = padded_rows(&mut rng, n, v, stride);
        let rows: Vec<SampleRow> = (0..n).map(|_| random_row(&mut rng, v)).collect();
        let mut counter: Vec<u32> = (0..n).map(|_| rng.random()).collect();
        for step in 0..3 {
            let b = Batch {
                logits: &logits,
                rows: &rows,
                counter: Some(&counter),
                n,
                v,
                stride,
            };
            b.check(&gpu, &format!("n={n} v={v} stride={stride} step {step}"));
            counter.iter_mut().for_each(|c| *c = c.wrapping_add(1));
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_draws_follow_the_exact_distribution() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = test_rng("gpu_draws_follow_the_exact_distribution");
    // (v, logit sd, rows = draws, settings)
    let mut cases: Vec<(usize, f32, usize, f32, u32, f32)> = Vec::new();
    for t in [0.5f32, 1.0, 1.5] {
        for k in [0u32, 5, 40] {
            for p in [1.0f32, 0.9, 0.5, 0.05] {
                cases.push((100, 2.0, 40_000, t, k, p));
            }
        }
    }
    // The engine's defaults and plain nucleus sampling over GPT-2's vocabulary.
    cases.push((GPT2_V, 3.0, 20_000, 0.8, 40, 0.95));
    cases.push((GPT2_V, 3.0, 20_000, 1.0, 0, 0.9));
    for (v, sd, n, t, k, p) in cases {
        let (logits, probs) = loop {
            let logits = random_logits(&mut rng, v, sd);
            if let Some(probs) = exact_probs(&logits, t as f64, k as usize, p as f64) {
                break (logits, probs);
            }
        };
        // Every row reads the same logits (stride 0), each with its own
        // counter and row index: n independent draws in one launch.
        let rows = vec![row(t, k, p, rng.random()); n];
        let counter: Vec<u32> = (0..n as u32).collect();
        let b = Batch {
            logits: &logits,
            rows: &rows,
            counter: Some(&counter),
            n,
            v,
            stride: 0,
        };
        for kernel in kernels(&gpu) {
            let ids = b.gpu(&gpu, kernel, false);
            assert_fits(&format!("GPU {kernel:?} v={v} T={t} top_k={k} top_p={p}"), &ids, &probs);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn same_seed_and_counter_give_the_same_ids() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = test_rng("same_seed_and_counter_give_the_same_ids");
    let (n, v) = (64, GPT2_V);
    let logits = random_logits(&mut rng, v, 1.0);
    let rows: Vec<SampleRow> = (0..n).map(|_| row(1.0, 0, 1.0, rng.random())).collect();
    let counter: Vec<u32> = (0..n as u32).map(|i| 1000 + i).collect();
    for kernel in kernels(&gpu) {
        let launch = |rows: &[SampleRow], counter: &[u32]| {
            Batch {
                logits: &logits,
                rows,
                counter: Some(counter),
                n,
                v,
                stride: 0,
            }
            .gpu(&gpu, kernel, false)
        };
        let first = launch(&rows, &counter);
        assert_eq!(launch(&rows, &counter), first, "{kernel:?}: same inputs, other ids");
        let reseeded: Vec<SampleRow> = rows.iter().map(|r| row(1.0, 0, 1.0, r.seed ^ 1)).collect();
        assert_ne!(launch(&reseeded, &counter), first, "{kernel:?}: other seeds, same ids");
        let later: Vec<u32> = counter.iter().map(|c| c + 1).collect();
        assert_ne!(launch(&rows, &later), first, "{kernel:?}: other counters, same ids");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn greedy_and_sampled_rows_mix_in_one_launch() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = test_rng("greedy_and_sampled_rows_mix_in_one_launch");
    let (n, v, stride) = (64, GPT2_V, GPT2_VP);
    let logits = padded_rows(&mut rng, n, v, stride);
    let rows: Vec<SampleRow> = (0..n)
        .map(|i| match i % 4 {
            0 => row(0.0, 40, 0.9, i as u64),
            1 => row(0.8, 40, 0.95, i as u64),
            2 => row(1.2, 1, 1.0, i as u64),
            _ => row(1.0, 0, 0.9, i as u64),
        })
        .collect();
    let counter: Vec<u32> = (0..n as u32).map(|i| 7 * i).collect();
    let b = Batch {
        logits: &logits,
        rows: &rows,
        counter: Some(&counter),
        n,
        v,
        stride,
    };
    let ids = b.check(&gpu, "greedy and sampled rows");
    for i in (0..n).filter(|i| i % 4 == 0 || i % 4 == 2) {
        assert_eq!(
            ids[i],
            host::cpu::forward::argmax(&logits[i * stride..i * stride + v]),
            "greedy row {i}"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn edge_cases_match_the_twin() {
    let Some(gpu) = skip::gpu() else { return };
    let mut rng = test_rng("edge_cases_match_the_twin");
    let settings = [
        row(1.0, 0, 1.0, 11),
        row(0.8, 40, 0.95, 12),
        row(1.0, 3, 1.0, 13),
        row(1.0, 0, 0.5, 14),
        row(1.0, 10, 0.5, 15),
        row(1.0, 0, 1e-30, 16),
        row(1.0, 0, f32::from_bits(1), 17),
        row(1.0, 1_000_000, 1.0, 18),
        row(1e30, 7, 0.9, 19),
        row(1e-30, 0, 0.9, 20),
        row(0.0, 0, 1.0, 21),
    ];
    // Each case: (name, one row of v logits); every setting runs on it.
    let mut cases: Vec<(String, Vec<f32>)> = vec![
        ("v = 1".into(), vec![0.5]),
        ("flat".into(), vec![1.0; 1000]),
        // More tied candidates than the cluster kernel gathers: its other paths.
        ("flat, wide".into(), vec![1.0; 9000]),
        ("all -inf".into(), vec![f32::NEG_INFINITY; 700]),
        ("all NaN".into(), vec![f32::NAN; 700]),
        ("two +inf".into(), {
            let mut l = random_logits(&mut rng, 900, 2.0);
            l[17] = f32::INFINITY;
            l[600] = f32::INFINITY;
            l
        }),
        (
            "huge range".into(),
            (0..2000)
                .map(|i| (if i % 2 == 0 { 1e30 } else { -1e30 }) * (i as f32 / 2000.0))
                .collect(),
        ),
        (
            "signed zeros".into(),
            (0..600).map(|i| if i % 3 == 0 { -0.0 } else { 0.0 }).collect(),
        ),
    ];
    for v in [2, 31, 511, SAMPLE_BLOCK as usize, 513, 1025, 8191, 8193] {
        cases.push((format!("v = {v}"), random_logits(&mut rng, v, 2.0)));
    }
    // Quantised logits: ties at the top-k and top-p boundaries.
    cases.push((
        "four levels".into(),
        (0..3000).map(|_| rng.random_range(0..4) as f32).collect(),
    ));
    // Few candidates (the cluster kernel's gathered list) with the top-k
    // cut inside runs of tied logits: 33 at 5, ~118 at 4, the rest far below.
    cases.push(("ties at the k-th, few candidates".into(), {
        let mut l: Vec<f32> = random_logits(&mut rng, 2000, 1.0).iter().map(|x| x - 10.0).collect();
        for (i, x) in l.iter_mut().enumerate() {
            if i % 61 == 0 {
                *x = 5.0;
            } else if i % 17 == 3 {
                *x = 4.0;
            }
        }
        l
    }));
    cases.push(("with -inf and NaN".into(), {
        let mut l = random_logits(&mut rng, 5000, 2.0);
        for x in l.iter_mut() {
            match rng.random_range(0..10) {
                0 => *x = f32::NEG_INFINITY,
                1 => *x = f32::NAN,
                _ => {}
            }
        }
        l
    }));
    for (name, logits) in &cases {
        let v = logits.len();
        // One row per setting, each padded with +inf and NaN (never read).
        let stride = v + 3;
        let n = settings.len();
        let mut all = Vec::with_capacity(n * stride);
        for _ in 0..n {
            all.extend_from_slice(logits);
            all.extend_from_slice(&[f32::INFINITY, f32::NAN, f32::MAX]);
        }
        let counter: Vec<u32> = (0..n as u32).map(|_| rng.random()).collect();
        let b = Batch {
            logits: &all,
            rows: &settings,
            counter: Some(&counter),
            n,
            v,
            stride,
        };
        let ids = b.check(&gpu, name);
        for (i, &id) in ids.iter().enumerate() {
            let l = logits[id as usize];
            let any_number = logits.iter().any(|x| !x.is_nan());
            assert!(!l.is_nan() || !any_number, "{name}: row {i} chose a NaN logit");
        }
    }
    // Without counters (all 0), and rows that overlap (stride 1).
    let logits = random_logits(&mut rng, 3000, 2.0);
    let rows = vec![row(1.0, 0, 0.9, 5); 8];
    Batch {
        logits: &logits,
        rows: &rows,
        counter: None,
        n: 8,
        v: 2990,
        stride: 1,
    }
    .check(&gpu, "no counters, overlapping rows");
}

#[test]
#[ignore = "needs a GPU"]
fn wrapper_rejects_bad_arguments() {
    let Some(gpu) = skip::gpu() else { return };
    let logits = gpu.upload(&[0f32; 100]).unwrap();
    let rows = gpu.upload(&[DeviceSampleRow(row(1.0, 0, 1.0, 1)); 2]).unwrap();
    let short = gpu.upload(&[0u32]).unwrap();
    let mut out = gpu.upload(&[POISON; 2]).unwrap();
    let mut launch = |counter: Option<&CudaSlice<u32>>, n, v, stride| {
        sample_forward(
            &gpu,
            &mut out,
            &logits,
            &rows,
            counter,
            None::<&mut CudaSlice<u32>>,
            SampleShape {
                n,
                v,
                row_stride: stride,
            },
        )
    };
    assert!(launch(None, 2, 0, 50).is_err(), "empty vocabulary");
    assert!(launch(None, 2, 60, 60).is_err(), "logits too short for 2 rows of 60");
    assert!(launch(None, 3, 10, 10).is_err(), "out and rows hold 2 rows, not 3");
    assert!(launch(Some(&short), 2, 50, 50).is_err(), "counter holds 1 row, not 2");
    assert!(launch(None, 2, 50, 50).is_ok());
    let ids = gpu.download(&out).unwrap();
    assert!(ids.iter().all(|&i| i < 50), "{ids:?}");
    // The cluster kernel: refused without the sm_90a module, and past the
    // grid's y extent (its rows) before any buffer is looked at.
    let rows_over_grid = if gpu.has_wgmma() { 65536 } else { 2 };
    let cluster = sample_forward_with(
        &gpu,
        SampleKernel::Cluster,
        &mut out,
        &logits,
        &rows,
        Draws::<CudaSlice<u32>> {
            counter: None,
            streams: None,
        },
        None::<&mut CudaSlice<u32>>,
        SampleShape {
            n: rows_over_grid,
            v: 1,
            row_stride: 0,
        },
    );
    assert!(cluster.is_err(), "cluster kernel, {rows_over_grid} rows");
}
