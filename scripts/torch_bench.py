#!/usr/bin/env python3
"""Reference timings of transformers/PyTorch on the GPT-2 124M shape.

The numbers our engine is compared with (docs/performance.md). Runs on the GPU
machine (torch + transformers, no internet): a random-init GPT2LMHeadModel with
the default GPT2Config (124M), float32, eval mode, no_grad.

Measured, each with TF32 off and on:
  prefill  for (B, T) in PREFILL_SHAPES: the transformer over all T positions
           and the LM head on the last one (`median_ms`: what a generation
           step's prefill needs, and what our engine's prefill computes), and
           model(ids) with logits at every position (`all_logits_median_ms`)
  decode   a manual KV-cache loop (past_key_values), batch DECODE_BATCHES,
           DECODE_STEPS steps after a short prompt, greedy
  GEMM     torch.matmul (cuBLAS) TFLOP/s for M in GEMM_M x (N, K) in GEMM_NK:
           the shapes of GPT-2's qkv, attproj, fc, fcproj and LM-head matmuls

And the strongest plain-PyTorch decode we know how to write (`decode_graph`,
TF32 off): a hand-written GPT-2 decode step (the same model's weights;
F.linear, F.layer_norm, scaled_dot_product_attention, tanh GELU, tied LM head)
over a static KV cache ([B, NH, T_MAX, HS] per layer, T_MAX = DECODE_PROMPT +
DECODE_STEPS, written in place with index_copy_ at a device-side position;
attention over the whole cache under a mask derived from that position),
greedy argmax on the GPU feeding the next step's token from a device tensor,
the whole step captured once in a torch.cuda.CUDAGraph and replayed: no host
value changes between steps. FP32 and bf16 (weights and cache cast to
bfloat16), batch DECODE_BATCHES. The prompt's DECODE_PROMPT tokens go through
the same graph one replay each; then one step is checked against transformers'
past_key_values step (logits max abs difference, `max_abs_vs_hf`; FP32 must
be within DECODE_GRAPH_FP32_TOL), then the position is rewound to
DECODE_PROMPT and DECODE_STEPS replays are timed, each between its own CUDA
events (`median_ms_per_step`, after DECODE_GRAPH_WARMUP untimed replays).

Timing: CUDA events around each run, after warm-up; the median of at least
MIN_RUNS runs is reported. The weights are random: speed does not depend on
their values.

Usage: python3 scripts/torch_bench.py OUT.json [--runs N]
(--runs does not apply to decode_graph, which times DECODE_STEPS replays.)
"""

import argparse
import json
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

PREFILL_SHAPES = [(1, 64), (4, 64), (1, 1024), (8, 1024)]
DECODE_BATCHES = [1, 8]
DECODE_STEPS = 128
# Prompt length before the timed decode steps: short, so the cache stays
# within the 1024-token context after DECODE_STEPS more.
DECODE_PROMPT = 16
GEMM_M = [64, 1024, 8192]
# (N, K) of GPT-2 124M's matmuls, (out, in) of the weight: qkv, attproj, fc,
# fcproj, LM head (vocab padded to 50304 as in llm.c).
GEMM_NK = [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50304, 768)]
# decode_graph: precisions timed, replays before timing, FP32 tolerance of the
# check against transformers (it fails loudly past it).
DECODE_GRAPH_DTYPES = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
DECODE_GRAPH_WARMUP = 5
DECODE_GRAPH_FP32_TOL = 1e-2
MIN_RUNS = 20
WARMUP_RUNS = 5
VOCAB = 50257
SEED = 0


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def time_ms(fn, runs: int, warmup: int = WARMUP_RUNS) -> dict:
    """Median/min/max milliseconds of fn() over `runs` runs, CUDA-event timed."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "runs": runs}


def prefill_last(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the last position only (the LM head on one row per sequence)."""
    hidden = model.transformer(ids, use_cache=False).last_hidden_state
    return model.lm_head(hidden[:, -1:, :])


def bench_prefill(model, runs: int) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for b, t in PREFILL_SHAPES:
        ids = torch.randint(0, VOCAB, (b, t), device="cuda", generator=gen)
        r = time_ms(lambda: prefill_last(model, ids), runs)
        every = time_ms(lambda: model(ids, use_cache=False), runs)
        r.update(batch=b, seq=t, tokens_per_s=b * t / (r["median_ms"] / 1e3),
                 all_logits_median_ms=every["median_ms"])
        rows.append(r)
    return rows


def decode_loop(model, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """Prefill the prompt, then `steps` greedy steps feeding one token each."""
    out = model(prompt, use_cache=True)
    past = out.past_key_values
    nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    for _ in range(steps):
        out = model(nxt, past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
    return nxt


def bench_decode(model, runs: int) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for b in DECODE_BATCHES:
        prompt = torch.randint(0, VOCAB, (b, DECODE_PROMPT), device="cuda", generator=gen)
        # The prompt's prefill is timed separately and subtracted, so the
        # figure is the cost of the decode steps alone.
        pre = time_ms(lambda: decode_loop(model, prompt, 0), runs)
        full = time_ms(lambda: decode_loop(model, prompt, DECODE_STEPS), runs)
        step_ms = (full["median_ms"] - pre["median_ms"]) / DECODE_STEPS
        rows.append({
            "batch": b, "steps": DECODE_STEPS, "prompt": DECODE_PROMPT,
            "loop_median_ms": full["median_ms"], "prefill_median_ms": pre["median_ms"],
            "ms_per_step": step_ms, "tokens_per_s": b / (step_ms / 1e3), "runs": runs,
        })
    return rows


class StaticDecoder:
    """One GPT-2 decode step over a static KV cache, written with plain torch ops.

    Every tensor the step reads or writes lives at a fixed address: `tok` [B]
    (the step's input token, overwritten with the greedy next token), `pos`
    [1] (the step's position, advanced by the step), the per-layer caches
    [B, NH, t_max, HS], and the returned logits [B, V]. So the step can be
    captured once in a CUDA graph and replayed with no host value changing.
    Weights are the given GPT2LMHeadModel's, cast to `dtype`; Conv1D weights
    ([in, out]) are stored transposed ([out, in], as nn.Linear holds them).
    Works on any device (the CPU check of the math needs no graph).
    """

    def __init__(self, model, batch: int, t_max: int, dtype, device):
        cfg = model.config
        self.c, self.nh = cfg.n_embd, cfg.n_head
        self.hs = self.c // self.nh
        self.eps = cfg.layer_norm_epsilon
        self.batch, self.t_max = batch, t_max
        tr = model.transformer

        def cast(t, transpose=False):
            t = t.detach()
            return (t.t() if transpose else t).to(device=device, dtype=dtype).contiguous()

        self.wte, self.wpe = cast(tr.wte.weight), cast(tr.wpe.weight)  # wte is also the LM head
        self.layers = []
        for blk in tr.h:
            self.layers.append({
                "ln1_w": cast(blk.ln_1.weight), "ln1_b": cast(blk.ln_1.bias),
                "qkv_w": cast(blk.attn.c_attn.weight, True), "qkv_b": cast(blk.attn.c_attn.bias),
                "proj_w": cast(blk.attn.c_proj.weight, True), "proj_b": cast(blk.attn.c_proj.bias),
                "ln2_w": cast(blk.ln_2.weight), "ln2_b": cast(blk.ln_2.bias),
                "fc_w": cast(blk.mlp.c_fc.weight, True), "fc_b": cast(blk.mlp.c_fc.bias),
                "fcproj_w": cast(blk.mlp.c_proj.weight, True), "fcproj_b": cast(blk.mlp.c_proj.bias),
                "k": torch.zeros(batch, self.nh, t_max, self.hs, device=device, dtype=dtype),
                "v": torch.zeros(batch, self.nh, t_max, self.hs, device=device, dtype=dtype),
            })
        self.lnf_w, self.lnf_b = cast(tr.ln_f.weight), cast(tr.ln_f.bias)
        self.tok = torch.zeros(batch, device=device, dtype=torch.long)
        self.pos = torch.zeros(1, device=device, dtype=torch.long)
        self.slots = torch.arange(t_max, device=device)

    def step(self) -> torch.Tensor:
        """Logits [B, V] of token `tok` at position `pos`; then tok = argmax, pos += 1."""
        b, c, nh, hs = self.batch, self.c, self.nh, self.hs
        x = F.embedding(self.tok, self.wte) + F.embedding(self.pos, self.wpe)  # [B, C]
        # Cache slots up to and including pos take part (a device-side mask).
        mask = (self.slots <= self.pos).view(1, 1, 1, self.t_max)  # broadcast over [B, NH, 1, T_MAX]
        for L in self.layers:
            h = F.layer_norm(x, (c,), L["ln1_w"], L["ln1_b"], self.eps)
            q, k, v = F.linear(h, L["qkv_w"], L["qkv_b"]).split(c, dim=1)
            L["k"].index_copy_(2, self.pos, k.view(b, nh, 1, hs))
            L["v"].index_copy_(2, self.pos, v.view(b, nh, 1, hs))
            y = F.scaled_dot_product_attention(q.view(b, nh, 1, hs), L["k"], L["v"], attn_mask=mask)
            x = x + F.linear(y.reshape(b, c), L["proj_w"], L["proj_b"])
            h = F.layer_norm(x, (c,), L["ln2_w"], L["ln2_b"], self.eps)
            h = F.gelu(F.linear(h, L["fc_w"], L["fc_b"]), approximate="tanh")
            x = x + F.linear(h, L["fcproj_w"], L["fcproj_b"])
        logits = F.linear(F.layer_norm(x, (c,), self.lnf_w, self.lnf_b, self.eps), self.wte)
        self.tok.copy_(logits.argmax(dim=-1))
        self.pos.add_(1)
        return logits


def hf_step_logits(model, prompt: torch.Tensor):
    """transformers' reference: the prompt with use_cache, then one
    past_key_values step on its greedy token. Returns (that token [B], the
    step's logits [B, V] as float32)."""
    out = model(prompt, use_cache=True)
    nxt = out.logits[:, -1, :].argmax(dim=-1)
    step = model(nxt[:, None], past_key_values=out.past_key_values, use_cache=True)
    return nxt, step.logits[:, -1, :].float()


def check_static_decoder(model, dec: StaticDecoder, prompt: torch.Tensor, run_step) -> tuple:
    """Feed the prompt one `run_step()` per token from position 0, then the
    step transformers takes after it (on transformers' greedy token, so both
    see the same input even where a bf16 argmax would differ); return the max
    abs difference of that step's logits from transformers', and the max abs
    of transformers' logits (the scale: random-init logits are small).
    `run_step` is dec.step or a CUDA graph's replay; it must return the
    step's logits."""
    nxt, ref = hf_step_logits(model, prompt)
    dec.pos.zero_()
    for i in range(prompt.shape[1]):
        dec.tok.copy_(prompt[:, i])
        run_step()
    dec.tok.copy_(nxt)
    logits = run_step()
    return (logits.float() - ref).abs().max().item(), ref.abs().max().item()


def capture_step(dec: StaticDecoder):
    """Capture dec.step() once in a CUDA graph (after warm-up on a side
    stream: allocator, cuBLAS handles); return a function that replays it and
    returns the step's logits (a tensor the graph owns, overwritten by each
    replay)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dec.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = dec.step()

    def replay():
        graph.replay()
        return logits

    return replay


def bench_decode_graph(model, device: str = "cuda", rows=None) -> list:
    """Hand-written static-cache decode step in one CUDA graph (see the module
    docs). Appends one row per (batch, precision) to `rows` (a new list if
    None), so the rows measured before a failure survive it."""
    rows = [] if rows is None else rows
    gen = torch.Generator(device=device).manual_seed(SEED)
    t_max = DECODE_PROMPT + DECODE_STEPS
    vocab = model.config.vocab_size
    for b in DECODE_BATCHES:
        prompt = torch.randint(0, vocab, (b, DECODE_PROMPT), device=device, generator=gen)
        for name, dtype in DECODE_GRAPH_DTYPES:
            dec = StaticDecoder(model, b, t_max, dtype, device)
            replay = capture_step(dec)
            err, scale = check_static_decoder(model, dec, prompt, replay)
            if name == "fp32" and not err <= DECODE_GRAPH_FP32_TOL:
                raise RuntimeError(f"decode_graph fp32 b={b}: logits differ from transformers' by {err:.3e} "
                                   f"(> {DECODE_GRAPH_FP32_TOL}): the hand-written step is wrong")
            # Timed: positions DECODE_PROMPT .. t_max-1, as bench_decode's steps.
            dec.pos.fill_(DECODE_PROMPT)
            for _ in range(DECODE_GRAPH_WARMUP):
                replay()
            dec.pos.fill_(DECODE_PROMPT)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(DECODE_STEPS)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(DECODE_STEPS)]
            torch.cuda.synchronize()
            for s, e in zip(starts, ends):
                s.record()
                replay()
                e.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
            med = statistics.median(times)
            rows.append({
                "precision": name, "b": b, "prompt": DECODE_PROMPT, "t_max": t_max, "replays": len(times),
                "median_ms_per_step": med, "min_ms_per_step": min(times), "max_ms_per_step": max(times),
                "tokens_per_s": b / (med / 1e3), "max_abs_vs_hf": err, "hf_logits_max_abs": scale,
            })
            del replay, dec
            torch.cuda.empty_cache()
    return rows


def bench_gemm(runs: int, dtype=torch.float32) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for m in GEMM_M:
        for n, k in GEMM_NK:
            a = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
            # Stored (out, in) as the checkpoint holds it; a @ w.T like nn.Linear.
            w = torch.randn(n, k, device="cuda", generator=gen).to(dtype)
            r = time_ms(lambda: torch.matmul(a, w.t()), runs)
            r.update(m=m, n=n, k=k, tflops=2.0 * m * n * k / (r["median_ms"] / 1e3) / 1e12)
            rows.append(r)
            del a, w
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="where to write the JSON results")
    ap.add_argument("--runs", type=int, default=MIN_RUNS, help=f"timed runs per case (default {MIN_RUNS})")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 1

    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    t0 = time.time()
    model = GPT2LMHeadModel(GPT2Config()).to("cuda", dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: GPT-2 random init, {params / 1e6:.1f}M parameters, built in {time.time() - t0:.1f} s")

    result = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "dtype": "float32",
        "runs": args.runs,
        "prefill": {}, "decode": {}, "gemm": {},
    }
    with torch.no_grad():
        for tf32 in (False, True):
            mode = "tf32" if tf32 else "fp32"
            set_tf32(tf32)
            result["prefill"][mode] = bench_prefill(model, args.runs)
            result["decode"][mode] = bench_decode(model, args.runs)
            result["gemm"][mode] = bench_gemm(args.runs)
        set_tf32(False)
        # bf16: the model's weights cast to bfloat16, activations too (what
        # `.to(torch.bfloat16)` gives; f32 accumulation inside cuBLAS).
        model_bf16 = GPT2LMHeadModel(GPT2Config()).to("cuda", dtype=torch.float32).eval()
        model_bf16.load_state_dict(model.state_dict())
        model_bf16 = model_bf16.to(torch.bfloat16)
        result["prefill"]["bf16"] = bench_prefill(model_bf16, args.runs)
        result["gemm"]["bf16"] = bench_gemm(args.runs, torch.bfloat16)
        del model_bf16
        graph_error = None
        result["decode_graph"] = []
        try:
            bench_decode_graph(model, rows=result["decode_graph"])
        except Exception as e:  # reported loudly below, after the JSON is written
            traceback.print_exc()
            graph_error = f"{type(e).__name__}: {e}"
            result["decode_graph_error"] = graph_error
    set_tf32(False)

    print(f"\ndevice: {result['device']}, torch {result['torch']}, transformers {result['transformers']}")
    print(f"median of {args.runs} runs after {WARMUP_RUNS} warm-up runs, CUDA-event timed\n")
    print("prefill: last-position logits (all-position logits, model(ids), in brackets)")
    print(f"{'prefill (B,T)':<16} {'FP32 ms':>18} {'TF32 ms':>18} {'FP32 tok/s':>12} {'TF32 tok/s':>12}")
    for f, t in zip(result["prefill"]["fp32"], result["prefill"]["tf32"]):
        fp = f"{f['median_ms']:.3f} ({f['all_logits_median_ms']:.3f})"
        tp = f"{t['median_ms']:.3f} ({t['all_logits_median_ms']:.3f})"
        print(f"{'(%d,%d)' % (f['batch'], f['seq']):<16} {fp:>18} {tp:>18} "
              f"{f['tokens_per_s']:>12.0f} {t['tokens_per_s']:>12.0f}")
    print(f"\n{'bf16 prefill (B,T)':<20} {'ms':>18} {'tok/s':>12}")
    for r in result["prefill"]["bf16"]:
        print(f"{'(%d,%d)' % (r['batch'], r['seq']):<20} {r['median_ms']:>9.3f} ({r['all_logits_median_ms']:.3f}) "
              f"{r['tokens_per_s']:>12.0f}")
    print(f"\n{'decode batch':<16} {'FP32 ms/step':>13} {'TF32 ms/step':>13} {'FP32 tok/s':>12} {'TF32 tok/s':>12}")
    for f, t in zip(result["decode"]["fp32"], result["decode"]["tf32"]):
        print(f"{f['batch']:<16} {f['ms_per_step']:>13.3f} {t['ms_per_step']:>13.3f} "
              f"{f['tokens_per_s']:>12.0f} {t['tokens_per_s']:>12.0f}")
    print(f"\n{'GEMM MxNxK':<20} {'FP32 ms':>9} {'TF32 ms':>9} {'FP32 TFLOP/s':>13} {'TF32 TFLOP/s':>13}")
    for f, t in zip(result["gemm"]["fp32"], result["gemm"]["tf32"]):
        print(f"{'%dx%dx%d' % (f['m'], f['n'], f['k']):<20} {f['median_ms']:>9.3f} {t['median_ms']:>9.3f} "
              f"{f['tflops']:>13.1f} {t['tflops']:>13.1f}")
    print(f"\n{'GEMM MxNxK bf16':<20} {'ms':>9} {'TFLOP/s':>13}")
    for r in result["gemm"]["bf16"]:
        print(f"{'%dx%dx%d' % (r['m'], r['n'], r['k']):<20} {r['median_ms']:>9.3f} {r['tflops']:>13.1f}")

    if result["decode_graph"]:
        print(f"\ndecode_graph: hand-written step, static KV cache (T_MAX {DECODE_PROMPT + DECODE_STEPS}), "
              f"CUDA graph replays, TF32 off; median of {DECODE_STEPS} replays")
        print(f"{'precision':<10} {'B':>3} {'ms/step':>9} {'tok/s':>10} {'max|diff| vs HF':>16}")
        for r in result["decode_graph"]:
            print(f"{r['precision']:<10} {r['b']:>3} {r['median_ms_per_step']:>9.3f} {r['tokens_per_s']:>10.0f} "
                  f"{r['max_abs_vs_hf']:>16.2e}")

    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {args.out}")
    if graph_error is not None:
        print(f"\nerror: decode_graph failed: {graph_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
