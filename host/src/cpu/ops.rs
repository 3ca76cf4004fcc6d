//! CPU reference ops: the same names and argument orders as the GPU wrappers
//! and kernels (see `docs/design.md`), with llm.c's semantics.
//!
//! Every op accumulates in f32, like llm.c's CPU code. Work is split over
//! rows (tokens) or (token, head) pairs with rayon; each output element is
//! computed by one task in a fixed order, so results do not depend on the
//! number of threads, nor on how many rows a call holds (a row computed in a
//! prefill equals the same row computed alone in a decode step).
//!
//! Sizes are checked with `assert!`: these are internal contracts between the
//! forward pass and its ops, not user input (the forward pass validates that).

pub use gpu_host::shape::{
    AttentionShape, EncoderShape, KvCacheShape, KvRows, LayernormWeights, MatmulShape, RowShape, SplitSums,
};
pub use gpu_kernels::params::crossentropy::IGNORED_TARGET;
use rayon::prelude::*;

use crate::model::config::LAYERNORM_EPS;

/// `sqrt(2 / pi)`, the constant of GPT-2's tanh-approximated GELU.
const GELU_SCALE: f32 = 0.797_884_6;
/// Cubic coefficient of the tanh-approximated GELU.
const GELU_CUBIC: f32 = 0.044_715;

/// Token plus position embedding: `out[b, t, :] = wte[inp[b, t], :] + wpe[pos0 + t, :]`.
///
/// `out` is `[B*T*C]`, `inp` `[B*T]`, `wte` `[Vp*C]`, `wpe` `[maxT*C]`.
pub fn encoder_forward(out: &mut [f32], inp: &[u32], wte: &[f32], wpe: &[f32], shape: EncoderShape) {
    let EncoderShape { b, t, c, pos0 } = shape;
    assert!(out.len() >= b * t * c && inp.len() >= b * t);
    assert!(
        wpe.len() >= (pos0 + t) * c,
        "position {} is past the position table",
        pos0 + t
    );
    out[..b * t * c]
        .par_chunks_mut(c)
        .enumerate()
        .for_each(|(row, out_bt)| {
            let token = inp[row] as usize;
            let pos = pos0 + row % t;
            let wte_ix = &wte[token * c..(token + 1) * c];
            let wpe_p = &wpe[pos * c..(pos + 1) * c];
            for i in 0..c {
                out_bt[i] = wte_ix[i] + wpe_p[i];
            }
        });
}

/// Token plus position embedding with a position per row: `out[r, :] =
/// wte[inp[r], :] + wpe[min(pos[r], maxT - 1), :]` for `shape.rows` rows
/// (a decode step over sequences at different positions; a position past
/// the table is an idle row, clamped as the kernel does).
pub fn encoder_forward_rows(out: &mut [f32], inp: &[u32], pos: &[u32], wte: &[f32], wpe: &[f32], shape: RowShape) {
    let RowShape { rows: n, c } = shape;
    assert!(out.len() >= n * c && inp.len() >= n && pos.len() >= n && wpe.len() >= c);
    let max_pos = wpe.len() / c;
    out[..n * c].par_chunks_mut(c).enumerate().for_each(|(r, out_r)| {
        let token = inp[r] as usize;
        let p = (pos[r] as usize).min(max_pos - 1);
        let wte_ix = &wte[token * c..(token + 1) * c];
        let wpe_p = &wpe[p * c..(p + 1) * c];
        for i in 0..c {
            out_r[i] = wte_ix[i] + wpe_p[i];
        }
    });
}

/// A decode step's keys and values into the cache, each row at its own
/// position: row `r` of `qkv` (`[n, 3C]`, `n = shape.rows`) gives its query
/// to `q[r]`, its key and value into `cache` at its position and cache row
/// ([`KvRows`]); a row at or past `max_t`, or whose cache row is past the
/// caches' rows, is idle (nothing cached).
pub fn kv_cache_store(q: &mut [f32], cache: KvRows<'_, &mut [f32], [u32]>, qkv: &[f32], shape: KvCacheShape) {
    let KvRows {
        k_cache,
        v_cache,
        pos,
        cache_row,
    } = cache;
    let KvCacheShape { rows: n, c, nh, max_t } = shape;
    assert!(q.len() >= n * c && qkv.len() >= n * 3 * c && pos.len() >= n);
    assert!(cache_row.is_none_or(|m| m.len() >= n));
    let cache_rows = k_cache.len().min(v_cache.len()) / (c * max_t);
    assert!(cache_row.is_some() || cache_rows >= n);
    let hs = c / nh;
    for r in 0..n {
        let row = &qkv[r * 3 * c..(r + 1) * 3 * c];
        q[r * c..(r + 1) * c].copy_from_slice(&row[..c]);
        let p = pos[r] as usize;
        let cr = cache_row.map_or(r, |m| m[r] as usize);
        if p >= max_t || cr >= cache_rows {
            continue;
        }
        for h in 0..nh {
            let at = ((cr * nh + h) * max_t + p) * hs;
            k_cache[at..at + hs].copy_from_slice(&row[c + h * hs..c + (h + 1) * hs]);
            v_cache[at..at + hs].copy_from_slice(&row[2 * c + h * hs..2 * c + (h + 1) * hs]);
        }
    }
}

/// [`kv_cache_store`] of qkv rows in split-K parts ([`SplitSums`], each
/// slice `[n, 3c]`): the parts added in order, then the bias, then stored.
pub fn kv_cache_store_split(
    q: &mut [f32],
    cache: KvRows<'_, &mut [f32], [u32]>,
    qkv: SplitSums<'_, [f32]>,
    shape: KvCacheShape,
) {
    let qkv = sum_split_parts(qkv, 3 * shape.c, shape.rows * 3 * shape.c);
    kv_cache_store(q, cache, &qkv, shape);
}

/// The whole of a split-K output of `len` floats (rows of `c`): its parts
/// added in order, then the bias.
fn sum_split_parts(sums: SplitSums<'_, [f32]>, c: usize, len: usize) -> Vec<f32> {
    let SplitSums { partial, splits, bias } = sums;
    assert!(splits >= 1 && partial.len() >= splits * len);
    let mut whole = partial[..len].to_vec();
    for part in partial[len..splits * len].chunks(len) {
        whole.iter_mut().zip(part).for_each(|(w, v)| *w += v);
    }
    if let Some(b) = bias {
        assert!(b.len() >= c);
        whole.iter_mut().enumerate().for_each(|(i, w)| *w += b[i % c]);
    }
    whole
}

/// Layer normalisation of each of the `shape.rows` rows of `shape.c`
/// channels: `out = (inp - mean) / sqrt(var + eps) * weight + bias`, biased
/// variance, eps = [`LAYERNORM_EPS`].
pub fn layernorm_forward(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32], shape: RowShape) {
    let RowShape { rows: n, c } = shape;
    assert!(out.len() >= n * c && inp.len() >= n * c && weight.len() >= c && bias.len() >= c);
    out[..n * c]
        .par_chunks_mut(c)
        .zip(inp[..n * c].par_chunks(c))
        .for_each(|(out_row, x)| {
            // Statistics in f64: a sequential f32 sum over C values drifts by
            // up to C ulps, which would make the oracle the noisier side.
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = x.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / c as f64;
            let rstd = (1.0 / (var + LAYERNORM_EPS as f64).sqrt()) as f32;
            let mean = mean as f32;
            for i in 0..c {
                out_row[i] = (x[i] - mean) * rstd * weight[i] + bias[i];
            }
        });
}

/// `residual = inp1 + inp2`, then `out = layernorm(residual)`: the GPU's
/// fused kernel, here plainly the two ops in turn.
pub fn residual_layernorm_forward(
    residual: &mut [f32],
    out: &mut [f32],
    inp1: &[f32],
    inp2: &[f32],
    ln: LayernormWeights<'_, [f32]>,
    shape: RowShape,
) {
    residual_forward(residual, inp1, inp2, shape.len());
    layernorm_forward(out, residual, ln.weight, ln.bias, shape);
}

/// `residual = inp1 + proj` and `out = layernorm(residual)`, where `proj`
/// is a projection in split-K parts ([`SplitSums`], each slice
/// `shape.len()` floats), added in split order, plus their bias: the GPU's
/// split-K reduction fused into [`residual_layernorm_forward`], here plainly
/// the sum and then that op.
pub fn residual_layernorm_split_forward(
    residual: &mut [f32],
    out: &mut [f32],
    inp1: &[f32],
    inp2: SplitSums<'_, [f32]>,
    ln: LayernormWeights<'_, [f32]>,
    shape: RowShape,
) {
    let proj = sum_split_parts(inp2, shape.c, shape.len());
    residual_layernorm_forward(residual, out, inp1, &proj, ln, shape);
}

/// Number of independent partial sums per dot product. Several accumulators
/// let the compiler use SIMD lanes; the order of additions stays fixed.
const DOT_LANES: usize = 8;
/// Input rows that share one pass over a weight row (register blocking).
const MATMUL_ROW_TILE: usize = 4;
/// Output channels per parallel task: a block of weight rows that stays in
/// cache while every input row is multiplied with it.
const MATMUL_OC_BLOCK: usize = 64;

/// `out[m, n] = sum_i inp[m, i] * weight[n, i] + bias[n]`, weights stored
/// (out, in) like llm.c and PyTorch's `nn.Linear`.
///
/// Parallel over blocks of output channels, each block computed for all rows
/// and then copied into place. Each dot product is the same function of its
/// two rows wherever it is computed (see `dot_tile`).
pub fn matmul_forward(out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, shape: MatmulShape) {
    let MatmulShape { m, n, k } = shape;
    assert!(out.len() >= m * n && inp.len() >= m * k && weight.len() >= n * k);
    if let Some(bias) = bias {
        assert!(bias.len() >= n);
    }
    let blocks: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(MATMUL_OC_BLOCK))
        .into_par_iter()
        .map(|blk| {
            let o0 = blk * MATMUL_OC_BLOCK;
            let o1 = (o0 + MATMUL_OC_BLOCK).min(n);
            let width = o1 - o0;
            // block[r * width + (o - o0)] = out[r, o]
            let mut block = vec![0f32; m * width];
            let mut r = 0;
            while r < m {
                let rows = (m - r).min(MATMUL_ROW_TILE);
                for o in o0..o1 {
                    let w = &weight[o * k..(o + 1) * k];
                    let mut sums = [0f32; MATMUL_ROW_TILE];
                    if rows == MATMUL_ROW_TILE {
                        dot_tile::<MATMUL_ROW_TILE>(&mut sums, &inp[r * k..], w, k);
                    } else {
                        for j in 0..rows {
                            dot_tile::<1>((&mut sums[j..j + 1]).try_into().unwrap(), &inp[(r + j) * k..], w, k);
                        }
                    }
                    let b = bias.map_or(0.0, |b| b[o]);
                    for j in 0..rows {
                        block[(r + j) * width + (o - o0)] = sums[j] + b;
                    }
                }
                r += rows;
            }
            (o0, block)
        })
        .collect();
    for (o0, block) in blocks {
        let width = block.len() / m.max(1);
        for r in 0..m {
            out[r * n + o0..r * n + o0 + width].copy_from_slice(&block[r * width..(r + 1) * width]);
        }
    }
}

/// `sums[j] = dot(inp[j*k..(j+1)*k], w)` for `R` consecutive rows of `inp`,
/// each with [`DOT_LANES`] partial sums reduced in a fixed order, so a row's
/// result is the same for every `R`.
fn dot_tile<const R: usize>(sums: &mut [f32; R], inp: &[f32], w: &[f32], k: usize) {
    let full = k - k % DOT_LANES;
    let mut acc = [[0f32; DOT_LANES]; R];
    for i in (0..full).step_by(DOT_LANES) {
        let wl = &w[i..i + DOT_LANES];
        for j in 0..R {
            let x = &inp[j * k + i..j * k + i + DOT_LANES];
            for l in 0..DOT_LANES {
                acc[j][l] += x[l] * wl[l];
            }
        }
    }
    for j in 0..R {
        let mut tail = 0f32;
        for i in full..k {
            tail += inp[j * k + i] * w[i];
        }
        sums[j] = acc[j].iter().sum::<f32>() + tail;
    }
}

/// Causal multi-head attention with a KV cache of one layer.
///
/// `out` is `[B*T*C]`; `k_cache`, `v_cache` are `[B][NH][maxT][HS]`; `qkv` is
/// `[B*T*3C]` with llm.c's row layout `[q | k | v]`. First the keys and values
/// of this call's tokens are stored at positions `pos0..pos0+t`; then each
/// query at absolute position `p` attends to the keys `max(0, p-window+1)..=p`
/// (`window == 0`: all of `0..=p`) with scale `1/sqrt(HS)`.
pub fn attention_forward(
    out: &mut [f32],
    k_cache: &mut [f32],
    v_cache: &mut [f32],
    qkv: &[f32],
    shape: AttentionShape,
) {
    let AttentionShape {
        b,
        t,
        pos0,
        max_t,
        c,
        nh,
        window,
    } = shape;
    let hs = c / nh;
    assert!(hs * nh == c, "channels {c} not divisible by heads {nh}");
    assert!(
        pos0 + t <= max_t,
        "positions {pos0}..{} exceed the cache ({max_t})",
        pos0 + t
    );
    assert!(out.len() >= b * t * c && qkv.len() >= b * t * 3 * c);
    assert!(k_cache.len() >= b * nh * max_t * hs && v_cache.len() >= b * nh * max_t * hs);

    // 1. Append this call's keys and values: one task per (row, head) plane.
    let plane = max_t * hs;
    k_cache[..b * nh * plane]
        .par_chunks_mut(plane)
        .zip(v_cache[..b * nh * plane].par_chunks_mut(plane))
        .enumerate()
        .for_each(|(bh, (k_plane, v_plane))| {
            let (bi, h) = (bh / nh, bh % nh);
            for ti in 0..t {
                let row = &qkv[(bi * t + ti) * 3 * c..(bi * t + ti + 1) * 3 * c];
                let p = pos0 + ti;
                k_plane[p * hs..(p + 1) * hs].copy_from_slice(&row[c + h * hs..c + (h + 1) * hs]);
                v_plane[p * hs..(p + 1) * hs].copy_from_slice(&row[2 * c + h * hs..2 * c + (h + 1) * hs]);
            }
        });

    // 2. Each query token attends to its window of cached keys.
    let k_cache = &*k_cache;
    let v_cache = &*v_cache;
    let scale = 1.0 / (hs as f32).sqrt();
    out[..b * t * c]
        .par_chunks_mut(c)
        .enumerate()
        .for_each(|(row, out_bt)| {
            let (bi, ti) = (row / t, row % t);
            let p = pos0 + ti;
            let first = if window == 0 { 0 } else { (p + 1).saturating_sub(window) };
            let mut att = vec![0f32; p + 1 - first];
            for h in 0..nh {
                let q = &qkv[row * 3 * c + h * hs..row * 3 * c + (h + 1) * hs];
                let base = (bi * nh + h) * plane;
                // scores, and their maximum for a stable softmax
                let mut max = f32::NEG_INFINITY;
                for (j, a) in att.iter_mut().enumerate() {
                    let k = &k_cache[base + (first + j) * hs..base + (first + j + 1) * hs];
                    let s = q.iter().zip(k).map(|(x, y)| x * y).sum::<f32>() * scale;
                    *a = s;
                    max = max.max(s);
                }
                let mut sum = 0f32;
                for a in att.iter_mut() {
                    *a = (*a - max).exp();
                    sum += *a;
                }
                let inv = 1.0 / sum;
                let o = &mut out_bt[h * hs..(h + 1) * hs];
                o.fill(0.0);
                for (j, a) in att.iter().enumerate() {
                    let v = &v_cache[base + (first + j) * hs..base + (first + j + 1) * hs];
                    let w = a * inv;
                    for i in 0..hs {
                        o[i] += w * v[i];
                    }
                }
            }
        });
}

/// The layernorm `(weight, bias)` (`[c]` each) folded into the `[oc, c]`
/// linear `w` and its `lin_bias` for the one-row decode step: `out[2j] =
/// Σ_k weight_k w[j][k]`, `out[2j + 1] = lin_bias_j + Σ_k bias_k w[j][k]`
/// (pairs: `gpu_kernels::params::decode_step::DECODE_STEP_FOLD`). Then
/// `layernorm(x) · w_j + lin_bias_j = rstd ((x ⊙ weight) · w_j - mean
/// out[2j]) + out[2j + 1]`. Sums in k order, in f32.
pub fn decode_step_fold(
    out: &mut [f32],
    ln: (&[f32], &[f32]),
    w: &[f32],
    lin_bias: Option<&[f32]>,
    oc: usize,
    c: usize,
) {
    let (weight, bias) = ln;
    assert!(out.len() >= 2 * oc && weight.len() >= c && bias.len() >= c && w.len() >= oc * c);
    assert!(lin_bias.is_none_or(|b| b.len() >= oc));
    out[..2 * oc].par_chunks_mut(2).enumerate().for_each(|(j, pair)| {
        let row = &w[j * c..(j + 1) * c];
        let (mut g, mut b) = (0f32, 0f32);
        for k in 0..c {
            g += weight[k] * row[k];
            b += bias[k] * row[k];
        }
        pair[0] = g;
        pair[1] = lin_bias.map_or(0.0, |lb| lb[j]) + b;
    });
}

/// Low f32 mantissa bits TF32 drops (23 - 10).
const TF32_DROPPED_BITS: u32 = 13;

/// Round every value to the nearest TF32 value (10 mantissa bits; ties away
/// from zero, like the GPU's `cvt.rna.tf32.f32`): add half of the dropped
/// range, then clear it. NaN and infinities are left as they are.
pub fn round_tf32(x: &mut [f32]) {
    const HALF: u32 = 1 << (TF32_DROPPED_BITS - 1);
    const KEEP: u32 = !((1 << TF32_DROPPED_BITS) - 1);
    for v in x.iter_mut().filter(|v| v.is_finite()) {
        *v = f32::from_bits(v.to_bits().wrapping_add(HALF) & KEEP);
    }
}

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_forward(out: &mut [f32], inp: &[f32], n: usize) {
    assert!(out.len() >= n && inp.len() >= n);
    out[..n].par_iter_mut().zip(&inp[..n]).for_each(|(o, &x)| {
        *o = 0.5 * x * (1.0 + (GELU_SCALE * (x + GELU_CUBIC * x * x * x)).tanh());
    });
}

/// `out = inp1 + inp2`, elementwise.
pub fn residual_forward(out: &mut [f32], inp1: &[f32], inp2: &[f32], n: usize) {
    assert!(out.len() >= n && inp1.len() >= n && inp2.len() >= n);
    out[..n]
        .par_iter_mut()
        .zip(&inp1[..n])
        .zip(&inp2[..n])
        .for_each(|((o, a), b)| *o = a + b);
}

/// Softmax of each of the `n` rows of `vp` logits over its first `v`
/// entries; the padded entries `v..vp` get probability 0.
pub fn softmax_forward(probs: &mut [f32], logits: &[f32], n: usize, v: usize, vp: usize) {
    assert!(v <= vp && probs.len() >= n * vp && logits.len() >= n * vp);
    probs[..n * vp]
        .par_chunks_mut(vp)
        .zip(logits[..n * vp].par_chunks(vp))
        .for_each(|(p, l)| {
            let max = l[..v].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for i in 0..v {
                p[i] = (l[i] - max).exp();
                sum += p[i];
            }
            let inv = 1.0 / sum;
            for x in &mut p[..v] {
                *x *= inv;
            }
            p[v..].fill(0.0);
        });
}

/// Negative log-likelihood (nats) of `target` under one row of logits,
/// over its first `v` entries only, in f64 (the oracle of the kernel's f32
/// and of perplexity's sums): `logsumexp(logits[..v]) - logits[target]`.
pub fn token_nll(logits: &[f32], v: usize, target: u32) -> f64 {
    let real = &logits[..v];
    let max = real.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = real.iter().map(|&x| (x as f64 - max).exp()).sum();
    max + sum.ln() - real[target as usize] as f64
}

/// Cross-entropy of each of the `n` rows of `vp` logits against its
/// target: `losses[i] = token_nll(row i, v, targets[i])` rounded to f32; 0
/// where `targets[i]` is `IGNORED_TARGET`, NaN for any other target `>= v`
/// (as the kernel). The one exception to this file's f32 accumulation: a
/// loss is a difference of two large numbers, so it is taken in f64.
pub fn crossentropy_forward(losses: &mut [f32], logits: &[f32], targets: &[u32], n: usize, v: usize, vp: usize) {
    assert!(v <= vp && losses.len() >= n && targets.len() >= n && logits.len() >= n * vp);
    losses[..n]
        .par_iter_mut()
        .zip(&targets[..n])
        .zip(logits[..n * vp].par_chunks(vp))
        .for_each(|((loss, &target), row)| {
            *loss = if target == IGNORED_TARGET {
                0.0
            } else if target as usize >= v {
                f32::NAN
            } else {
                token_nll(row, v, target) as f32
            };
        });
}

/// `out[m, n] = round_bf16(inp[m, k]) · weight[n, k]ᵀ (+ bias[n])`, then
/// GELU if `gelu`: the CPU twin of the bf16 tensor-core matmul. Each input
/// is rounded to the nearest bf16, ties to even (`half::bf16::from_f32`, as
/// the kernel's `cvt.rn.bf16x2`); a product of two bf16 is exact, and unlike
/// the f32 ops above the sum is taken in f64 (with the bias) and rounded
/// once, so the kernel's only freedom, its f32 summation, is all that the
/// two differ by. GELU is [`gelu_forward`]'s.
pub fn matmul_forward_bf16(
    out: &mut [f32],
    inp: &[f32],
    weight: &[half::bf16],
    bias: Option<&[f32]>,
    shape: MatmulShape,
    gelu: bool,
) {
    let MatmulShape { m, n, k } = shape;
    assert!(out.len() >= m * n && inp.len() >= m * k && weight.len() >= n * k);
    if let Some(bias) = bias {
        assert!(bias.len() >= n);
    }
    let rounded: Vec<f64> = inp[..m * k].iter().map(|&x| half::bf16::from_f32(x).to_f64()).collect();
    let weight: Vec<f64> = weight[..n * k].iter().map(|w| w.to_f64()).collect();
    out[..m * n].par_chunks_mut(n.max(1)).enumerate().for_each(|(r, row)| {
        let a = &rounded[r * k..(r + 1) * k];
        for (o, y) in row.iter_mut().enumerate() {
            let w = &weight[o * k..(o + 1) * k];
            let dot: f64 = a.iter().zip(w).map(|(a, w)| a * w).sum();
            *y = (dot + bias.map_or(0.0, |b| b[o] as f64)) as f32;
        }
    });
    if gelu {
        let pre = out[..m * n].to_vec();
        gelu_forward(out, &pre, m * n);
    }
}
