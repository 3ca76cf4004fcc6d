//! The GPU engine as a server's backend (`SlotBackend`): sequences in
//! scattered slots, at different positions, prefilled in chunks and decoded
//! together, on both decode paths (the fused step up to its rows, the
//! prefill path's kernels with per-row positions beyond), against the CPU
//! reference doing the same; the device sampler with per-row streams
//! against its CPU twin on the same logits.

use cudarc::driver::CudaSlice;
use gpu_host::shape::{KvCacheShape, KvRows, RowShape, SplitSums};
use gpu_kernels::params::decode::DECODE_MAX_ROWS;
use gpu_kernels::params::sample::SampleRow;
use half::bf16;
use host::cpu::CpuModel;
use host::cpu::sample::{argmax, sample_row};
use host::gpu::Gpu;
use host::gpu::engine::{GpuEngine, Precision};
use host::gpu::ops::encoder::encoder_forward_rows;
use host::gpu::ops::kv_cache::{kv_cache_store, kv_cache_store_split};
use host::gpu::ops::weight::WeightRef;
use host::model::checkpoint::Checkpoint;
use host::model::fixtures::llmc_bytes;
use host::model::{DType, Weights};
use host::serve::backend::{Draw, SlotBackend, SlotChunk, SlotToken};
use rand::Rng;
use rand::rngs::StdRng;

use crate::decode::head64_config;
use crate::kernels::{CacheElem, check, down, poisoned, random_vec};

/// The FP32 bar against the CPU reference.
pub(crate) const FP32_TOL: f32 = 1e-3;
/// TF32 and bf16 against the FP32 CPU reference (their error is the
/// matmuls' rounding: docs/accuracy.md).
const LOW_PRECISION_TOL: f32 = 5e-2;
/// Slots: more than the fused kernels' rows, so steps whose highest slot is
/// past them take the per-row prefill path.
pub(crate) const SLOTS: usize = DECODE_MAX_ROWS as usize + 4;
/// Positions per slot.
pub(crate) const MAX_T: usize = 96;
/// Activation rows: a prefill chunk.
pub(crate) const CHUNK: usize = 24;

/// One sequence of the schedule: its slot and what it holds so far.
struct Seq {
    slot: usize,
    prompt: Vec<u32>,
    /// Positions in the cache.
    len: usize,
    /// The token it feeds next (after its prompt).
    next: Option<u32>,
}

/// A greedy draw, or a sampled one whose stream is not the row index.
fn draw(rng: &mut StdRng, sampled: bool, counter: usize, stream: u32) -> Draw {
    let settings = if sampled {
        SampleRow {
            temperature: 0.8,
            top_k: 50,
            top_p: 0.95,
            _pad: 0,
            seed: rng.random(),
        }
    } else {
        SampleRow {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            _pad: 0,
            seed: 0,
        }
    };
    Draw {
        settings,
        counter: counter as u32,
        stream,
    }
}

/// Runs one schedule on both backends and compares every step's logits
/// (`tol`), and each chosen id against the CPU sampler over the GPU's own
/// logits (the sampler is exact on equal logits).
fn schedule_matches_cpu(precision: Precision, tol: f32) {
    schedule_matches_cpu_on(precision, tol, |gpu, w| {
        Box::new(GpuEngine::with_rows(gpu, w, SLOTS, MAX_T, CHUNK, precision).unwrap())
    });
}

/// [`schedule_matches_cpu`] on the slot backend `make(gpu 0, weights)`
/// builds for [`SLOTS`] slots of [`MAX_T`] positions, [`CHUNK`] rows.
pub(crate) fn schedule_matches_cpu_on(
    precision: Precision,
    tol: f32,
    make: impl FnOnce(Gpu, &Weights) -> Box<dyn SlotBackend>,
) {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let cfg = head64_config();
    let bytes = llmc_bytes(&cfg, rng.random(), DType::F32).unwrap();
    let ckpt = Checkpoint::from_bytes(bytes, "random.bin", Some(cfg.num_heads)).unwrap();
    let w = ckpt.weights().unwrap();
    let mut gpu = make(gpu, &w);
    let gpu = gpu.as_mut();
    let mut cpu = if precision == Precision::Bf16 {
        CpuModel::new_bf16(&w, SLOTS, MAX_T).unwrap()
    } else {
        CpuModel::new(&w, SLOTS, MAX_T).unwrap()
    };
    let (v, vp) = (cfg.vocab_size, cfg.padded_vocab_size);
    // Slot 0 at one row; slot 3 prefilled in two chunks; the last slots
    // past the fused rows; one-token prompts.
    let plan = [(0, 7), (3, CHUNK + 9), (SLOTS - 3, 5), (SLOTS - 1, 1), (5, 2)];
    let mut seqs: Vec<Seq> = plan
        .iter()
        .map(|&(slot, len)| Seq {
            slot,
            prompt: (0..len).map(|_| rng.random_range(0..v as u32)).collect(),
            len: 0,
            next: None,
        })
        .collect();
    let compare = |what: &str, gpu: &mut dyn SlotBackend, cpu: &mut CpuModel, draws: &[Draw]| -> Vec<u32> {
        let (got, want) = (gpu.slot_logits().unwrap(), cpu.slot_logits().unwrap());
        assert_eq!(got.len(), draws.len() * vp, "{what}: logits rows");
        check(&format!("{what} {precision:?}"), &got, &want, tol, 0.0);
        let ids = gpu.choose(draws).unwrap();
        for (r, (d, &id)) in draws.iter().zip(&ids).enumerate() {
            let row = &got[r * vp..r * vp + v];
            let twin = sample_row(row, &d.settings, d.counter, d.stream);
            assert_eq!(
                id, twin,
                "{what}: row {r} chose {id}, the CPU sampler {twin} on the same logits"
            );
        }
        ids
    };
    // Prefill every prompt as the scheduler does: rounds of at most CHUNK
    // tokens in all, each sequence's next chunk in one call (two rounds: two
    // chunks, then four, slot 3's prompt continuing beside three others).
    let mut round = 0;
    while seqs.iter().any(|s| s.len < s.prompt.len()) {
        let mut budget = CHUNK;
        let mut batch: Vec<(usize, usize, usize)> = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            let n = (s.prompt.len() - s.len).min(budget);
            if n > 0 {
                batch.push((i, s.len, s.len + n));
                budget -= n;
            }
        }
        let chunks: Vec<SlotChunk<'_>> = batch
            .iter()
            .map(|&(i, from, to)| SlotChunk {
                slot: seqs[i].slot,
                tokens: &seqs[i].prompt[from..to],
                pos0: from,
            })
            .collect();
        gpu.prefill_chunks(&chunks).unwrap();
        cpu.prefill_chunks(&chunks).unwrap();
        let draws: Vec<Draw> = batch
            .iter()
            .map(|&(i, _, to)| draw(&mut rng, i % 2 == 1, to, seqs[i].slot as u32 * 7 + 1))
            .collect();
        let what = format!("prefill round {round} ({} chunks)", batch.len());
        let ids = compare(&what, gpu, &mut cpu, &draws);
        for (&(i, _, to), &id) in batch.iter().zip(&ids) {
            let s = &mut seqs[i];
            s.len = to;
            if s.len == s.prompt.len() {
                // The CPU's greedy choice feeds both (so they stay on one path).
                s.next = Some(id.min(v as u32 - 1));
            }
        }
        round += 1;
    }
    assert_eq!(round, 2, "the plan's prefill rounds");
    // Decode steps over changing subsets (indices into `seqs`): slots 0, 3
    // and 5 (the fused step, idle rows between), every slot (the per-row
    // path), a slot past the fused rows alone (per-row, mostly idle rows),
    // slot 0 alone (one fused row), slot 3 alone (fused, idle rows first).
    let subsets: [&[usize]; 5] = [&[0, 1, 4], &[0, 1, 2, 3, 4], &[2], &[0], &[1]];
    for (step, subset) in subsets.iter().cycle().take(10).enumerate() {
        let rows: Vec<SlotToken> = subset
            .iter()
            .map(|&i| SlotToken {
                slot: seqs[i].slot,
                token: seqs[i].next.unwrap(),
                pos: seqs[i].len,
            })
            .collect();
        // Every third step on the GPU as a prefill of one-token chunks (how
        // the server runs decode rows beside a prefill); the CPU decodes.
        if step % 3 == 1 {
            let tokens: Vec<u32> = rows.iter().map(|r| r.token).collect();
            let chunks: Vec<SlotChunk<'_>> = rows
                .iter()
                .zip(&tokens)
                .map(|(r, t)| SlotChunk {
                    slot: r.slot,
                    tokens: std::slice::from_ref(t),
                    pos0: r.pos,
                })
                .collect();
            gpu.prefill_chunks(&chunks).unwrap();
        } else {
            gpu.decode(&rows).unwrap();
        }
        cpu.decode(&rows).unwrap();
        let draws: Vec<Draw> = subset
            .iter()
            .map(|&i| draw(&mut rng, step % 2 == 1, seqs[i].len + 1, seqs[i].slot as u32 * 7 + 1))
            .collect();
        let slots: Vec<usize> = rows.iter().map(|r| r.slot).collect();
        compare(&format!("decode step {step} slots {slots:?}"), gpu, &mut cpu, &draws);
        let want = cpu.slot_logits().unwrap();
        for (r, &i) in subset.iter().enumerate() {
            seqs[i].len += 1;
            seqs[i].next = Some(argmax(&want[r * vp..r * vp + v]));
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn slot_backend_fp32_matches_cpu() {
    schedule_matches_cpu(Precision::Fp32, FP32_TOL);
}

#[test]
#[ignore = "needs a GPU"]
fn slot_backend_tf32_matches_cpu() {
    schedule_matches_cpu(Precision::Tf32, LOW_PRECISION_TOL);
}

#[test]
#[ignore = "needs a GPU"]
fn slot_backend_bf16_matches_cpu_bf16() {
    schedule_matches_cpu(Precision::Bf16, LOW_PRECISION_TOL);
}

/// `encoder_forward_rows` (f32 and bf16 tables) against its CPU twin, rows
/// at scattered positions, one past the table (an idle row: clamped, never
/// out of bounds).
#[test]
#[ignore = "needs a GPU"]
fn encoder_rows_matches_cpu() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (n, c, vocab, max_pos) = (7usize, 96usize, 50usize, 40usize);
    let wte = random_vec(vocab * c, 1.0);
    let wpe = random_vec(max_pos * c, 1.0);
    let tokens: Vec<u32> = (0..n).map(|_| rng.random_range(0..vocab as u32)).collect();
    let mut pos: Vec<u32> = (0..n).map(|_| rng.random_range(0..max_pos as u32)).collect();
    pos[n - 1] = max_pos as u32;
    let shape = RowShape::new(n, c);
    let mut want = vec![0f32; n * c];
    host::cpu::ops::encoder_forward_rows(&mut want, &tokens, &pos, &wte, &wpe, shape);
    let (dt, dp, dwpe) = (
        gpu.upload(&tokens).unwrap(),
        gpu.upload(&pos).unwrap(),
        gpu.upload(&wpe).unwrap(),
    );
    let dwte = gpu.upload(&wte).unwrap();
    let mut out = poisoned(&gpu, n * c);
    encoder_forward_rows(&gpu, &mut out, &dt, &dp, WeightRef::F32(&dwte), &dwpe, shape).unwrap();
    check("encoder rows, f32 wte", &down(&gpu, &out), &want, 0.0, 0.0);
    // bf16: the CPU twin over the table rounded to bf16 and widened (exact).
    let wte16: Vec<bf16> = wte.iter().map(|&x| bf16::from_f32(x)).collect();
    let wide: Vec<f32> = wte16.iter().map(|x| x.to_f32()).collect();
    host::cpu::ops::encoder_forward_rows(&mut want, &tokens, &pos, &wide, &wpe, shape);
    let dwte16 = gpu.upload(&wte16).unwrap();
    let mut out = poisoned(&gpu, n * c);
    encoder_forward_rows(&gpu, &mut out, &dt, &dp, WeightRef::Bf16(&dwte16), &dwpe, shape).unwrap();
    check("encoder rows, bf16 wte", &down(&gpu, &out), &want, 0.0, 0.0);
}

/// `kv_cache_store` (and `kv_cache_store_split`) against its CPU twin:
/// queries out, keys and values at each row's position, an idle row caching
/// nothing; the rest of the cache keeps its (random) contents. Into f32
/// caches and into bf16 ones.
#[test]
#[ignore = "needs a GPU"]
fn kv_cache_store_matches_cpu() {
    let Some(gpu) = crate::kernels::skip::gpu() else { return };
    let mut rng = crate::seed::rng();
    let (n, nh, hs, max_t) = (5usize, 3usize, 64usize, 20usize);
    let c = nh * hs;
    let qkv = random_vec(n * 3 * c, 1.0);
    let dqkv = gpu.upload(&qkv).unwrap();
    let shape = KvCacheShape { rows: n, c, nh, max_t };
    let call = StoreCall {
        gpu: &gpu,
        qkv: &qkv,
        dqkv: &dqkv,
        shape,
    };
    let mut pos: Vec<u32> = (0..n).map(|_| rng.random_range(0..max_t as u32)).collect();
    pos[2] = max_t as u32;
    // Mapped rows, as a prefill of several slots runs them: rows 0 and 1 go
    // to cache row 3 at two positions, row 4 to a cache row past the cache
    // (idle); the cache has fewer rows than the call.
    let rows = 4usize;
    let map: Vec<u32> = vec![3, 3, 0, 1, rows as u32];
    let mapped_pos = [7, 8, 0, 19, 5];
    call.check::<f32>("kv_cache_store", &pos, None, n);
    call.check::<f32>("kv_cache_store mapped", &mapped_pos, Some(&map), rows);
    // Into bf16 caches (the bf16 engine's).
    call.check::<bf16>("kv_cache_store bf16", &pos, None, n);
    call.check::<bf16>("kv_cache_store bf16 mapped", &mapped_pos, Some(&map), rows);

    // The qkv rows as a split matmul leaves them: parts added in order, then
    // the bias (or none), bit for bit the twin's; 9 parts take the kernel's
    // second batch of loads.
    for (splits, with_bias) in [(1, true), (3, false), (6, true), (9, true)] {
        let parts = random_vec(splits * n * 3 * c, 1.0);
        let bias = random_vec(3 * c, 1.0);
        let (dparts, dbias) = (gpu.upload(&parts).unwrap(), gpu.upload(&bias).unwrap());
        let (mut kc, mut vc) = (random_vec(n * c * max_t, 1.0), random_vec(n * c * max_t, 1.0));
        let (mut dk, mut dv) = (gpu.upload(&kc).unwrap(), gpu.upload(&vc).unwrap());
        let dpos = gpu.upload(&pos).unwrap();
        let mut dq = poisoned(&gpu, n * c);
        let cache = KvRows {
            k_cache: &mut dk,
            v_cache: &mut dv,
            pos: &dpos,
            cache_row: None,
        };
        let sums = SplitSums {
            partial: &dparts,
            splits,
            bias: with_bias.then_some(&dbias),
        };
        kv_cache_store_split(&gpu, &mut dq, cache, sums, shape).unwrap();
        let mut q = vec![0f32; n * c];
        let cache = KvRows {
            k_cache: &mut kc[..],
            v_cache: &mut vc[..],
            pos: &pos[..],
            cache_row: None,
        };
        let sums = SplitSums {
            partial: &parts[..],
            splits,
            bias: with_bias.then_some(&bias[..]),
        };
        host::cpu::ops::kv_cache_store_split(&mut q, cache, sums, shape);
        let what = format!("kv_cache_store_split splits={splits} bias={with_bias}");
        check(&format!("{what} q"), &down(&gpu, &dq), &q, 0.0, 0.0);
        check(&format!("{what} k"), &down(&gpu, &dk), &kc, 0.0, 0.0);
        check(&format!("{what} v"), &down(&gpu, &dv), &vc, 0.0, 0.0);
    }
}

/// One `kv_cache_store` call on both sides: the qkv rows and the shape.
struct StoreCall<'a> {
    gpu: &'a Gpu,
    qkv: &'a [f32],
    dqkv: &'a CudaSlice<f32>,
    shape: KvCacheShape,
}

impl StoreCall<'_> {
    /// The call over caches of `rows` random rows kept as `E` (`map`: each
    /// row's cache row, or none: row r is cache row r), against the twin
    /// over the same values, whose keys and values are then rounded as `E`
    /// keeps them: bit for bit.
    fn check<E: CacheElem>(&self, what: &str, pos: &[u32], map: Option<&[u32]>, rows: usize) {
        let StoreCall { gpu, qkv, dqkv, shape } = *self;
        let (n, c, max_t) = (shape.rows, shape.c, shape.max_t);
        let kept = |x: Vec<f32>| -> Vec<f32> { x.into_iter().map(E::kept).collect() };
        let (mut kc, mut vc) = (
            kept(random_vec(rows * c * max_t, 1.0)),
            kept(random_vec(rows * c * max_t, 1.0)),
        );
        let (mut dk, mut dv) = (E::up(gpu, &kc), E::up(gpu, &vc));
        let dpos = gpu.upload(pos).unwrap();
        let dmap = map.map(|m| gpu.upload(m).unwrap());
        let mut dq = poisoned(gpu, n * c);
        let cache = KvRows {
            k_cache: &mut dk,
            v_cache: &mut dv,
            pos: &dpos,
            cache_row: dmap.as_ref(),
        };
        kv_cache_store(gpu, &mut dq, cache, dqkv, shape).unwrap();
        let mut q = vec![0f32; n * c];
        let cache = KvRows {
            k_cache: &mut kc[..],
            v_cache: &mut vc[..],
            pos,
            cache_row: map,
        };
        host::cpu::ops::kv_cache_store(&mut q, cache, qkv, shape);
        check(&format!("{what} q"), &down(gpu, &dq), &q, 0.0, 0.0);
        check(&format!("{what} k"), &E::down(gpu, &dk), &kept(kc), 0.0, 0.0);
        check(&format!("{what} v"), &E::down(gpu, &dv), &kept(vc), 0.0, 0.0);
    }
}
