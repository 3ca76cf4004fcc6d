//! The CPU twin of the sampling kernel (`host::cpu::sample`) and the rule it
//! shares with the kernel (`gpu_kernels::params::{sample, philox}`): Philox
//! known answers, the fixed-point weights' error bound, the exact top-p
//! target, and the twin's draws against the exact distribution of the CPU
//! `Sampler`'s rule (chi-square). The GPU tests then hold the kernel to the
//! twin token for token.

#[path = "../common/sample_stats.rs"]
mod sample_stats;

use gpu_kernels::params::philox::philox4x32_10;
use gpu_kernels::params::sample::{
    SampleRow, WEIGHT_ONE, draw_target, exp2_fixed, key_logit, logit_key, near_bound, sample_weight, temperature_scale,
    top_p_target,
};
use host::cpu::sample::{argmax, sample_forward, sample_row};
use host::gpu::shape::SampleShape;
use host::sample::{Sampler, SamplingParams};
use rand::Rng;
use sample_stats::{assert_fits, exact_probs, random_logits, row, test_rng};

/// Temperatures, top-k and top-p values the distribution tests cover (top-k
/// 1 is greedy: tested against the argmax instead).
const TEMPERATURES: [f32; 3] = [0.5, 1.0, 1.5];
const TOP_KS: [u32; 3] = [0, 5, 40];
const TOP_PS: [f32; 4] = [1.0, 0.9, 0.5, 0.05];
/// Draws per setting in the twin's chi-square tests.
const DRAWS: u32 = 20_000;

/// Random123's `kat_vectors` for Philox4x32-10: (counter, key, output).
const PHILOX_KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
    ([0; 4], [0; 2], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    (
        [u32::MAX; 4],
        [u32::MAX; 2],
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
    ),
    (
        [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
        [0xa4093822, 0x299f31d0],
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
    ),
];

#[test]
fn philox_matches_random123_known_answers() {
    for (ctr, key, want) in PHILOX_KAT {
        assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:08x?} key {key:08x?}");
    }
}

#[test]
fn chi_square_tail_matches_tables() {
    // Critical values from standard tables: (x, dof, upper tail).
    for (x, k, p) in [
        (3.841, 1.0, 0.05),
        (6.635, 1.0, 0.01),
        (18.307, 10.0, 0.05),
        (124.342, 100.0, 0.05),
        (20.515, 5.0, 0.001),
        // Two degrees of freedom: the tail is exactly exp(-x/2).
        (27.631, 2.0, 1.0e-6),
    ] {
        let got = sample_stats::chi_square_sf(x, k);
        assert!((got - p).abs() < 0.02 * p, "sf({x}, {k}) = {got}, table {p}");
    }
}

#[test]
fn logit_keys_order_like_total_cmp() {
    let mut rng = test_rng("logit_keys_order_like_total_cmp");
    let mut vals = vec![
        f32::NEG_INFINITY,
        -f32::MAX,
        -1.0,
        -f32::MIN_POSITIVE,
        -1e-45,
        -0.0,
        0.0,
        1e-45,
        1.0,
        f32::MAX,
        f32::INFINITY,
    ];
    vals.extend(
        (0..1000)
            .map(|_| f32::from_bits(rng.random::<u32>()))
            .filter(|x| !x.is_nan()),
    );
    for &a in &vals {
        assert_eq!(key_logit(logit_key(a)).to_bits(), a.to_bits());
        for &b in &vals[..11] {
            assert_eq!(logit_key(a).cmp(&logit_key(b)), a.total_cmp(&b), "{a} vs {b}");
        }
    }
    assert_eq!(logit_key(f32::NAN), 0);
    assert!(logit_key(f32::NEG_INFINITY) > 0);
}

/// The bound the rule's docs promise for `exp2_fixed`: within a relative
/// 2^-21 of `2^32 · 2^x`, plus the floor's 1.
#[test]
fn fixed_point_weights_are_within_their_bound() {
    const STEPS: u32 = 1 << 22;
    const REL: f64 = 1.0 / (1u64 << 21) as f64;
    const FLOOR_NEGLIGIBLE: f64 = (1u64 << 30) as f64;
    let mut worst = 0f64;
    for i in 0..=STEPS {
        let x = -32.0 * i as f32 / STEPS as f32;
        let exact = 2f64.powf(32.0 + x as f64);
        let got = exp2_fixed(x) as f64;
        let err = (got - exact).abs() - 1.0;
        assert!(err <= exact * REL, "x = {x}: got {got}, exact {exact}");
        // Where the floor's 1 is negligible: the polynomial's own error.
        if exact >= FLOOR_NEGLIGIBLE {
            worst = worst.max((got - exact).abs() / exact);
        }
    }
    println!("exp2_fixed: worst relative error {worst:.3e} (bound {REL:.3e})");
    assert_eq!(exp2_fixed(0.0), WEIGHT_ONE);
    assert_eq!(exp2_fixed(-0.0), WEIGHT_ONE);
    assert_eq!(exp2_fixed(-1e-30), WEIGHT_ONE);
    assert_eq!(exp2_fixed(-1.0), WEIGHT_ONE / 2);
    assert_eq!(exp2_fixed(-32.0), 1);
    assert_eq!(exp2_fixed(-32.001), 0);
    assert_eq!(exp2_fixed(f32::NEG_INFINITY), 0);
    assert_eq!(exp2_fixed(f32::NAN), 0);
    // The maximum weighs one, also when it is infinite.
    assert_eq!(sample_weight(3.0, 3.0, 1.0), WEIGHT_ONE);
    assert_eq!(sample_weight(f32::INFINITY, f32::INFINITY, 1.0), WEIGHT_ONE);
    assert_eq!(sample_weight(1.0, f32::INFINITY, 1.0), 0);
}

/// `near_bound` leaves out only tokens that weigh nothing, over random
/// maxima and temperatures.
#[test]
fn near_bound_keeps_every_weighted_token() {
    let mut rng = test_rng("near_bound_keeps_every_weighted_token");
    for _ in 0..2000 {
        let m: f32 = rng.random_range(-200.0..200.0);
        let t: f32 = 10f32.powf(rng.random_range(-3.0..3.0));
        let s = temperature_scale(t);
        let b = near_bound(m, s);
        // The floats just below the bound.
        let mut l = b.next_down();
        for _ in 0..4 {
            assert_eq!(sample_weight(l, m, s), 0, "m {m} T {t} bound {b} l {l}");
            l = l.next_down();
        }
    }
}

#[test]
fn top_p_target_is_the_exact_ceiling() {
    let mut rng = test_rng("top_p_target_is_the_exact_ceiling");
    for _ in 0..100_000 {
        // mass < 2^29 and a 24-bit top_p: the product is exact in f64.
        let mass: u64 = rng.random_range(1..1 << 29);
        let top_p: f32 = rng.random_range(0.0..1.0);
        let want = ((top_p as f64 * mass as f64).ceil() as u64).max(1);
        assert_eq!(top_p_target(top_p, mass), want, "top_p {top_p} mass {mass}");
    }
    assert_eq!(top_p_target(0.5, 3), 2);
    assert_eq!(top_p_target(0.0, 1 << 40), 1);
    assert_eq!(top_p_target(-1.0, 1 << 40), 1);
    assert_eq!(top_p_target(1e-45, u64::MAX >> 1), 1);
    assert_eq!(top_p_target(0.5, 1 << 63), 1 << 62);
    let big = (1u64 << 63) - 1;
    let p = 0.999_999_94f32; // the largest f32 below 1
    let want = (p as f64 * big as f64).ceil();
    assert!((top_p_target(p, big) as f64 - want).abs() <= 2048.0);
}

#[test]
fn draw_target_scales_into_range() {
    for mass in [1u64, 2, 3, WEIGHT_ONE, u64::MAX >> 1] {
        assert_eq!(draw_target(0, mass), 0);
        assert_eq!(draw_target(u64::MAX, mass), mass - 1);
        assert_eq!(draw_target(1 << 63, mass), mass / 2);
    }
}

/// `n` draws of one row of logits at counters `0..n` (row index 0).
fn twin_draws(logits: &[f32], cfg: &SampleRow, n: u32) -> Vec<u32> {
    (0..n).map(|c| sample_row(logits, cfg, c, 0)).collect()
}

#[test]
fn twin_draws_follow_the_exact_distribution() {
    let mut rng = test_rng("twin_draws_follow_the_exact_distribution");
    for &(v, sd) in &[(64usize, 1.0f32), (1000, 1.0)] {
        for t in TEMPERATURES {
            for k in TOP_KS {
                for p in TOP_PS {
                    // Redraw logits whose top-p cut is too close to call.
                    let (logits, probs) = loop {
                        let logits = random_logits(&mut rng, v, sd);
                        if let Some(probs) = exact_probs(&logits, t as f64, k as usize, p as f64) {
                            break (logits, probs);
                        }
                    };
                    let cfg = row(t, k, p, rng.random());
                    let ids = twin_draws(&logits, &cfg, DRAWS);
                    assert_fits(&format!("twin v={v} T={t} top_k={k} top_p={p}"), &ids, &probs);
                }
            }
        }
    }
}

#[test]
fn greedy_is_the_argmax() {
    let mut rng = test_rng("greedy_is_the_argmax");
    for _ in 0..50 {
        let mut logits = random_logits(&mut rng, 777, 3.0);
        // A tie for the maximum: the lower id wins.
        let (i, j) = (rng.random_range(0..300), rng.random_range(400..777));
        logits[i] = 40.0;
        logits[j] = 40.0;
        let want = host::cpu::forward::argmax(&logits);
        assert_eq!(want as usize, i);
        for cfg in [
            row(0.0, 0, 1.0, 1),
            row(0.0, 40, 0.9, 2),
            row(1.5, 1, 0.9, 3),
            row(-1.0, 0, 1.0, 4),
        ] {
            for c in 0..4 {
                assert_eq!(sample_row(&logits, &cfg, c, 0), want, "{cfg:?}");
            }
        }
        let mut s = Sampler::new(SamplingParams::GREEDY).unwrap();
        assert_eq!(s.sample(&logits), want);
        // Top-p below the most likely token's probability keeps only it.
        for c in 0..4 {
            assert_eq!(sample_row(&logits, &row(1.0, 0, 1e-6, 5), c, 0), want);
        }
    }
    // NaN never wins; an all-NaN row gives 0.
    assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, f32::NAN, 3.0]), 2);
    assert_eq!(argmax(&[f32::NAN; 4]), 0);
    assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
    assert_eq!(argmax(&[-0.0, 0.0]), 0);
}

#[test]
fn same_seed_same_tokens_other_seed_differs() {
    let mut rng = test_rng("same_seed_same_tokens_other_seed_differs");
    let logits = random_logits(&mut rng, 1000, 1.0);
    let seed: u64 = rng.random();
    let draw = |seed, row_index| -> Vec<u32> {
        (0..64)
            .map(|c| sample_row(&logits, &row(1.0, 0, 1.0, seed), c, row_index))
            .collect()
    };
    assert_eq!(draw(seed, 0), draw(seed, 0));
    assert_ne!(draw(seed, 0), draw(seed.wrapping_add(1), 0));
    // The row index is part of the counter: two rows with one seed differ.
    assert_ne!(draw(seed, 0), draw(seed, 1));
    // Successive counters draw fresh numbers.
    let ids = draw(seed, 0);
    assert!(ids.iter().any(|&i| i != ids[0]));
}

#[test]
fn edge_cases_follow_the_rule() {
    let seed = 7;
    // NaN and -inf logits are never drawn.
    let mut logits = vec![f32::NAN, f32::NEG_INFINITY, 0.0, 0.5, f32::NAN, f32::NEG_INFINITY, 0.25];
    for c in 0..2000 {
        let id = sample_row(&logits, &row(1.0, 0, 1.0, seed), c, 0);
        assert!([2, 3, 6].contains(&id), "drew {id}");
    }
    // Top-k above v keeps everything, like 0.
    for c in 0..100 {
        assert_eq!(
            sample_row(&logits, &row(1.0, 1000, 1.0, seed), c, 0),
            sample_row(&logits, &row(1.0, 0, 1.0, seed), c, 0)
        );
    }
    // Exact ties at the top-k boundary: the lowest ids are kept.
    let flat = vec![1.0f32; 100];
    for c in 0..2000 {
        assert!(sample_row(&flat, &row(1.0, 3, 1.0, seed), c, 0) < 3);
        // Top-p 0.5 of 100 equal tokens: the first 50 ids.
        assert!(sample_row(&flat, &row(1.0, 0, 0.5, seed), c, 0) < 50);
        // Both: top-k 10, then half of their mass: ids 0..5.
        assert!(sample_row(&flat, &row(1.0, 10, 0.5, seed), c, 0) < 5);
    }
    // One token, all -inf, all NaN, +inf among finite logits.
    assert_eq!(sample_row(&[3.0], &row(1.0, 0, 0.9, seed), 5, 0), 0);
    let ids: Vec<u32> = (0..1000)
        .map(|c| sample_row(&[f32::NEG_INFINITY; 4], &row(1.0, 0, 1.0, seed), c, 0))
        .collect();
    assert!((0..4).all(|i| ids.contains(&i)), "all -inf: uniform over the row");
    assert_eq!(sample_row(&[f32::NAN; 4], &row(1.0, 0, 1.0, seed), 0, 0), 0);
    logits = vec![1.0, f32::INFINITY, 2.0, f32::INFINITY];
    for c in 0..200 {
        assert!([1, 3].contains(&sample_row(&logits, &row(1.0, 0, 1.0, seed), c, 0)));
    }
}

#[test]
fn batched_twin_uses_strides_counters_and_next_tokens() {
    let mut rng = test_rng("batched_twin_uses_strides_counters_and_next_tokens");
    let (n, v, stride) = (5, 300, 320);
    let mut logits = random_logits(&mut rng, n * stride, 2.0);
    for r in 0..n {
        // Padding is never read: NaN there changes nothing.
        logits[r * stride + v..(r + 1) * stride].fill(f32::NAN);
    }
    let rows: Vec<SampleRow> = (0..n as u32).map(|r| row(1.0, 40, 0.9, 100 + r as u64)).collect();
    let counter: Vec<u32> = (0..n as u32).map(|r| 17 * r + 3).collect();
    let mut out = vec![u32::MAX; n];
    let mut next = vec![u32::MAX; n];
    sample_forward(
        &mut out,
        &logits,
        &rows,
        Some(&counter[..]),
        Some(&mut next[..]),
        SampleShape {
            n,
            v,
            row_stride: stride,
        },
    );
    assert_eq!(out, next);
    for r in 0..n {
        let want = sample_row(&logits[r * stride..r * stride + v], &rows[r], counter[r], r as u32);
        assert_eq!(out[r], want);
    }
    let mut zero_counter = vec![u32::MAX; n];
    sample_forward(
        &mut zero_counter,
        &logits,
        &rows,
        None,
        None,
        SampleShape {
            n,
            v,
            row_stride: stride,
        },
    );
    for r in 0..n {
        assert_eq!(
            zero_counter[r],
            sample_row(&logits[r * stride..r * stride + v], &rows[r], 0, r as u32)
        );
    }
}

#[test]
fn sample_row_settings_are_checked_like_the_sampler() {
    use host::sample::device_row;
    let p = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: None,
    };
    for bad in [
        p(-0.5, 0, 0.9),
        p(f32::NAN, 0, 0.9),
        p(f32::INFINITY, 0, 0.9),
        p(1.0, 0, 0.0),
        p(1.0, 0, 1.5),
    ] {
        assert!(device_row(&bad, 1).is_err(), "{bad:?}");
        assert!(Sampler::new(bad).is_err(), "{bad:?}");
    }
    let r = device_row(&p(0.8, 40, 0.95), 99).unwrap();
    assert_eq!(r, row(0.8, 40, 0.95, 99));
    assert_eq!(device_row(&p(0.8, usize::MAX, 0.95), 99).unwrap().top_k, 0);
}
