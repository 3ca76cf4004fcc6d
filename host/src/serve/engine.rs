//! The continuous-batching scheduler: one thread owns the [`SlotBackend`]
//! and loops over
//!
//! 1. take new jobs from the channel, drop those whose client is gone;
//! 2. admit waiting jobs into free slots (first come, first served);
//! 3. prefill the admitted prompts, at most `prefill_chunk` tokens per
//!    iteration in all, in one call (a long prompt takes several
//!    iterations, so it never stalls the running sequences for long);
//! 4. one decode step over every sequence past its prompt, in the same
//!    call as the prefill when there is one;
//! 5. send each sequence's new text to its client; free the slot of a
//!    sequence that finished or whose client disconnected.
//!
//! Text is detokenized per sequence as tokens arrive (a UTF-8 character
//! split over tokens is held until complete) and filtered for stop strings
//! (text that could begin a stop string is held until it cannot).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::Result;
use gpu_kernels::params::sample::SampleRow;
use tokio::sync::mpsc::UnboundedSender;

use super::api::FinishReason;
use super::backend::{Draw, SlotBackend, SlotChunk, SlotToken};
use crate::model::config::EOT_TOKEN;
use crate::tokenizer::{Gpt2Tokenizer, StreamDecoder};

/// The tokens/s gauge averages over windows of this length.
const RATE_WINDOW: Duration = Duration::from_secs(1);

/// One prompt to complete (a request with several prompts sends one job each).
pub struct Job {
    /// The choice index in the reply; also the sampling stream (the batch
    /// row of the CLI run with the same prompts).
    pub index: usize,
    pub prompt: Vec<u32>,
    /// At least 1; prompt + max_tokens fits the context (checked by the caller).
    pub max_tokens: usize,
    pub settings: SampleRow,
    pub stop: Vec<String>,
    /// Where this job's events go; closed when the client is gone.
    pub events: UnboundedSender<Event>,
}

/// What the engine tells a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New text of choice `index`.
    Text { index: usize, text: String },
    /// Choice `index` is complete.
    Done {
        index: usize,
        finish: FinishReason,
        completion_tokens: usize,
    },
    /// The backend failed on this choice.
    Failed { index: usize, message: String },
}

/// Messages to the engine thread.
pub enum Command {
    /// Jobs to queue (already counted in [`Metrics::queued`]).
    Submit(Vec<Job>),
    /// End every running and waiting job now (the shutdown grace period is over).
    CancelAll,
}

/// Counters shared by the engine and the HTTP side (`/metrics`, `/health`,
/// admission).
#[derive(Debug, Default)]
pub struct Metrics {
    /// Jobs submitted and not yet in a slot.
    pub queued: AtomicUsize,
    /// Sequences holding a slot (prefilling or decoding).
    pub running: AtomicUsize,
    /// KV cache positions held by the running sequences.
    pub kv_positions: AtomicUsize,
    pub generated_tokens_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub requests_total: AtomicU64,
    pub rejected_total: AtomicU64,
    /// Generated tokens per second over the last window, as f64 bits.
    pub tokens_per_second_bits: AtomicU64,
    /// Set when the engine thread has ended (it never does while serving).
    pub engine_stopped: AtomicBool,
}

impl Metrics {
    pub fn tokens_per_second(&self) -> f64 {
        f64::from_bits(self.tokens_per_second_bits.load(Ordering::Relaxed))
    }
}

/// Scheduler settings.
#[derive(Clone, Copy, Debug)]
pub struct SchedulerConfig {
    /// Prompt tokens prefilled per iteration, over all new sequences.
    pub prefill_chunk: usize,
    /// Pause after each iteration (tests of queueing and cancellation
    /// hold slots with it; 0 in normal use).
    pub step_delay: Duration,
}

/// Holds back text that may be the start of a stop string.
struct StopFilter {
    stops: Vec<String>,
    held: String,
}

impl StopFilter {
    /// Adds text; returns what may be sent, and whether a stop string
    /// appeared (the text before it is returned, nothing after).
    fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // The longest tail that is a proper start of some stop string stays.
        let held = &self.held;
        let keep_from = (0..held.len())
            .filter(|&j| held.is_char_boundary(j))
            .find(|&j| self.stops.iter().any(|s| s.starts_with(&held[j..])))
            .unwrap_or(held.len());
        let out = held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// The held text, at the end of a sequence that did not stop on a string.
    fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// A sequence in a slot.
struct Seq<'t> {
    job: Job,
    slot: usize,
    /// Prompt tokens in the cache.
    prefilled: usize,
    /// The token to feed at `feed_pos` in the next decode step, once past the prompt.
    next: Option<u32>,
    feed_pos: usize,
    generated: usize,
    decoder: StreamDecoder<'t>,
    filter: StopFilter,
    done: bool,
}

impl<'t> Seq<'t> {
    fn new(job: Job, slot: usize, tokenizer: &'t Gpt2Tokenizer) -> Seq<'t> {
        let filter = StopFilter {
            stops: job.stop.clone(),
            held: String::new(),
        };
        Seq {
            job,
            slot,
            prefilled: 0,
            next: None,
            feed_pos: 0,
            generated: 0,
            decoder: tokenizer.stream_decoder(),
            filter,
            done: false,
        }
    }

    /// The draw for the token that will take position `pos`.
    fn draw(&self, pos: usize) -> Draw {
        Draw {
            settings: self.job.settings,
            // Positions are below the slot length, far below u32::MAX.
            counter: u32::try_from(pos).unwrap_or(u32::MAX),
            stream: u32::try_from(self.job.index).unwrap_or(u32::MAX),
        }
    }

    /// Positions this sequence holds in the cache.
    fn positions(&self) -> usize {
        if self.next.is_some() {
            self.feed_pos
        } else {
            self.prefilled
        }
    }

    fn send(&mut self, event: Event) {
        if self.job.events.send(event).is_err() {
            // The client is gone: nothing more to do for it.
            self.done = true;
        }
    }

    fn send_text(&mut self, text: String) {
        if !text.is_empty() {
            let index = self.job.index;
            self.send(Event::Text { index, text });
        }
    }

    fn finish(&mut self, finish: FinishReason) {
        let index = self.job.index;
        let completion_tokens = self.generated;
        self.send(Event::Done {
            index,
            finish,
            completion_tokens,
        });
        self.done = true;
    }

    /// Flushes held text at an end that is not a stop string, then finishes.
    fn finish_flushing(&mut self, finish: FinishReason) {
        let tail = self.decoder.finish().unwrap_or_default();
        let (mut text, stopped) = self.filter.push(&tail);
        if stopped {
            self.send_text(text);
            return self.finish(FinishReason::Stop);
        }
        text.push_str(&self.filter.finish());
        self.send_text(text);
        self.finish(finish);
    }

    /// Takes the token chosen for position `pos`.
    fn accept(&mut self, id: u32, pos: usize, max_seq_len: usize, metrics: &Metrics) {
        if id == EOT_TOKEN {
            return self.finish_flushing(FinishReason::Stop);
        }
        self.generated += 1;
        metrics.generated_tokens_total.fetch_add(1, Ordering::Relaxed);
        let piece = self.decoder.push(id).unwrap_or_default();
        let (text, stopped) = self.filter.push(&piece);
        self.send_text(text);
        if stopped {
            return self.finish(FinishReason::Stop);
        }
        if self.generated >= self.job.max_tokens || pos + 1 >= max_seq_len {
            return self.finish_flushing(FinishReason::Length);
        }
        self.next = Some(id);
        self.feed_pos = pos;
    }
}

/// Runs the scheduler until the command channel is closed and every job is
/// done (or cancelled).
pub fn run(
    backend: &mut dyn SlotBackend,
    tokenizer: &Gpt2Tokenizer,
    commands: Receiver<Command>,
    config: SchedulerConfig,
    metrics: &Metrics,
) {
    let max_seq_len = backend.max_seq_len();
    let mut free: Vec<usize> = (0..backend.slots()).rev().collect();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut seqs: Vec<Seq<'_>> = Vec::new();
    let mut closed = false;
    let mut rate_start = Instant::now();
    let mut rate_base = 0u64;
    let prefill_chunk = config.prefill_chunk.max(1);

    loop {
        // 1. Intake: block only when idle.
        let mut cancel_all = false;
        if seqs.is_empty() && waiting.is_empty() {
            metrics.tokens_per_second_bits.store(0f64.to_bits(), Ordering::Relaxed);
            if closed {
                break;
            }
            match commands.recv() {
                Ok(cmd) => take(cmd, &mut waiting, &mut cancel_all),
                Err(_) => closed = true,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(cmd) => take(cmd, &mut waiting, &mut cancel_all),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if cancel_all {
            // Dropping a job's sender ends its client's stream.
            metrics.queued.fetch_sub(waiting.len(), Ordering::Relaxed);
            waiting.clear();
            for s in &mut seqs {
                s.done = true;
            }
        }
        let before = waiting.len();
        waiting.retain(|j| !j.events.is_closed());
        metrics.queued.fetch_sub(before - waiting.len(), Ordering::Relaxed);
        for s in &mut seqs {
            if s.job.events.is_closed() {
                s.done = true;
            }
        }
        release(&mut seqs, &mut free);

        // 2. Admission.
        while !waiting.is_empty() {
            let Some(slot) = free.pop() else { break };
            if let Some(job) = waiting.pop_front() {
                metrics.queued.fetch_sub(1, Ordering::Relaxed);
                seqs.push(Seq::new(job, slot, tokenizer));
            }
        }
        // Before any text of the new sequences goes out.
        metrics.running.store(seqs.len(), Ordering::Relaxed);

        // 3. Prefill, chunked, oldest first: each new sequence's next chunk
        // within the budget, all of them in one call.
        let mut budget = prefill_chunk;
        let mut batch: Vec<Piece> = Vec::new();
        for (i, s) in seqs.iter().enumerate() {
            if budget == 0 {
                break;
            }
            if s.done || s.next.is_some() {
                continue;
            }
            let n = (s.job.prompt.len() - s.prefilled).min(budget);
            if n > 0 {
                batch.push((i, s.prefilled, s.prefilled + n));
                budget -= n;
            }
        }
        // While prompts are prefilled, the running sequences' decode rows
        // join the same call (a chunk of one token each), so they do not
        // wait for the prefill. If that call fails, steps 3 and 4 run apart.
        let decoding: Vec<usize> = (0..seqs.len())
            .filter(|&i| !seqs[i].done && seqs[i].next.is_some())
            .collect();
        let mixed = !batch.is_empty()
            && !decoding.is_empty()
            && mixed_step(backend, &mut seqs, &batch, &decoding, max_seq_len, metrics);
        if !mixed && !batch.is_empty() {
            // If the joint call fails, each chunk alone, so that only the
            // sequence at fault fails.
            let outcome = prefill_batch(backend, &seqs, &batch);
            let parts: Vec<(&[Piece], Result<Vec<u32>>)> = match outcome {
                Ok(ids) => vec![(&batch[..], Ok(ids))],
                Err(_) if batch.len() > 1 => batch
                    .chunks(1)
                    .map(|one| (one, prefill_batch(backend, &seqs, one)))
                    .collect(),
                Err(e) => vec![(&batch[..], Err(e))],
            };
            for (part, outcome) in parts {
                match outcome {
                    Ok(ids) => {
                        for (k, &(i, _, to)) in part.iter().enumerate() {
                            let s = &mut seqs[i];
                            s.prefilled = to;
                            if to == s.job.prompt.len()
                                && let Some(&id) = ids.get(k)
                            {
                                s.accept(id, to, max_seq_len, metrics);
                            }
                        }
                    }
                    Err(e) => {
                        for &(i, ..) in part {
                            fail(&mut seqs[i], &e);
                        }
                    }
                }
            }
        }

        // 4. One decode step over the sequences past their prompts (unless
        // they stepped with the prefill).
        let stepping: Vec<usize> = (0..seqs.len())
            .filter(|&i| !mixed && !seqs[i].done && seqs[i].next.is_some())
            .collect();
        if !stepping.is_empty() {
            let rows: Vec<SlotToken> = stepping
                .iter()
                .map(|&i| SlotToken {
                    slot: seqs[i].slot,
                    token: seqs[i].next.unwrap_or(EOT_TOKEN),
                    pos: seqs[i].feed_pos,
                })
                .collect();
            let draws: Vec<Draw> = stepping.iter().map(|&i| seqs[i].draw(seqs[i].feed_pos + 1)).collect();
            match backend.decode(&rows).and_then(|()| backend.choose(&draws)) {
                Ok(ids) => {
                    for (&i, id) in stepping.iter().zip(ids) {
                        let pos = seqs[i].feed_pos + 1;
                        seqs[i].accept(id, pos, max_seq_len, metrics);
                    }
                }
                Err(e) => {
                    for &i in &stepping {
                        fail(&mut seqs[i], &e);
                    }
                }
            }
        }

        // 5. Free the slots of finished sequences; update the gauges.
        release(&mut seqs, &mut free);
        metrics.running.store(seqs.len(), Ordering::Relaxed);
        metrics
            .kv_positions
            .store(seqs.iter().map(Seq::positions).sum(), Ordering::Relaxed);
        let elapsed = rate_start.elapsed();
        if elapsed >= RATE_WINDOW {
            let total = metrics.generated_tokens_total.load(Ordering::Relaxed);
            let rate = (total - rate_base) as f64 / elapsed.as_secs_f64();
            metrics.tokens_per_second_bits.store(rate.to_bits(), Ordering::Relaxed);
            rate_base = total;
            rate_start = Instant::now();
        }
        if !config.step_delay.is_zero() && !seqs.is_empty() {
            std::thread::sleep(config.step_delay);
        }
    }
    metrics.running.store(0, Ordering::Relaxed);
    metrics.kv_positions.store(0, Ordering::Relaxed);
}

/// Steps 3 and 4 as one call: the prefill chunks `batch`, then one chunk a
/// sequence of `decoding` (its next token at its position); every row is
/// chosen for (a chunk that does not end its prompt is drawn for and
/// ignored). Applies the results and answers true, or changes nothing and
/// answers false when the backend refused or failed.
fn mixed_step(
    backend: &mut dyn SlotBackend,
    seqs: &mut [Seq<'_>],
    batch: &[Piece],
    decoding: &[usize],
    max_seq_len: usize,
    metrics: &Metrics,
) -> bool {
    let ids = {
        let next: Vec<u32> = decoding.iter().map(|&i| seqs[i].next.unwrap_or(EOT_TOKEN)).collect();
        let mut chunks = piece_chunks(seqs, batch);
        chunks.extend(decoding.iter().zip(&next).map(|(&i, token)| SlotChunk {
            slot: seqs[i].slot,
            tokens: std::slice::from_ref(token),
            pos0: seqs[i].feed_pos,
        }));
        let mut draws = piece_draws(seqs, batch);
        draws.extend(decoding.iter().map(|&i| seqs[i].draw(seqs[i].feed_pos + 1)));
        match backend.prefill_chunks(&chunks).and_then(|()| backend.choose(&draws)) {
            Ok(ids) if ids.len() == draws.len() => ids,
            _ => return false,
        }
    };
    let (for_prefill, for_decode) = ids.split_at(batch.len());
    for (&(i, _, to), &id) in batch.iter().zip(for_prefill) {
        let s = &mut seqs[i];
        s.prefilled = to;
        if to == s.job.prompt.len() {
            s.accept(id, to, max_seq_len, metrics);
        }
    }
    for (&i, &id) in decoding.iter().zip(for_decode) {
        let pos = seqs[i].feed_pos + 1;
        seqs[i].accept(id, pos, max_seq_len, metrics);
    }
    true
}

/// One sequence's chunk of a prefill call: (index in the running
/// sequences, first and end index in its prompt).
type Piece = (usize, usize, usize);

/// One prefill call over the chunks `batch` of `seqs`; the
/// next token of each chunk when any of them ends its prompt (those that
/// do not are drawn for and ignored), else nothing.
fn prefill_batch(backend: &mut dyn SlotBackend, seqs: &[Seq<'_>], batch: &[Piece]) -> Result<Vec<u32>> {
    backend.prefill_chunks(&piece_chunks(seqs, batch))?;
    if batch.iter().any(|&(i, _, to)| to == seqs[i].job.prompt.len()) {
        backend.choose(&piece_draws(seqs, batch))
    } else {
        Ok(Vec::new())
    }
}

/// The backend's chunks of the prefill pieces `batch` of `seqs`.
fn piece_chunks<'a>(seqs: &'a [Seq<'_>], batch: &[Piece]) -> Vec<SlotChunk<'a>> {
    batch
        .iter()
        .map(|&(i, from, to)| SlotChunk {
            slot: seqs[i].slot,
            tokens: &seqs[i].job.prompt[from..to],
            pos0: from,
        })
        .collect()
}

/// The draw of each piece's last token (used when it ends its prompt).
fn piece_draws(seqs: &[Seq<'_>], batch: &[Piece]) -> Vec<Draw> {
    batch.iter().map(|&(i, _, to)| seqs[i].draw(to)).collect()
}

fn take(cmd: Command, waiting: &mut VecDeque<Job>, cancel_all: &mut bool) {
    match cmd {
        Command::Submit(jobs) => waiting.extend(jobs),
        Command::CancelAll => *cancel_all = true,
    }
}

/// Reports a backend error to a sequence's client and ends it.
fn fail(s: &mut Seq<'_>, e: &anyhow::Error) {
    let index = s.job.index;
    s.send(Event::Failed {
        index,
        message: format!("the model failed: {e:#}"),
    });
    s.done = true;
}

/// Removes finished sequences, returning their slots. `free` stays sorted
/// from the highest slot to the lowest, so admission (`pop`) hands out the
/// lowest free slot: a GPU decode step runs the rows up to the highest busy
/// slot, so low slots keep it short.
fn release(seqs: &mut Vec<Seq<'_>>, free: &mut Vec<usize>) {
    let before = free.len();
    seqs.retain(|s| {
        if s.done {
            free.push(s.slot);
        }
        !s.done
    });
    if free.len() != before {
        free.sort_unstable_by(|a, b| b.cmp(a));
    }
}

#[cfg(test)]
mod tests {
    use super::StopFilter;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter {
            stops: stops.iter().map(|s| s.to_string()).collect(),
            held: String::new(),
        };
        let mut out = String::new();
        for p in pieces {
            let (text, stopped) = f.push(p);
            out.push_str(&text);
            if stopped {
                return (out, true);
            }
        }
        out.push_str(&f.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_cut_across_pieces() {
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
        assert_eq!(run(&["END"], &["xE", "N", "Dy"]), ("x".into(), true));
        assert_eq!(run(&["END"], &["xE", "N", "y"]), ("xENy".into(), false));
        assert_eq!(run(&["bc", "ab"], &["zab"]), ("z".into(), true));
        assert_eq!(run(&["é!"], &["aé", "é!"]), ("aé".into(), true));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn held_text_is_not_sent_early() {
        let mut f = StopFilter {
            stops: vec!["STOP".into()],
            held: String::new(),
        };
        assert_eq!(f.push("abcST"), ("abc".into(), false));
        assert_eq!(f.push("x"), ("STx".into(), false));
    }

    /// A backend that plays a script: the token chosen for position `p` is
    /// `script[p - PROMPT_LEN]`, whatever the slot (every job of these tests
    /// has a prompt of `PROMPT_LEN` tokens). It checks the scheduler's calls.
    struct Script {
        config: crate::model::ModelConfig,
        script: Vec<u32>,
        rows: usize,
        /// Prefill calls (slot, len, pos0) and decode rows, in order.
        prefills: Vec<(usize, usize, usize)>,
        decoded: Vec<super::SlotToken>,
        /// Prefill calls that carried decode rows too.
        mixed_calls: usize,
    }

    const PROMPT_LEN: usize = 5;
    const SLOTS: usize = 2;
    const MAX_SEQ_LEN: usize = 32;

    impl super::SlotBackend for Script {
        fn config(&self) -> &crate::model::ModelConfig {
            &self.config
        }
        fn slots(&self) -> usize {
            SLOTS
        }
        fn max_seq_len(&self) -> usize {
            MAX_SEQ_LEN
        }
        fn prefill_chunks(&mut self, chunks: &[super::SlotChunk<'_>]) -> anyhow::Result<()> {
            let prompts = chunks.iter().filter(|ch| ch.pos0 < PROMPT_LEN).count();
            if prompts > 0 && prompts < chunks.len() {
                self.mixed_calls += 1;
            }
            for ch in chunks {
                // Past the prompt: a decode row that stepped with a prefill.
                if ch.pos0 >= PROMPT_LEN {
                    self.decoded.push(super::SlotToken {
                        slot: ch.slot,
                        token: ch.tokens[0],
                        pos: ch.pos0,
                    });
                } else {
                    self.prefills.push((ch.slot, ch.tokens.len(), ch.pos0));
                }
            }
            self.rows = chunks.len();
            Ok(())
        }
        fn decode(&mut self, rows: &[super::SlotToken]) -> anyhow::Result<()> {
            self.decoded.extend_from_slice(rows);
            self.rows = rows.len();
            Ok(())
        }
        fn choose(&mut self, draws: &[super::Draw]) -> anyhow::Result<Vec<u32>> {
            assert_eq!(draws.len(), self.rows);
            // A chunk that does not end its prompt is drawn for and ignored.
            Ok(draws
                .iter()
                .map(|d| {
                    (d.counter as usize)
                        .checked_sub(PROMPT_LEN)
                        .map_or(0, |i| self.script[i])
                })
                .collect())
        }
        fn slot_logits(&mut self) -> anyhow::Result<Vec<f32>> {
            anyhow::bail!("the scripted backend has no logits")
        }
    }

    /// Runs the scheduler over `jobs` (stop strings, max_tokens) with the
    /// script; each job's events, and the backend afterwards.
    fn schedule(script: Vec<u32>, jobs: &[(&[&str], usize)], chunk: usize) -> (Vec<Vec<super::Event>>, Script) {
        use crate::tokenizer::Gpt2Tokenizer;
        let tokenizer = Gpt2Tokenizer::default_files().unwrap();
        let mut backend = Script {
            config: crate::model::ModelConfig {
                max_seq_len: MAX_SEQ_LEN,
                vocab_size: 50257,
                padded_vocab_size: 50304,
                num_layers: 1,
                num_heads: 1,
                channels: 4,
            },
            script,
            rows: 0,
            prefills: Vec::new(),
            decoded: Vec::new(),
            mixed_calls: 0,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let mut receivers = Vec::new();
        let mut batch = Vec::new();
        for (stops, max_tokens) in jobs {
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            receivers.push(erx);
            batch.push(super::Job {
                index: 0,
                prompt: vec![1; PROMPT_LEN],
                max_tokens: *max_tokens,
                settings: crate::sample::Sampler::new(crate::sample::SamplingParams::GREEDY)
                    .unwrap()
                    .row(),
                stop: stops.iter().map(|s| s.to_string()).collect(),
                events: etx,
            });
        }
        let metrics = super::Metrics::default();
        metrics.queued.store(batch.len(), std::sync::atomic::Ordering::Relaxed);
        tx.send(super::Command::Submit(batch)).unwrap();
        drop(tx);
        let config = super::SchedulerConfig {
            prefill_chunk: chunk,
            step_delay: std::time::Duration::ZERO,
        };
        super::run(&mut backend, &tokenizer, rx, config, &metrics);
        assert_eq!(metrics.queued.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(metrics.running.load(std::sync::atomic::Ordering::Relaxed), 0);
        let events = receivers
            .iter_mut()
            .map(|r| std::iter::from_fn(|| r.try_recv().ok()).collect())
            .collect();
        (events, backend)
    }

    /// The id of the token that is exactly `bytes`.
    fn token(bytes: &[u8]) -> u32 {
        let tok = crate::tokenizer::Gpt2Tokenizer::default_files().unwrap();
        (0..tok.vocab_size() as u32)
            .find(|&id| tok.token_bytes(id).unwrap() == bytes)
            .unwrap()
    }

    fn texts(events: &[super::Event]) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| match e {
                super::Event::Text { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    fn done(events: &[super::Event]) -> (super::FinishReason, usize) {
        match events.last() {
            Some(super::Event::Done {
                finish,
                completion_tokens,
                ..
            }) => (*finish, *completion_tokens),
            other => panic!("last event {other:?}"),
        }
    }

    #[test]
    fn split_utf8_is_sent_whole_and_eot_stops() {
        use crate::model::config::EOT_TOKEN;
        // "Hello", then "é" as its two bytes in two tokens, " world", EOT.
        let script = vec![
            token(b"Hello"),
            token(&[0xC3]),
            token(&[0xA9]),
            token(b" world"),
            EOT_TOKEN,
        ];
        let (events, backend) = schedule(script, &[(&[], 20)], 64);
        assert_eq!(texts(&events[0]), ["Hello", "\u{e9}", " world"]);
        assert_eq!(done(&events[0]), (super::FinishReason::Stop, 4));
        // One prefill of the whole prompt, then decode steps feeding each
        // chosen token at the next position.
        assert_eq!(backend.prefills, [(0, PROMPT_LEN, 0)]);
        let fed: Vec<(u32, usize)> = backend.decoded.iter().map(|r| (r.token, r.pos)).collect();
        let want: Vec<(u32, usize)> = backend.script[..4]
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, PROMPT_LEN + i))
            .collect();
        assert_eq!(fed, want);
    }

    #[test]
    fn stop_string_across_tokens_and_max_tokens() {
        let script = vec![
            token(b"Hello"),
            token(&[0xC3]),
            token(&[0xA9]),
            token(b" world"),
            token(b"!"),
        ];
        let (events, _) = schedule(script.clone(), &[(&["\u{e9} w"], 20), (&[], 3), (&["zzz"], 5)], 64);
        assert_eq!(texts(&events[0]).concat(), "Hello");
        assert_eq!(done(&events[0]).0, super::FinishReason::Stop);
        assert_eq!(texts(&events[1]).concat(), "Hello\u{e9}");
        assert_eq!(done(&events[1]), (super::FinishReason::Length, 3));
        assert_eq!(texts(&events[2]).concat(), "Hello\u{e9} world!");
        assert_eq!(done(&events[2]), (super::FinishReason::Length, 5));
    }

    #[test]
    fn chunked_prefill_continues_the_slot() {
        let script = vec![token(b"Hello"), token(b" world")];
        // Two jobs, two slots, 2 prompt tokens per iteration in all.
        let (events, backend) = schedule(script, &[(&[], 2), (&[], 2)], 2);
        for e in &events {
            assert_eq!(texts(e).concat(), "Hello world");
        }
        // Job 0 (slot 0) is prefilled first, in chunks at 0, 2, 4; the
        // budget left in the third iteration starts job 1 (slot 1), which
        // goes on while job 0 decodes.
        let slot0: Vec<_> = backend
            .prefills
            .iter()
            .filter(|p| p.0 == 0)
            .map(|p| (p.1, p.2))
            .collect();
        assert_eq!(slot0, [(2, 0), (2, 2), (1, 4)]);
        let slot1: Vec<_> = backend
            .prefills
            .iter()
            .filter(|p| p.0 == 1)
            .map(|p| (p.1, p.2))
            .collect();
        assert_eq!(slot1, [(1, 0), (2, 1), (2, 3)]);
        assert_eq!(backend.prefills.len(), 6);
    }

    #[test]
    fn decode_rows_join_a_prefill() {
        let script = vec![token(b"Hello"), token(b" world"), token(b"!"), token(b"!")];
        // Job 0 decodes while job 1's prompt is prefilled, 2 tokens an iteration.
        let (events, backend) = schedule(script, &[(&[], 4), (&[], 2)], 2);
        assert_eq!(texts(&events[0]).concat(), "Hello world!!");
        assert_eq!(texts(&events[1]).concat(), "Hello world");
        // Job 0's first decode step runs alone (job 1's first chunk went
        // with job 0's last); its next two ride with job 1's chunks.
        assert_eq!(backend.mixed_calls, 2);
        let slot0: Vec<usize> = backend.decoded.iter().filter(|r| r.slot == 0).map(|r| r.pos).collect();
        assert_eq!(slot0, [PROMPT_LEN, PROMPT_LEN + 1, PROMPT_LEN + 2]);
    }
}
