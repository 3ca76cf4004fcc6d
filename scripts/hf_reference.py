#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers, for tests/cpu/oracle.rs.

Runs on the GPU machine (torch, transformers, numpy; no internet, no weights):
builds a seeded random-init GPT-2 124M, saves it as safetensors, and writes
the float32 logits of fixed token ids (B=4, T=64) computed on the GPU with
TF32 off.

    python3 scripts/hf_reference.py OUT_DIR [--seed S]

OUT_DIR receives: model.safetensors + config.json (save_pretrained),
tokens.bin (int32 [B, T], little-endian), logits.bin (float32 [B, T, V],
little-endian) and reference.json (shapes, seed, versions). Then, on a
machine with Rust:

    GPT2_ORACLE_DIR=OUT_DIR cargo test --release --test cpu oracle -- --nocapture
"""
import argparse
import json
import os

import numpy as np
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

BATCH = 4
SEQ_LEN = 64
VOCAB_SIZE = 50257
DEFAULT_SEED = 1337


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    # Exact float32 matmuls: no TF32 anywhere.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    torch.manual_seed(args.seed)
    config = GPT2Config()  # the 124M shape
    assert config.vocab_size == VOCAB_SIZE
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(args.out_dir, safe_serialization=True)

    gen = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN), generator=gen, dtype=torch.int64)
    tokens.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(args.out_dir, "tokens.bin"))

    model = model.to(args.device, dtype=torch.float32)
    with torch.no_grad():
        logits = model(tokens.to(args.device)).logits.float().cpu().numpy()
    assert logits.shape == (BATCH, SEQ_LEN, VOCAB_SIZE), logits.shape
    logits.astype("<f4").tofile(os.path.join(args.out_dir, "logits.bin"))

    meta = {
        "seed": args.seed,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "vocab_size": VOCAB_SIZE,
        "tokens": {"file": "tokens.bin", "dtype": "int32", "shape": [BATCH, SEQ_LEN]},
        "logits": {"file": "logits.bin", "dtype": "float32", "shape": [BATCH, SEQ_LEN, VOCAB_SIZE]},
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "tf32": False,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": np.__version__,
    }
    with open(os.path.join(args.out_dir, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
