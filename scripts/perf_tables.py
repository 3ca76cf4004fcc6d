#!/usr/bin/env python3
"""Turn one GPU run's bench JSON files into the markdown tables of docs/performance.md.

Tables: GEMM, attention, end to end (ours vs PyTorch), and where the JSON
has them, the decode GEMVs (`bench gemv`) and PyTorch's hand-written
CUDA-graph decode (`torch_bench.py`'s decode_graph).

usage: perf_tables.py BENCH_RUST_JSON [BENCH_TORCH_JSON]

Both files come from the same gpu-runner.sh run (BENCH=1), so ratios compare
numbers taken on one device in one session.
"""
import json
import sys


def gemm_table(rust):
    rows = {}
    for r in rust.get("gemm", []):
        rows.setdefault((r["m"], r["n"], r["k"]), {})[r["variant"]] = r["timing"]["median_us"]
    out = [
        "| M | N | K | cuBLAS FP32 µs | cuBLAS TF32 µs | ours TF32 auto µs | ours TF32 best (tile) µs | auto / cuBLAS TF32 | ours FP32 auto µs | FP32 / cuBLAS FP32 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (m, n, k), v in sorted(rows.items()):
        tf = {name: t for name, t in v.items() if name.startswith("ours_tf32_") and name != "ours_tf32_auto"}
        best = min(tf.items(), key=lambda x: x[1]) if tf else ("-", float("nan"))
        cf, ct = v.get("cublas_sgemm_fp32"), v.get("cublas_tf32")
        auto, f32 = v.get("ours_tf32_auto"), v.get("ours_fp32_auto")
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        fmt = lambda x: f"{x:.1f}" if x else "-"
        out.append(
            f"| {m} | {n} | {k} | {fmt(cf)} | {fmt(ct)} | {fmt(auto)} | {best[1]:.1f} ({best[0].removeprefix('ours_tf32_')}) "
            f"| {ratio(ct, auto)} | {fmt(f32)} | {ratio(cf, f32)} |"
        )
    return "\n".join(out)


def gemm_bf16_table(rust):
    rows = {}
    for r in rust.get("gemm", []):
        rows.setdefault((r["m"], r["n"], r["k"]), {})[r["variant"]] = r["timing"]["median_us"]
    out = [
        "| M | N | K | cuBLAS bf16 µs | ours wgmma auto µs | ours wgmma best (tile) µs | auto / cuBLAS | ours mma.sync µs | mma.sync / cuBLAS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (m, n, k), v in sorted(rows.items()):
        cb = v.get("cublas_bf16")
        if not cb:
            continue
        tiles = {name: t for name, t in v.items() if name.startswith("ours_bf16_wgmma_") and "auto" not in name}
        best = min(tiles.items(), key=lambda x: x[1]) if tiles else ("-", float("nan"))
        auto, sync = v.get("ours_bf16_wgmma_auto"), v.get("ours_bf16_auto")
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        fmt = lambda x: f"{x:.1f}" if x else "-"
        out.append(
            f"| {m} | {n} | {k} | {fmt(cb)} | {fmt(auto)} | {best[1]:.1f} ({best[0].removeprefix('ours_bf16_wgmma_')}) "
            f"| {ratio(cb, auto)} | {fmt(sync)} | {ratio(cb, sync)} |"
        )
    return "\n".join(out)


def e2e_table(rust, torch):
    tp, tp_all = {}, {}
    if torch:
        for prec in ("fp32", "tf32", "bf16"):
            for r in torch["prefill"].get(prec, []):
                tp[("prefill", prec, r["batch"], r["seq"])] = r["median_ms"]
                if "all_logits_median_ms" in r:
                    tp_all[("prefill", prec, r["batch"], r["seq"])] = r["all_logits_median_ms"]
            for r in torch["decode"].get(prec, []):
                tp[("decode", prec, r["batch"])] = r["ms_per_step"]
    # PyTorch prefill: last-position logits, as our prefill computes (older
    # JSON without that split: model(ids), every position's logits).
    out = ["| what | precision | B | T or pos0 | extra | ours ms | PyTorch ms | PyTorch / ours | PyTorch all-logits ms |",
           "|---|---|---|---|---|---|---|---|---|"]
    skip = {"b", "t", "pos0", "median_ms", "median_ms_per_step", "precision", "samples", "what", "tokens_per_s"}
    for r in rust.get("e2e", []):
        prec = str(r.get("precision", "")).lower()
        what = r.get("what", "")
        if what not in ("prefill", "decode"):
            continue  # e.g. `bench trace` rows
        extra = ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(r.items()) if k not in skip)
        ours = r.get("median_ms", r.get("median_ms_per_step"))
        key = ("prefill", prec, r["b"], r.get("t")) if what == "prefill" else ("decode", prec, r["b"])
        theirs = tp.get(key)
        ratio = f"{theirs / ours:.2f}x" if theirs and ours else "-"
        theirs_s = f"{theirs:.3f}" if theirs else "-"
        every = tp_all.get(key)
        every_s = f"{every:.3f}" if every else "-"
        out.append(f"| {what} | {prec} | {r['b']} | {r.get('t', r.get('pos0'))} | {extra} | {ours:.3f} | {theirs_s} "
                   f"| {ratio} | {every_s} |")
    return "\n".join(out)


def attention_table(rust):
    rows = rust.get("attention", [])
    if not rows:
        return "(no attention results)"
    out = ["| what | B | T | window | variant | median µs | rate | time / unfused |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r["timing"]["median_us"]
        ratio = r.get("flash_over_unfused")
        out.append(
            f"| {r['what']} | {r['b']} | {r['t_cache'] if r['what'] == 'decode' else r['t']} | {r['window']} | {r['variant']} "
            f"| {t:.1f} | {r['rate']:.1f} {r['rate_unit']} | {f'{ratio:.3f}' if ratio is not None else '-'} |"
        )
    return "\n".join(out)


def gemv_table(rust):
    rows = rust.get("gemv", [])
    if not rows:
        return "(no gemv results)"
    copy = (rust.get("copy_bandwidth") or {}).get("gb_s")
    head = f"Floor: bytes (weight + input + output + bias) / device copy bandwidth ({copy:.0f} GB/s, read + write).\n" \
        "Times: CUDA-graph replay (GPU time per call) where it worked, else host-launched.\n\n" if copy else ""
    out = ["| shape | oc x c | rows | variant | median µs | timed as | host-launched µs | GB/s | % of copy bw | floor µs | time / fastest cuBLAS |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vs = r.get("vs_cublas_time")
        out.append(
            f"| {r['shape']} | {r['oc']}x{r['c']} | {r['rows']} | {r['variant']} | {r['median_us']:.2f} | {r['timed_as']} "
            f"| {r['timing_stream']['median_us']:.2f} | {r['gb_s']:.0f} | {r['pct_of_copy']:.1f} | {r['floor_us']:.2f} "
            f"| {f'{vs:.2f}' if vs is not None else '-'} |"
        )
    return head + "\n".join(out)


def decode_graph_table(torch):
    if not torch:
        return "(no PyTorch results)"
    err = torch.get("decode_graph_error")
    if not torch.get("decode_graph"):
        return f"(decode_graph failed: {err})" if err else "(no decode_graph results)"
    out = [f"decode_graph FAILED after these rows: {err}", ""] if err else []
    out += ["| precision | B | prompt | T_MAX | ms per step | tokens/s | max abs diff vs transformers | transformers' max abs logit |",
           "|---|---|---|---|---|---|---|---|"]
    for r in torch["decode_graph"]:
        out.append(f"| {r['precision']} | {r['b']} | {r['prompt']} | {r['t_max']} | {r['median_ms_per_step']:.3f} "
                   f"| {r['tokens_per_s']:.0f} | {r['max_abs_vs_hf']:.2e} | {r.get('hf_logits_max_abs', float('nan')):.2e} |")
    return "\n".join(out)


def main():
    rust = json.load(open(sys.argv[1]))
    torch = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
    print(f"Device: {rust.get('device')}\n")
    print("### GEMM\n\n" + gemm_table(rust) + "\n")
    print("### GEMM, bf16\n\n" + gemm_bf16_table(rust) + "\n")
    print("### Attention\n\n" + attention_table(rust) + "\n")
    print("### End to end (decode rows: ours ms = ms per step)\n\n" + e2e_table(rust, torch) + "\n")
    if rust.get("gemv"):
        print("### Decode GEMV (FP32)\n\n" + gemv_table(rust) + "\n")
    if torch and ("decode_graph" in torch or "decode_graph_error" in torch):
        print("### PyTorch decode: hand-written step, static KV cache, CUDA graph (TF32 off)\n\n"
              + decode_graph_table(torch) + "\n")


if __name__ == "__main__":
    main()
