//! Reading the persistent decode step's trace (`DecodeStepParams::trace`):
//! per phase, where a block's time goes (staging its input rows, waiting
//! for its first weight tile, the rest of its work, issuing the next
//! copies, the grid barrier).
//! Pure arithmetic on the words the kernel wrote, so it is tested here.

use gpu_kernels::params::decode_step::{
    DECODE_STEP_PHASES_PER_LAYER, DECODE_STEP_TRACE_HEADER, DECODE_STEP_TRACE_MARKS, DecodeStepMark,
    DecodeStepTraceHeader, decode_step_trace_words,
};
use serde::Serialize;

/// The kinds of phase, in a layer's order, then the LM head.
pub const PHASE_KINDS: [&str; 6] = ["qkv", "attention", "attproj", "fc", "fcproj", "lm_head"];

/// One phase of one traced step, over the grid's blocks (ns).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseTimes {
    /// Index into [`PHASE_KINDS`].
    pub kind: usize,
    /// From this phase's start to the next's (the LM head: to its end),
    /// median over blocks.
    pub period: f64,
    /// From the start to the block's end of the phase: median, max.
    pub work_med: f64,
    pub work_max: f64,
    /// GEMV phases, medians (0 otherwise): from the start until the input
    /// rows arrived; until they were also layernormed (and the bias and
    /// layernorm parameters had landed); then the wait for the first
    /// weight tile; the tiles' products until the last warp finished;
    /// from there to the block's end.
    pub loaded: f64,
    pub staged: f64,
    pub weight_wait: f64,
    pub compute: f64,
    pub tail: f64,
    /// From the block's end (its arrival) to its next copies issued, median
    /// (0 for the LM head).
    pub issue: f64,
    /// From the block's end to the next phase's start: the least over
    /// blocks (the last block to arrive: the barrier's own latency) and
    /// the median (0 for the LM head, which has no barrier after it).
    pub barrier_min: f64,
    pub barrier_med: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The phases of one step from the trace of `blocks` blocks of an
/// `n_layer`-layer model. Each block's cycles become ns by its own ratio of
/// global-timer time to cycles over the whole launch. `None` when the
/// trace is shorter than that or a block's clocks are missing.
pub fn phase_times(words: &[u64], blocks: usize, n_layer: usize) -> Option<Vec<PhaseTimes>> {
    let per_block = decode_step_trace_words(u32::try_from(n_layer).ok()?);
    if blocks == 0 || words.len() < blocks * per_block {
        return None;
    }
    let phases = DECODE_STEP_PHASES_PER_LAYER as usize * n_layer + 1;
    // Per block: (ns per cycle, its words).
    let mut grid = Vec::with_capacity(blocks);
    for b in words.chunks(per_block).take(blocks) {
        let h = |w: DecodeStepTraceHeader| b[w as usize];
        let ns = h(DecodeStepTraceHeader::TimerEnd).checked_sub(h(DecodeStepTraceHeader::TimerStart))?;
        let cycles = h(DecodeStepTraceHeader::ClockEnd).checked_sub(h(DecodeStepTraceHeader::ClockStart))?;
        if cycles == 0 {
            return None;
        }
        grid.push((ns as f64 / cycles as f64, b));
    }
    let mark = |b: &[u64], phase: usize, m: DecodeStepMark| {
        b[DECODE_STEP_TRACE_HEADER + phase * DECODE_STEP_TRACE_MARKS + m as usize] as f64
    };
    let per_layer = DECODE_STEP_PHASES_PER_LAYER as usize;
    let mut out = Vec::with_capacity(phases);
    for p in 0..phases {
        let last = p + 1 == phases;
        let gemv = last || p % per_layer != 1;
        let span = |m0: DecodeStepMark, m1: DecodeStepMark| -> Vec<f64> {
            grid.iter()
                .map(|(s, b)| (mark(b, p, m1) - mark(b, p, m0)) * s)
                .collect()
        };
        let gemv_span = |m0, m1| if gemv { median(span(m0, m1)) } else { 0.0 };
        let work = span(DecodeStepMark::Start, DecodeStepMark::End);
        let barrier: Vec<f64> = if last {
            Vec::new()
        } else {
            grid.iter()
                .map(|(s, b)| (mark(b, p + 1, DecodeStepMark::Start) - mark(b, p, DecodeStepMark::End)) * s)
                .collect()
        };
        let period: Vec<f64> = if last {
            work.clone()
        } else {
            grid.iter()
                .map(|(s, b)| (mark(b, p + 1, DecodeStepMark::Start) - mark(b, p, DecodeStepMark::Start)) * s)
                .collect()
        };
        out.push(PhaseTimes {
            kind: if last { PHASE_KINDS.len() - 1 } else { p % per_layer },
            period: median(period),
            work_max: work.iter().copied().fold(0.0, f64::max),
            work_med: median(work),
            loaded: gemv_span(DecodeStepMark::Start, DecodeStepMark::Loaded),
            staged: gemv_span(DecodeStepMark::Start, DecodeStepMark::Staged),
            weight_wait: gemv_span(DecodeStepMark::Staged, DecodeStepMark::Ready),
            compute: gemv_span(DecodeStepMark::Ready, DecodeStepMark::Computed),
            tail: gemv_span(DecodeStepMark::Computed, DecodeStepMark::End),
            issue: if last {
                0.0
            } else {
                median(span(DecodeStepMark::End, DecodeStepMark::Issued))
            },
            barrier_min: barrier.iter().copied().reduce(f64::min).unwrap_or(0.0),
            barrier_med: median(barrier),
        });
    }
    Some(out)
}

/// Each kind's mean over the layers (the LM head: its one phase).
pub fn by_kind(phases: &[PhaseTimes]) -> Vec<PhaseTimes> {
    (0..PHASE_KINDS.len())
        .filter_map(|k| {
            let of: Vec<&PhaseTimes> = phases.iter().filter(|p| p.kind == k).collect();
            if of.is_empty() {
                return None;
            }
            let mean = |f: fn(&PhaseTimes) -> f64| of.iter().map(|p| f(p)).sum::<f64>() / of.len() as f64;
            Some(PhaseTimes {
                kind: k,
                period: mean(|p| p.period),
                work_med: mean(|p| p.work_med),
                work_max: mean(|p| p.work_max),
                loaded: mean(|p| p.loaded),
                staged: mean(|p| p.staged),
                weight_wait: mean(|p| p.weight_wait),
                compute: mean(|p| p.compute),
                tail: mean(|p| p.tail),
                issue: mean(|p| p.issue),
                barrier_min: mean(|p| p.barrier_min),
                barrier_med: mean(|p| p.barrier_med),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace of `blocks` blocks, 1 layer, whose clocks run at 2 cycles
    /// per ns; block `b` reaches each mark `b` cycles late, except that
    /// every block leaves each barrier at the same time.
    fn synthetic(blocks: usize) -> Vec<u64> {
        let per = decode_step_trace_words(1);
        let mut w = vec![0u64; blocks * per];
        for b in 0..blocks {
            let base = &mut w[b * per..(b + 1) * per];
            let clock0 = 1000 * b as u64; // unsynchronised SM clocks
            base[DecodeStepTraceHeader::TimerStart as usize] = 5_000;
            base[DecodeStepTraceHeader::ClockStart as usize] = clock0;
            base[DecodeStepTraceHeader::TimerEnd as usize] = 5_000 + 1_000;
            base[DecodeStepTraceHeader::ClockEnd as usize] = clock0 + 2_000;
            for p in 0..6 {
                let at = |m: DecodeStepMark| DECODE_STEP_TRACE_HEADER + p * DECODE_STEP_TRACE_MARKS + m as usize;
                let start = clock0 + 100 * p as u64;
                base[at(DecodeStepMark::Start)] = start;
                base[at(DecodeStepMark::Loaded)] = start + 4;
                base[at(DecodeStepMark::Staged)] = start + 10;
                base[at(DecodeStepMark::Ready)] = start + 30;
                base[at(DecodeStepMark::Computed)] = start + 50;
                base[at(DecodeStepMark::End)] = start + 60 + b as u64 * 2;
                base[at(DecodeStepMark::Issued)] = start + 70 + b as u64 * 2;
            }
        }
        w
    }

    #[test]
    fn phases_of_a_synthetic_trace() {
        let blocks = 3;
        let t = phase_times(&synthetic(blocks), blocks, 1).expect("a whole trace");
        assert_eq!(t.len(), 6);
        let qkv = &t[0];
        assert_eq!(qkv.kind, 0);
        assert_eq!(qkv.period, 50.0);
        assert_eq!(qkv.loaded, 2.0);
        assert_eq!(qkv.staged, 5.0);
        assert_eq!(qkv.weight_wait, 10.0);
        assert_eq!(qkv.compute, 10.0);
        // 10, 12, 14 cycles from the last warp to the end.
        assert_eq!(qkv.tail, 6.0);
        assert_eq!(qkv.issue, 5.0);
        // Work: 60, 62, 64 cycles = 30, 31, 32 ns.
        assert_eq!(qkv.work_med, 31.0);
        assert_eq!(qkv.work_max, 32.0);
        // The last block (64 cycles) waits 36 cycles = 18 ns.
        assert_eq!(qkv.barrier_min, 18.0);
        assert_eq!(qkv.barrier_med, 19.0);
        let att = &t[1];
        assert_eq!((att.kind, att.staged, att.weight_wait, att.compute), (1, 0.0, 0.0, 0.0));
        let head = &t[5];
        assert_eq!(
            (head.kind, head.period, head.barrier_min, head.barrier_med),
            (5, 31.0, 0.0, 0.0)
        );
        let kinds = by_kind(&t);
        assert_eq!(kinds.len(), 6);
        assert_eq!(kinds[2], t[2]);
    }

    #[test]
    fn a_short_or_unclocked_trace_is_refused() {
        let w = synthetic(2);
        assert!(phase_times(&w[..w.len() - 1], 2, 1).is_none());
        let mut z = w.clone();
        z[DecodeStepTraceHeader::ClockEnd as usize] = z[DecodeStepTraceHeader::ClockStart as usize];
        assert!(phase_times(&z, 2, 1).is_none());
    }
}
