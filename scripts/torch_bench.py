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

Timing: CUDA events around each run, after warm-up; the median of at least
MIN_RUNS runs is reported. The weights are random: speed does not depend on
their values.

Usage: python3 scripts/torch_bench.py OUT.json [--runs N]
"""

import argparse
import json
import statistics
import sys
import time

import torch

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


def bench_gemm(runs: int) -> list:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for m in GEMM_M:
        for n, k in GEMM_NK:
            a = torch.randn(m, k, device="cuda", generator=gen)
            # Stored (out, in) as the checkpoint holds it; a @ w.T like nn.Linear.
            w = torch.randn(n, k, device="cuda", generator=gen)
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

    print(f"\ndevice: {result['device']}, torch {result['torch']}, transformers {result['transformers']}")
    print(f"median of {args.runs} runs after {WARMUP_RUNS} warm-up runs, CUDA-event timed\n")
    print("prefill: last-position logits (all-position logits, model(ids), in brackets)")
    print(f"{'prefill (B,T)':<16} {'FP32 ms':>18} {'TF32 ms':>18} {'FP32 tok/s':>12} {'TF32 tok/s':>12}")
    for f, t in zip(result["prefill"]["fp32"], result["prefill"]["tf32"]):
        fp = f"{f['median_ms']:.3f} ({f['all_logits_median_ms']:.3f})"
        tp = f"{t['median_ms']:.3f} ({t['all_logits_median_ms']:.3f})"
        print(f"{'(%d,%d)' % (f['batch'], f['seq']):<16} {fp:>18} {tp:>18} "
              f"{f['tokens_per_s']:>12.0f} {t['tokens_per_s']:>12.0f}")
    print(f"\n{'decode batch':<16} {'FP32 ms/step':>13} {'TF32 ms/step':>13} {'FP32 tok/s':>12} {'TF32 tok/s':>12}")
    for f, t in zip(result["decode"]["fp32"], result["decode"]["tf32"]):
        print(f"{f['batch']:<16} {f['ms_per_step']:>13.3f} {t['ms_per_step']:>13.3f} "
              f"{f['tokens_per_s']:>12.0f} {t['tokens_per_s']:>12.0f}")
    print(f"\n{'GEMM MxNxK':<20} {'FP32 ms':>9} {'TF32 ms':>9} {'FP32 TFLOP/s':>13} {'TF32 TFLOP/s':>13}")
    for f, t in zip(result["gemm"]["fp32"], result["gemm"]["tf32"]):
        print(f"{'%dx%dx%d' % (f['m'], f['n'], f['k']):<20} {f['median_ms']:>9.3f} {t['median_ms']:>9.3f} "
              f"{f['tflops']:>13.1f} {t['tflops']:>13.1f}")

    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
