//! Data parallelism: one [`GpuEngine`] per listed GPU (a replica, the
//! weights uploaded once to each), a forward call's rows split into
//! contiguous ranges, one per replica, run concurrently and gathered on the
//! host in row order ([`Replicas`], `--devices`).
//!
//! Each replica runs on its own worker thread, which owns the engine and
//! takes jobs through a channel, so the replicas' launches and copies
//! overlap. Results equal one engine's row for row where the kernels agree:
//! a replica runs fewer rows than one engine would, and some kernels are
//! chosen by the row count (the GEMV or the tensor-core matmul, the fused
//! decode step up to its row limit), so logits agree within FP32 rounding,
//! not bitwise. Sampling draws row `r` of the whole batch from random
//! stream `r` on whichever replica holds it
//! ([`GpuEngine::set_sample_stream_offset`]), as one engine does.
//!
//! Batch generation ([`Backend::generate_batch`]) is spread further: rows
//! are independent, so each replica's worker runs the whole generation
//! loop ([`generate`]) on its own range of rows,
//! every replica at once with no handoff between threads per step (at 8-16
//! rows a GPU a step takes well under a millisecond, and that handoff cost
//! several percent); the tokens stream back to the caller's thread as they
//! are chosen and the results merge in row order. The step-wise methods
//! (`forward`, `argmax`, `sample`, `choose_and_step`) split each call as
//! above and serve the free `generate`, perplexity and tests.

use std::ops::Range;
use std::str::FromStr;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use anyhow::{Context, Result, anyhow, bail, ensure};
use gpu_kernels::params::sample::SampleRow;

use crate::generate::{Backend, ForwardLimits, Generation, LogitsWanted, check_forward_args, generate};
use crate::gpu::engine::{GpuEngine, Precision};
use crate::gpu::{Gpu, GpuError};
use crate::model::{ModelConfig, Weights};
use crate::prompt::{PromptLimits, check_prompts};
use crate::sample::Sampler;
use crate::serve::backend::{Draw, SlotBackend, SlotChunk, SlotToken, check_slot_chunks, check_slot_rows};

/// Split `b` rows over `n` replicas: contiguous ranges in row order, the
/// first `b % n` one row longer than the rest (a replica whose range is
/// empty sits the call out). No ranges for `n == 0`.
pub fn split_rows(b: usize, n: usize) -> Vec<Range<usize>> {
    if n == 0 {
        return Vec::new();
    }
    let (base, extra) = (b / n, b % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// `--devices`: which GPUs hold a replica each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceList {
    /// Every GPU the driver reports.
    All,
    /// These ordinals, in this order (one may repeat: two replicas on one GPU).
    List(Vec<usize>),
}

/// The word `--devices` takes for every GPU.
const ALL_DEVICES: &str = "all";

impl FromStr for DeviceList {
    type Err = String;

    /// `all`, or ordinals separated by commas (`0,1`).
    fn from_str(s: &str) -> Result<DeviceList, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case(ALL_DEVICES) {
            return Ok(DeviceList::All);
        }
        if s.is_empty() {
            return Err(format!(
                "empty device list (give GPU ordinals such as 0,1, or {ALL_DEVICES})"
            ));
        }
        s.split(',')
            .map(|item| {
                let item = item.trim();
                item.parse::<usize>().map_err(|_| {
                    format!("`{item}` in the device list `{s}` is not a GPU ordinal (give e.g. 0,1 or {ALL_DEVICES})")
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(DeviceList::List)
    }
}

impl DeviceList {
    /// The ordinals, checked against the devices the driver reports.
    pub fn resolve(&self) -> Result<Vec<usize>> {
        let count = device_count()?;
        match self {
            DeviceList::All => Ok((0..count).collect()),
            DeviceList::List(list) => {
                if let Some(bad) = list.iter().find(|&&d| d >= count) {
                    bail!("--devices lists GPU {bad}, but this machine has {count} (ordinals 0..{count})");
                }
                Ok(list.clone())
            }
        }
    }
}

/// How many GPUs the driver reports (an error where there is no driver or
/// no device).
pub fn device_count() -> Result<usize> {
    // Asking for an ordinal no machine has makes `Gpu::new` report the
    // count before it creates any context.
    match Gpu::new(usize::MAX) {
        Err(GpuError::BadOrdinal(_, count)) => Ok(usize::try_from(count).unwrap_or(0)),
        Err(e) => Err(e.into()),
        Ok(_) => bail!("the driver reported a GPU with ordinal {}", usize::MAX),
    }
}

/// An engine moved once, from the thread that made it to the worker that
/// owns it from then on.
struct SendEngine(GpuEngine);

// SAFETY: what keeps `GpuEngine` from being `Send` is cudarc's `CudaGraph`
// (the captured graphs of the decode step and of the slot interface; every
// other part is `Send`), which holds raw CUDA graph handles
// and does not declare itself `Send`. The driver lets any thread use such a
// handle while the owning context is current: cudarc binds the context
// before each launch, and destroying a graph needs none. The engine is
// moved once, before its worker runs any job, and afterwards only that
// worker touches it: no handle is ever used from two threads at once.
unsafe impl Send for SendEngine {}

/// A job for one replica's worker: it sends its own result back.
type Job = Box<dyn FnOnce(&mut GpuEngine) + Send>;

/// A sent job: its replica, and where its result comes (`None`: the job
/// could not be sent).
type Pending<R> = (usize, Option<mpsc::Receiver<Result<R>>>);

/// One replica: its GPU and the worker thread that owns its engine.
struct Worker {
    device: usize,
    /// `None` once the worker is known to be gone.
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// The worker's loop: run jobs until the channel closes. A job that panics
/// ends the thread; the job's dropped result channel tells the caller.
fn worker_loop(engine: SendEngine, jobs: mpsc::Receiver<Job>) {
    let mut engine = engine.0;
    // Make the engine's context current on this thread once (cudarc binds
    // it before its own calls; this covers any raw driver call that does
    // not). A failure here shows again in the first job's own calls, which
    // report it.
    let _ = engine.gpu().synchronize();
    while let Ok(job) = jobs.recv() {
        job(&mut engine);
    }
}

/// Text of a thread's panic payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// The rows each replica ran in the last successful `forward`.
#[derive(Clone, Debug)]
struct LastCall {
    b: usize,
    ranges: Vec<Range<usize>>,
}

/// Several GPT-2 engines, one per listed GPU, as one [`Backend`]: see the
/// module's documentation.
pub struct Replicas {
    workers: Vec<Worker>,
    config: ModelConfig,
    max_seq_len: usize,
    /// Rows each replica was built for.
    per_replica: usize,
    last: Option<LastCall>,
    /// Rows of the call at `pos0 = 0` the cache holds (a later call must
    /// split the same way, so each row's cache stays on its replica).
    started: Option<usize>,
    /// The settings of `prepare_sampling` (the `choose_and_step` fallback
    /// samples with them).
    prepared: Option<Vec<SampleRow>>,
    /// Slots of the server interface over all replicas: slot `s` is slot
    /// `s / n` of replica `s % n` (interleaved, so the lowest free slots
    /// spread over every GPU).
    slots: usize,
    /// The rows of the last slot call: per replica with rows, which rows of
    /// the call (in its order) it ran.
    slot_last: Option<Vec<(usize, Vec<usize>)>>,
}

impl Replicas {
    /// One engine on each of `devices` (an ordinal may repeat), uploaded
    /// concurrently, each sized for its share of `max_batch` rows (the first
    /// share of [`split_rows`]) of up to `max_seq_len` positions.
    pub fn new(
        devices: &[usize],
        weights: &Weights,
        max_batch: usize,
        max_seq_len: usize,
        precision: Precision,
    ) -> Result<Replicas> {
        ensure!(max_batch > 0, "replicas need a batch of at least 1 row");
        let per_replica = split_rows(max_batch, devices.len().max(1))[0].len();
        Self::build(devices, weights, max_batch, max_seq_len, move |gpu, w| {
            GpuEngine::new(gpu, w, per_replica, max_seq_len, precision)
        })
    }

    /// Replicas for a server ([`SlotBackend`]): `slots` sequences over all
    /// replicas (see [`GpuEngine::with_rows`] for `rows`, the activation
    /// rows of each), every engine's slot interface checked.
    pub fn for_slots(
        devices: &[usize],
        weights: &Weights,
        slots: usize,
        max_seq_len: usize,
        rows: usize,
        precision: Precision,
    ) -> Result<Replicas> {
        ensure!(slots > 0, "replicas need at least 1 slot");
        let per_replica = split_rows(slots, devices.len().max(1))[0].len();
        let rows = rows.max(per_replica);
        Self::build(devices, weights, slots, max_seq_len, move |gpu, w| {
            let engine = GpuEngine::with_rows(gpu, w, per_replica, max_seq_len, rows, precision)?;
            engine.check_slots()?;
            Ok(engine)
        })
    }

    /// One engine per device made by `make` on its own thread (uploads run
    /// concurrently), each moved to its worker; `max_batch` rows (or slots)
    /// in all.
    fn build(
        devices: &[usize],
        weights: &Weights,
        max_batch: usize,
        max_seq_len: usize,
        make: impl Fn(Gpu, &Weights) -> Result<GpuEngine> + Sync,
    ) -> Result<Replicas> {
        ensure!(!devices.is_empty(), "no GPU listed for the replicas");
        let per_replica = split_rows(max_batch, devices.len())[0].len();
        let make = &make;
        let engines: Vec<Result<SendEngine>> = std::thread::scope(|scope| {
            let handles: Vec<_> = devices
                .iter()
                .map(|&device| {
                    scope.spawn(move || -> Result<SendEngine> { Ok(SendEngine(make(Gpu::new(device)?, weights)?)) })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|p| Err(anyhow!("panicked: {}", panic_text(&*p))))
                })
                .collect()
        });
        let mut workers = Vec::with_capacity(devices.len());
        for (i, (engine, &device)) in engines.into_iter().zip(devices).enumerate() {
            let engine = engine.with_context(|| format!("making replica {i} on GPU {device}"))?;
            let (tx, rx) = mpsc::channel::<Job>();
            let thread = std::thread::Builder::new()
                .name(format!("replica-{i}-gpu-{device}"))
                .spawn(move || worker_loop(engine, rx))
                .with_context(|| format!("starting the worker thread of replica {i}"))?;
            workers.push(Worker {
                device,
                jobs: Some(tx),
                thread: Some(thread),
            });
        }
        Ok(Replicas {
            workers,
            config: weights.config,
            max_seq_len,
            per_replica,
            last: None,
            started: None,
            prepared: None,
            slots: max_batch,
            slot_last: None,
        })
    }

    /// How many replicas.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never true: [`Replicas::new`] needs a device.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The GPU of each replica, in order.
    pub fn devices(&self) -> Vec<usize> {
        self.workers.iter().map(|w| w.device).collect()
    }

    /// Rows all replicas together take in one call.
    pub fn max_batch(&self) -> usize {
        self.per_replica * self.workers.len()
    }

    /// Run `f(replica, engine)` on every replica concurrently (settings,
    /// inspection); results in replica order.
    pub fn with_each<R, F>(&mut self, f: F) -> Result<Vec<R>>
    where
        R: Send + 'static,
        F: Fn(usize, &mut GpuEngine) -> Result<R> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let jobs = (0..self.workers.len())
            .map(|i| {
                let f = Arc::clone(&f);
                (i, move |e: &mut GpuEngine| f(i, e))
            })
            .collect();
        self.dispatch(jobs)
    }

    /// Send each `(replica, job)` to its worker, then wait for all of them
    /// (so they run concurrently); results in the order given. Every job is
    /// waited for before an error returns, the first error naming its GPU.
    fn dispatch<R, F>(&mut self, jobs: Vec<(usize, F)>) -> Result<Vec<R>>
    where
        R: Send + 'static,
        F: FnOnce(&mut GpuEngine) -> Result<R> + Send + 'static,
    {
        let pending = self.send_jobs(jobs);
        self.wait_for(pending)
    }

    /// The first half of [`Replicas::dispatch`]: send each `(replica, job)`
    /// to its worker, without waiting. A job that cannot be sent (its
    /// worker is gone) is dropped here, with everything it holds.
    fn send_jobs<R, F>(&mut self, jobs: Vec<(usize, F)>) -> Vec<Pending<R>>
    where
        R: Send + 'static,
        F: FnOnce(&mut GpuEngine) -> Result<R> + Send + 'static,
    {
        let mut pending = Vec::with_capacity(jobs.len());
        for (i, job) in jobs {
            let (tx, rx) = mpsc::sync_channel::<Result<R>>(1);
            let boxed: Job = Box::new(move |engine: &mut GpuEngine| {
                // The caller may have stopped waiting (it never does
                // before every answer is in, but a send error is harmless).
                let _ = tx.send(job(engine));
            });
            let sent = match &self.workers[i].jobs {
                Some(jobs) => jobs.send(boxed).is_ok(),
                None => false,
            };
            pending.push((i, sent.then_some(rx)));
        }
        pending
    }

    /// The second half of [`Replicas::dispatch`]: wait for every sent job;
    /// results in the order sent, or the first error, naming its GPU.
    fn wait_for<R>(&mut self, pending: Vec<Pending<R>>) -> Result<Vec<R>> {
        let mut results = Vec::with_capacity(pending.len());
        let mut first_error = None;
        for (i, rx) in pending {
            let device = self.workers[i].device;
            let got = match rx.map(|rx| rx.recv()) {
                Some(Ok(result)) => result.with_context(|| format!("replica {i} on GPU {device}")),
                // The job was dropped unanswered, or never sent: the worker is gone.
                _ => Err(self.gone(i)),
            };
            match got {
                Ok(r) => results.push(r),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }

    /// The error for a worker that stopped, with its panic message (joining
    /// the thread, which has ended or is unwinding).
    fn gone(&mut self, i: usize) -> anyhow::Error {
        let w = &mut self.workers[i];
        w.jobs = None;
        let why = match w.thread.take().map(JoinHandle::join) {
            Some(Err(payload)) => format!("panicked: {}", panic_text(&*payload)),
            Some(Ok(())) => "stopped".to_string(),
            None => "stopped earlier".to_string(),
        };
        anyhow!("replica {i} on GPU {}: its worker thread {why}", w.device)
    }

    /// The last call's split, or an error naming `what` was called too early.
    fn last(&self, what: &str) -> Result<LastCall> {
        self.last
            .clone()
            .with_context(|| format!("{what}() called before a successful forward()"))
    }

    /// Run `f(range, engine)` on each replica with rows in the last call;
    /// the results in row order.
    fn on_active<R, F>(&mut self, what: &str, f: F) -> Result<Vec<R>>
    where
        R: Send + 'static,
        F: Fn(Range<usize>, &mut GpuEngine) -> Result<R> + Send + Sync + 'static,
    {
        let last = self.last(what)?;
        let f = Arc::new(f);
        let jobs = active(&last.ranges)
            .map(|(i, range)| {
                let f = Arc::clone(&f);
                (i, move |e: &mut GpuEngine| f(range, e))
            })
            .collect();
        self.dispatch(jobs)
    }
}

/// The replicas with rows, with their rows.
fn active(ranges: &[Range<usize>]) -> impl Iterator<Item = (usize, Range<usize>)> + '_ {
    ranges.iter().cloned().enumerate().filter(|(_, r)| !r.is_empty())
}

impl Drop for Replicas {
    fn drop(&mut self) {
        // Closing the channels ends the loops; each engine is dropped on
        // its own thread. A worker that panicked already reported it.
        for w in &mut self.workers {
            w.jobs = None;
        }
        for w in &mut self.workers {
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
        }
    }
}

impl Backend for Replicas {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Rows split by [`split_rows`]; a call at `pos0 > 0` must have the rows
    /// of the call at `pos0 = 0` it continues (the split follows `b`).
    fn forward(&mut self, tokens: &[u32], b: usize, t: usize, pos0: usize, want: LogitsWanted) -> Result<()> {
        self.last = None;
        self.slot_last = None;
        let (max_batch, v) = (self.max_batch(), self.config.vocab_size);
        check_forward_args(
            tokens,
            b,
            t,
            pos0,
            ForwardLimits {
                max_batch,
                max_seq_len: self.max_seq_len,
                vocab_size: v,
                built: "set of replicas",
            },
        )?;
        if pos0 == 0 {
            self.started = None;
        } else {
            ensure!(
                self.started == Some(b),
                "a call of {b} rows at position {pos0} continues a call of {} rows at position 0: replicas split the rows by their number, so a continuation must keep it",
                self.started.map_or("no".to_string(), |s| s.to_string())
            );
        }
        let ranges = split_rows(b, self.workers.len());
        let jobs = active(&ranges)
            .map(|(i, rows)| {
                let part = tokens[rows.start * t..rows.end * t].to_vec();
                (i, move |e: &mut GpuEngine| e.forward(&part, rows.len(), t, pos0, want))
            })
            .collect();
        self.dispatch(jobs)?;
        self.started = Some(b);
        self.last = Some(LastCall { b, ranges });
        Ok(())
    }

    fn logits(&mut self) -> Result<Vec<f32>> {
        concat(self.on_active("logits", |_, e| e.logits())?)
    }

    /// Each replica scores the targets of its own rows.
    fn crossentropy(&mut self, targets: &[u32]) -> Result<Vec<f64>> {
        let last = self.last("crossentropy")?;
        ensure!(
            targets.len().is_multiple_of(last.b),
            "crossentropy(): {} targets for a forward of {} rows",
            targets.len(),
            last.b
        );
        let per_row = targets.len() / last.b;
        let targets = Arc::new(targets.to_vec());
        concat(self.on_active("crossentropy", move |range, e| {
            e.crossentropy(&targets[range.start * per_row..range.end * per_row])
        })?)
    }

    fn argmax(&mut self) -> Result<Vec<u32>> {
        concat(self.on_active("argmax", |_, e| e.argmax())?)
    }

    fn prepare_sampling(&mut self, rows: Option<&[SampleRow]>) -> Result<()> {
        self.prepared = rows.map(<[SampleRow]>::to_vec);
        let Some(rows) = rows else {
            return self.with_each(|_, e| e.prepare_sampling(None)).map(drop);
        };
        let ranges = split_rows(rows.len(), self.workers.len());
        let jobs = ranges
            .into_iter()
            .enumerate()
            .map(|(i, range)| {
                let part = rows[range.clone()].to_vec();
                (i, move |e: &mut GpuEngine| {
                    if part.is_empty() {
                        return e.prepare_sampling(None);
                    }
                    e.set_sample_stream_offset(range.start)?;
                    e.prepare_sampling(Some(&part))
                })
            })
            .collect();
        self.dispatch(jobs).map(drop)
    }

    fn sample(&mut self, rows: &[SampleRow], pos: usize) -> Result<Vec<u32>> {
        let last = self.last("sample")?;
        ensure!(
            rows.len() == last.b,
            "sample(): {} rows of settings for a forward of {} rows",
            rows.len(),
            last.b
        );
        let rows = Arc::new(rows.to_vec());
        concat(self.on_active("sample", move |range, e| {
            e.set_sample_stream_offset(range.start)?;
            e.sample(&rows[range], pos)
        })?)
    }

    /// Every replica with rows chooses and steps; one that cannot (its
    /// engine answers `None`: another decode path at its row count) while
    /// another did is stepped here with `forward`, after choosing as
    /// `argmax` or `sample` would, so all rows advance together. `None`
    /// only when no replica queued a step.
    fn choose_and_step(&mut self, pos: usize) -> Result<Option<Vec<u32>>> {
        let last = self.last("choose_and_step")?;
        let first: Vec<Option<Vec<u32>>> = self.on_active("choose_and_step", move |_, e| e.choose_and_step(pos))?;
        if first.iter().all(Option::is_none) {
            return Ok(None);
        }
        // Sampling applies only when prepared for this batch, as in the engine.
        let prepared = self.prepared.clone().filter(|p| p.len() == last.b).map(Arc::new);
        let mut jobs = Vec::new();
        for ((i, range), ids) in active(&last.ranges).zip(&first) {
            if ids.is_some() {
                continue;
            }
            let prepared = prepared.clone();
            jobs.push((i, move |e: &mut GpuEngine| -> Result<Vec<u32>> {
                let ids = match &prepared {
                    Some(rows) => {
                        e.set_sample_stream_offset(range.start)?;
                        e.sample(&rows[range.clone()], pos)?
                    }
                    None => e.argmax()?,
                };
                e.forward(&ids, range.len(), 1, pos, LogitsWanted::Last)?;
                Ok(ids)
            }));
        }
        let mut stepped = self.dispatch(jobs)?.into_iter();
        let mut out = Vec::with_capacity(last.b);
        for ids in first {
            match ids {
                Some(ids) => out.extend(ids),
                None => out.extend(stepped.next().context("a replica's step is missing")?),
            }
        }
        Ok(Some(out))
    }

    /// The whole generation loop ([`generate`], the one policy) on each
    /// replica's rows ([`split_rows`]) on its worker, all replicas at
    /// once and without a handoff per step: a replica's engine draws its
    /// rows from their streams of the whole batch
    /// ([`GpuEngine::set_sample_stream_offset`]), so every row's tokens are
    /// one engine's (where the logits agree: see the module's
    /// documentation). Each worker sends its tokens to this thread as they
    /// are chosen, which calls `on_token` with the batch's row while it
    /// waits for all of them; a worker that dies ends its part of the wait.
    /// The parts merge in row order ([`Generation::merge_concurrent`]:
    /// times are the slowest replica's). Every replica is waited for; the
    /// first error names its replica and GPU.
    ///
    /// Afterwards the replicas hold no call: each engine's cache stopped
    /// at its own position (a replica whose rows all ended stops early),
    /// so `logits`, `sample` and the like answer "before a successful
    /// forward()", and a `forward` must start at position 0.
    fn generate_batch(
        &mut self,
        prompts: &[Vec<u32>],
        max_new_tokens: usize,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Generation> {
        // Forget the last call first, so that even a failure leaves none
        // that a continuation could build on: the engines run their own
        // calls now. `prepared` is cleared on each engine too (below).
        self.last = None;
        self.started = None;
        self.prepared = None;
        self.slot_last = None;
        // The checks `generate` makes, here on the whole batch, so a bad
        // prompt fails before any replica starts and is named by its
        // index in the batch.
        check_prompts(
            prompts,
            Some(PromptLimits {
                context: self.max_seq_len,
                vocab_size: self.config.vocab_size,
            }),
        )?;
        let (b, max_batch) = (prompts.len(), self.max_batch());
        ensure!(
            b <= max_batch,
            "batch of {b} rows exceeds the {max_batch} this set of replicas was built for"
        );
        let ranges = split_rows(b, self.workers.len());
        let (token_tx, token_rx) = mpsc::channel::<(usize, u32)>();
        let jobs = active(&ranges)
            .map(|(i, rows)| {
                let part = prompts[rows.clone()].to_vec();
                // Each worker samples with its own copy of the sampler.
                // `generate` reads only its settings: the draws are keyed by
                // (seed, row, position), the rows by the stream offset, and
                // the sampler's own counter (`Sampler::sample`'s) is never
                // advanced, so one engine leaves the caller's sampler as it
                // was, and so do the replicas (the copies are dropped).
                let mut sampler = sampler.clone();
                let tokens = token_tx.clone();
                (i, move |e: &mut GpuEngine| -> Result<Generation> {
                    e.set_sample_stream_offset(rows.start)?;
                    let generated = generate(e, &part, max_new_tokens, &mut sampler, |r, id| {
                        // The caller listens until every worker is done
                        // (unless `on_token` panicked): an error is harmless.
                        let _ = tokens.send((rows.start + r, id));
                    });
                    // As `prepared` above: no settings for a later step.
                    let cleared = e.prepare_sampling(None);
                    let generated = generated?;
                    cleared?;
                    Ok(generated)
                })
            })
            .collect();
        let pending = self.send_jobs(jobs);
        // The workers' jobs hold the only senders now: the loop ends when
        // every job is done, failed, dropped unsent, or dropped by a
        // worker that panicked.
        drop(token_tx);
        for (row, id) in token_rx {
            on_token(row, id);
        }
        let parts = self.wait_for(pending)?;
        Ok(Generation::merge_concurrent(parts))
    }
}

impl Replicas {
    /// The replica and its own slot of slot `slot` (interleaved).
    fn slot_home(&self, slot: usize) -> (usize, usize) {
        let n = self.workers.len();
        (slot % n, slot / n)
    }

    /// The replicas that hold any of `slots`, each with the indices (into
    /// `slots`) of the ones it holds, in order.
    fn group_by_home(&self, slots: impl Iterator<Item = usize>) -> Vec<(usize, Vec<usize>)> {
        let mut groups: Vec<(usize, Vec<usize>)> = (0..self.workers.len()).map(|i| (i, Vec::new())).collect();
        for (k, slot) in slots.enumerate() {
            groups[self.slot_home(slot).0].1.push(k);
        }
        groups.retain(|(_, idx)| !idx.is_empty());
        groups
    }

    /// Run `f(rows, engine)` on each replica of the last slot call with the
    /// indices of its rows; each answers `per_row` values a row, put back
    /// in the call's row order.
    fn on_slot_rows<T, F>(&mut self, what: &str, per_row: usize, f: F) -> Result<Vec<T>>
    where
        T: Clone + Default + Send + 'static,
        F: Fn(&[usize], &mut GpuEngine) -> Result<Vec<T>> + Send + Sync + 'static,
    {
        let groups = self
            .slot_last
            .clone()
            .with_context(|| format!("{what}() called before a successful prefill() or decode()"))?;
        let rows: usize = groups.iter().map(|(_, idx)| idx.len()).sum();
        let f = Arc::new(f);
        let jobs = groups
            .iter()
            .map(|(i, idx)| {
                let (f, idx) = (Arc::clone(&f), idx.clone());
                (*i, move |e: &mut GpuEngine| f(&idx, e))
            })
            .collect();
        let parts: Vec<Vec<T>> = self.dispatch(jobs)?;
        let mut out = vec![T::default(); rows * per_row];
        for ((_, idx), part) in groups.iter().zip(parts) {
            ensure!(
                part.len() == idx.len() * per_row,
                "{what}(): a replica answered {} values for {} rows",
                part.len(),
                idx.len()
            );
            for (k, &r) in idx.iter().enumerate() {
                out[r * per_row..(r + 1) * per_row].clone_from_slice(&part[k * per_row..(k + 1) * per_row]);
            }
        }
        Ok(out)
    }
}

/// The server's interface: slot `s` lives on replica `s % n` (as its slot
/// `s / n`); a decode step runs every replica's rows concurrently, and the
/// choices and logits come back in the step's row order. Sampling follows
/// each row's [`Draw`] (its own stream), so it needs no offset.
impl SlotBackend for Replicas {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn slots(&self) -> usize {
        self.slots
    }

    fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Each replica prefills its own slots' chunks, all replicas at once.
    fn prefill_chunks(&mut self, chunks: &[SlotChunk<'_>]) -> Result<()> {
        self.slot_last = None;
        self.last = None;
        check_slot_chunks(chunks, self.slots, self.max_seq_len, self.config.vocab_size)?;
        let groups = self.group_by_home(chunks.iter().map(|ch| ch.slot));
        let jobs = groups
            .iter()
            .map(|(i, idx)| {
                // (local slot, tokens, pos0) of each of this replica's chunks.
                let mine: Vec<(usize, Vec<u32>, usize)> = idx
                    .iter()
                    .map(|&k| {
                        (
                            self.slot_home(chunks[k].slot).1,
                            chunks[k].tokens.to_vec(),
                            chunks[k].pos0,
                        )
                    })
                    .collect();
                (*i, move |e: &mut GpuEngine| {
                    let local: Vec<SlotChunk<'_>> = mine
                        .iter()
                        .map(|(slot, tokens, pos0)| SlotChunk {
                            slot: *slot,
                            tokens,
                            pos0: *pos0,
                        })
                        .collect();
                    e.prefill_chunks(&local)
                })
            })
            .collect();
        self.dispatch(jobs)?;
        self.slot_last = Some(groups);
        Ok(())
    }

    fn decode(&mut self, rows: &[SlotToken]) -> Result<()> {
        self.slot_last = None;
        self.last = None;
        check_slot_rows(rows, self.slots, self.max_seq_len, self.config.vocab_size)?;
        let groups = self.group_by_home(rows.iter().map(|r| r.slot));
        let jobs = groups
            .iter()
            .map(|(i, idx)| {
                let local: Vec<SlotToken> = idx
                    .iter()
                    .map(|&r| SlotToken {
                        slot: self.slot_home(rows[r].slot).1,
                        ..rows[r]
                    })
                    .collect();
                (*i, move |e: &mut GpuEngine| SlotBackend::decode(e, &local))
            })
            .collect();
        self.dispatch(jobs)?;
        self.slot_last = Some(groups);
        Ok(())
    }

    fn choose(&mut self, draws: &[Draw]) -> Result<Vec<u32>> {
        let rows: usize = self.slot_last.iter().flatten().map(|(_, idx)| idx.len()).sum();
        ensure!(draws.len() == rows, "choose(): {} draws for {rows} rows", draws.len());
        let draws = Arc::new(draws.to_vec());
        self.on_slot_rows("choose", 1, move |idx, e| {
            let mine: Vec<Draw> = idx.iter().map(|&r| draws[r]).collect();
            e.choose(&mine)
        })
    }

    fn slot_logits(&mut self) -> Result<Vec<f32>> {
        let vp = self.config.padded_vocab_size;
        self.on_slot_rows("slot_logits", vp, |_, e| e.slot_logits())
    }
}

/// The replicas' parts in row order as one vector (the first part grows in
/// place).
fn concat<T: Clone>(parts: Vec<Vec<T>>) -> Result<Vec<T>> {
    let mut parts = parts.into_iter();
    let mut out = parts.next().context("no replica had rows")?;
    for p in parts {
        out.extend_from_slice(&p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rows_is_contiguous_balanced_and_in_order() {
        assert_eq!(split_rows(3, 2), vec![0..2, 2..3]);
        assert_eq!(split_rows(1, 2), vec![0..1, 1..1]);
        assert_eq!(split_rows(16, 2), vec![0..8, 8..16]);
        assert_eq!(split_rows(5, 3), vec![0..2, 2..4, 4..5]);
        assert_eq!(split_rows(0, 2), vec![0..0, 0..0]);
        assert!(split_rows(4, 0).is_empty());
        for b in 0..40 {
            for n in 1..9 {
                let ranges = split_rows(b, n);
                assert_eq!(ranges.len(), n);
                let mut next = 0;
                for r in &ranges {
                    assert_eq!(r.start, next, "b = {b}, n = {n}: {ranges:?}");
                    next = r.end;
                }
                assert_eq!(next, b);
                let (lo, hi) = (b / n, b.div_ceil(n));
                assert!(ranges.iter().all(|r| r.len() == lo || r.len() == hi), "{ranges:?}");
                // Longer ranges first: the first replica is sized for the rest.
                assert!(ranges.windows(2).all(|w| w[0].len() >= w[1].len()), "{ranges:?}");
            }
        }
    }

    #[test]
    fn device_lists_parse_or_say_why_not() {
        assert_eq!("all".parse(), Ok(DeviceList::All));
        assert_eq!("ALL".parse(), Ok(DeviceList::All));
        assert_eq!("0,1".parse(), Ok(DeviceList::List(vec![0, 1])));
        assert_eq!(" 0 , 0 ".parse(), Ok(DeviceList::List(vec![0, 0])));
        assert_eq!("3".parse(), Ok(DeviceList::List(vec![3])));
        for bad in ["", " ", "0,", ",1", "0,,1", "a", "-1", "1.5", "0;1"] {
            let err = bad.parse::<DeviceList>().expect_err(bad);
            assert!(err.contains("device list"), "{bad:?}: {err}");
        }
        assert!("0,x".parse::<DeviceList>().unwrap_err().contains("`x`"));
    }
}
