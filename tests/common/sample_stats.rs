//! Shared by the sampling tests of both test binaries (`tests/cpu/sample_twin.rs`
//! and `tests/gpu/sampling.rs`, which include this file by path): the exact
//! distribution of the CPU sampler's rule in f64, Pearson's chi-square test,
//! and replayable random seeds.

#![allow(dead_code)]

use gpu_kernels::params::sample::SampleRow;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Environment variable that fixes the seed of the randomized tests
/// (`crate::seed`, shared by every test of both binaries).
pub const SEED_ENV: &str = crate::seed::SEED_ENV;

/// A chi-square test fails below this p-value. With a few dozen tests per
/// run, a correct sampler fails one about once in 10^4 runs.
pub const P_FAIL: f64 = 1e-6;

/// Cells expected to hold fewer draws than this are pooled (the chi-square
/// approximation needs a handful per cell).
const MIN_EXPECTED: f64 = 5.0;

/// Top-p cuts whose exact prefix mass lies within this of `top_p` are too
/// close to call: the fixed-point rule may round to the other side (its
/// relative error is about 1e-5 at most; see `params::sample`).
pub const TOP_P_MARGIN: f64 = 1e-4;

/// The seed of a randomized test: `$GPT2_TEST_SEED` if set, else a fresh one.
/// Printed, so a failing run shows how to replay it.
pub fn test_seed(test: &str) -> u64 {
    let seed = crate::seed::seed_from_env_or_fresh();
    println!("{test}: seed {seed} (replay with {SEED_ENV}={seed})");
    seed
}

/// A generator for a test's inputs, from [`test_seed`].
pub fn test_rng(test: &str) -> StdRng {
    StdRng::seed_from_u64(test_seed(test))
}

/// `v` logits spread like a language model's: normal with standard
/// deviation `sd` (Box-Muller), so softmax puts most mass on a few dozen
/// tokens at `sd` around 2-3.
pub fn random_logits(rng: &mut StdRng, v: usize, sd: f32) -> Vec<f32> {
    (0..v)
        .map(|_| {
            let (u1, u2): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
            sd * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
        })
        .collect()
}

/// Device/twin settings of one row.
pub fn row(temperature: f32, top_k: u32, top_p: f32, seed: u64) -> SampleRow {
    SampleRow {
        temperature,
        top_k,
        top_p,
        _pad: 0,
        seed,
    }
}

/// The probabilities of each token under `host::sample::Sampler`'s rule in
/// exact (f64) arithmetic: softmax of `logits / T` over the `top_k` most
/// likely (order: logit descending, id ascending; NaN left out), then the
/// shortest prefix whose probability reaches `top_p`, renormalised. `None`
/// when the top-p cut lies within [`TOP_P_MARGIN`] of a token boundary.
pub fn exact_probs(logits: &[f32], temperature: f64, top_k: usize, top_p: f64) -> Option<Vec<f64>> {
    let mut cand: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    cand.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if top_k > 0 && top_k < cand.len() {
        cand.truncate(top_k);
    }
    let max = logits[cand[0]] as f64;
    let z: Vec<f64> = cand
        .iter()
        .map(|&i| {
            let l = logits[i] as f64;
            if l == max { 1.0 } else { ((l - max) / temperature).exp() }
        })
        .collect();
    let total: f64 = z.iter().sum();
    let mut keep = cand.len();
    if top_p < 1.0 {
        let mut mass = 0.0;
        for (i, p) in z.iter().enumerate() {
            let before = mass;
            mass += p / total;
            if mass >= top_p {
                if top_p - before < TOP_P_MARGIN || mass - top_p < TOP_P_MARGIN {
                    return None;
                }
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = z[..keep].iter().sum();
    let mut probs = vec![0.0; logits.len()];
    for (k, &i) in cand[..keep].iter().enumerate() {
        probs[i] = z[k] / kept;
    }
    Some(probs)
}

/// Result of a chi-square goodness-of-fit test.
#[derive(Debug, Clone, Copy)]
pub struct ChiSquare {
    pub statistic: f64,
    pub dof: usize,
    pub p_value: f64,
    /// Draws of tokens whose probability is 0 (any makes the p-value 0).
    pub impossible: u64,
}

/// Pearson's chi-square of `counts` (draws per token) against `probs`.
/// Cells expected below [`MIN_EXPECTED`] draws are pooled into one; tokens
/// of probability 0 must never be drawn.
pub fn chi_square(counts: &[u64], probs: &[f64]) -> ChiSquare {
    assert_eq!(counts.len(), probs.len());
    let n: u64 = counts.iter().sum();
    let impossible: u64 = counts
        .iter()
        .zip(probs)
        .filter(|&(_, &p)| p == 0.0)
        .map(|(&c, _)| c)
        .sum();
    // (observed, expected) per cell, small cells pooled.
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pool = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if p == 0.0 {
            continue;
        }
        if e < MIN_EXPECTED {
            pool = (pool.0 + c as f64, pool.1 + e);
        } else {
            cells.push((c as f64, e));
        }
    }
    if pool.1 >= MIN_EXPECTED || cells.is_empty() {
        cells.push(pool);
    } else if pool.1 > 0.0 {
        // Too small on its own: merge into the smallest regular cell.
        let smallest = (0..cells.len())
            .min_by(|&a, &b| cells[a].1.total_cmp(&cells[b].1))
            .unwrap();
        cells[smallest].0 += pool.0;
        cells[smallest].1 += pool.1;
    }
    let statistic: f64 = cells
        .iter()
        .filter(|c| c.1 > 0.0)
        .map(|&(o, e)| (o - e) * (o - e) / e)
        .sum();
    let dof = cells.len().saturating_sub(1);
    let p_value = if impossible > 0 {
        0.0
    } else if dof == 0 {
        1.0
    } else {
        chi_square_sf(statistic, dof as f64)
    };
    ChiSquare {
        statistic,
        dof,
        p_value,
        impossible,
    }
}

/// Upper tail `P(X > x)` of a chi-square distribution with `k` degrees of
/// freedom: the regularised upper incomplete gamma `Q(k/2, x/2)`.
pub fn chi_square_sf(x: f64, k: f64) -> f64 {
    gamma_q(k / 2.0, x / 2.0)
}

/// `Q(a, x)`: series for `x < a + 1`, Lentz's continued fraction beyond
/// (Numerical Recipes, 6.2), to about 1e-14.
fn gamma_q(a: f64, x: f64) -> f64 {
    const ITERATIONS: usize = 10_000;
    const EPS: f64 = 1e-15;
    const TINY: f64 = 1e-300;
    if x <= 0.0 {
        return 1.0;
    }
    let log_prefix = a * x.ln() - x - ln_gamma(a);
    if x < a + 1.0 {
        let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
        for _ in 0..ITERATIONS {
            ap += 1.0;
            term *= x / ap;
            sum += term;
            if term.abs() < sum.abs() * EPS {
                break;
            }
        }
        1.0 - sum * log_prefix.exp()
    } else {
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / TINY;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..ITERATIONS {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < TINY {
                d = TINY;
            }
            c = b + an / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            let step = d * c;
            h *= step;
            if (step - 1.0).abs() < EPS {
                break;
            }
        }
        h * log_prefix.exp()
    }
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms: about 1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEF: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 - x) = π / sin(π x).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut s = COEF[0];
    for (i, &c) in COEF.iter().enumerate().skip(1) {
        s += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}

/// Draws per token of `ids` over a vocabulary of `v`.
pub fn histogram(ids: &[u32], v: usize) -> Vec<u64> {
    let mut counts = vec![0u64; v];
    for &i in ids {
        counts[i as usize] += 1;
    }
    counts
}

/// Asserts that `ids` (draws from one distribution) fit `probs`, printing
/// the test's numbers either way.
pub fn assert_fits(what: &str, ids: &[u32], probs: &[f64]) {
    let c = chi_square(&histogram(ids, probs.len()), probs);
    println!(
        "{what}: {} draws, chi2 {:.1} on {} dof, p = {:.3e}, impossible draws {}",
        ids.len(),
        c.statistic,
        c.dof,
        c.p_value,
        c.impossible
    );
    assert!(
        c.p_value >= P_FAIL,
        "{what}: draws do not fit the exact distribution (chi2 {:.1} on {} dof, p = {:.3e} < {P_FAIL:e}; {} draws of impossible tokens)",
        c.statistic,
        c.dof,
        c.p_value,
        c.impossible
    );
}
