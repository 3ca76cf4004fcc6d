//! CPU twin of the sampling kernel (`gpu_kernels::ops::sample`, launched by
//! `gpu::ops::sample::sample_forward`): the rule of
//! `gpu_kernels::params::sample`, written the plain way — sort the
//! candidates, cut, sum, walk — so that it is obviously right. It calls the
//! same integer-weight, top-p, draw and Philox functions as the kernel (no
//! f64 anywhere), so the two choose the same id bit for bit; the tests use
//! it as the GPU's oracle and check its draws against the exact softmax.

use gpu_host::shape::SampleShape;
use gpu_kernels::params::sample::{
    SampleRow, draw_target, is_greedy, key_logit, logit_key, row_random, sample_weight, temperature_scale,
    top_p_active, top_p_target,
};

/// `out[i]` (and `next_tokens[i]` when given) = the id row `i` chooses, for
/// `i < n`, from the first `v` entries of `logits[i * row_stride..]`, with
/// settings `rows[i]` and draw counter `counter[i]` (0 for all rows when
/// `None`). Same arguments, in the same order, as the launch wrapper.
///
/// Panics when a buffer is shorter than that needs (a test oracle: loud).
pub fn sample_forward(
    out: &mut [u32],
    logits: &[f32],
    rows: &[SampleRow],
    counter: Option<&[u32]>,
    mut next_tokens: Option<&mut [u32]>,
    shape: SampleShape,
) {
    let SampleShape { n, v, row_stride } = shape;
    assert!(v > 0, "sample_forward: empty vocabulary");
    for i in 0..n {
        let row = &logits[i * row_stride..i * row_stride + v];
        let c = counter.map_or(0, |c| c[i]);
        let id = sample_row(row, &rows[i], c, i as u32);
        out[i] = id;
        if let Some(next) = next_tokens.as_deref_mut() {
            next[i] = id;
        }
    }
}

/// The id one row chooses: `logits` is its real vocabulary, `row` its batch
/// index (part of the random counter).
pub fn sample_row(logits: &[f32], cfg: &SampleRow, counter: u32, row: u32) -> u32 {
    if is_greedy(cfg) {
        return argmax(logits);
    }
    // NaN logits take no part; an all-NaN row gives 0, as the kernel.
    let Some(kmax) = logits.iter().map(|&l| logit_key(l)).max().filter(|&k| k != 0) else {
        return 0;
    };
    let m = key_logit(kmax);
    let s = temperature_scale(cfg.temperature);

    // Candidates, most likely first; ties: lowest id first.
    let mut cand: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    cand.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    if cfg.top_k > 0 && (cfg.top_k as usize) < cand.len() {
        cand.truncate(cfg.top_k as usize);
    }
    let weight = |i: u32| sample_weight(logits[i as usize], m, s);

    // Nucleus: the shortest prefix whose mass reaches the target.
    if top_p_active(cfg) {
        let total: u64 = cand.iter().map(|&i| weight(i)).sum();
        let target = top_p_target(cfg.top_p, total);
        let mut mass = 0u64;
        let keep = cand
            .iter()
            .position(|&i| {
                mass += weight(i);
                mass >= target
            })
            .expect("the prefix mass reaches the target (at most the total)");
        cand.truncate(keep + 1);
    }

    // The draw: cumulative masses in id order.
    cand.sort_unstable();
    let kept: u64 = cand.iter().map(|&i| weight(i)).sum();
    let t = draw_target(row_random(cfg.seed, counter, row), kept);
    let mut mass = 0u64;
    for &i in &cand {
        mass += weight(i);
        if mass > t {
            return i;
        }
    }
    unreachable!("the draw target {t} is below the kept mass {kept}")
}

/// Greedy: the largest logit, ties to the lowest id, NaN never wins (0 when
/// every logit is NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if !l.is_nan() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i as u32, l));
        }
    }
    best.map_or(0, |(i, _)| i)
}
