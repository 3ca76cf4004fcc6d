#!/usr/bin/env python3
"""Writes the committed tiny transformers oracle, tests/data/tiny_oracle/.

CI has no GPU and no torch, so `cargo test` checks the CPU model against
Hugging Face transformers through these committed files (tests/cpu/tiny_oracle.rs).
This script is only needed to regenerate them (CPU torch is enough):

    python3 scripts/make_tiny_oracle.py [OUT_DIR]     # default tests/data/tiny_oracle

It builds a seeded random GPT2LMHeadModel of a tiny configuration, makes its
parameters more varied than GPT-2's init (non-zero biases, layernorm weights
away from 1, larger weights, so every term of the forward pass matters), rounds
every parameter to a bfloat16-representable value, and then:

  model.safetensors  the parameters, saved by save_pretrained as BF16 (half the
                     bytes of FP32; widening them back to FP32 is exact, so the
                     Rust loader sees exactly the FP32 values transformers used)
  config.json        save_pretrained's config (the loader reads n_head from it)
  tokens.bin         int32 little-endian [BATCH, SEQ_LEN] token ids
  logits.bin         float32 little-endian [BATCH, SEQ_LEN, VOCAB] logits of
                     every position, computed by transformers in FP32 on the CPU
                     (eager attention)
  reference.json     shapes, seed, versions

The vocabulary (500) is not a multiple of 128, so the loader pads it (to 512)
as it pads GPT-2's 50257, and the test reads the CPU logits with the padded
row stride.
"""
import argparse
import json
import os

import numpy as np
import safetensors
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

SEED = 20240326
N_LAYER = 2
N_HEAD = 4
N_EMBD = 64
VOCAB = 500
N_POSITIONS = 64
BATCH = 2
SEQ_LEN = 32
# Standard deviations of the re-randomised parameters.
WEIGHT_STD = 0.08
WPE_STD = 0.05
BIAS_STD = 0.05
LN_WEIGHT_STD = 0.2
LN_BIAS_STD = 0.1

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tiny_oracle")


def randomise(model, gen):
    """Redraws every parameter (the tied lm_head follows wte) and rounds it to bf16."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wpe.weight"):
                v = torch.randn(p.shape, generator=gen) * WPE_STD
            elif ".ln_" in name and name.endswith(".weight"):
                v = 1.0 + torch.randn(p.shape, generator=gen) * LN_WEIGHT_STD
            elif ".ln_" in name and name.endswith(".bias"):
                v = torch.randn(p.shape, generator=gen) * LN_BIAS_STD
            elif name.endswith(".bias"):
                v = torch.randn(p.shape, generator=gen) * BIAS_STD
            else:
                v = torch.randn(p.shape, generator=gen) * WEIGHT_STD
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default=DEFAULT_OUT)
    args = ap.parse_args()
    out = os.path.normpath(args.out_dir)
    os.makedirs(out, exist_ok=True)

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    config = GPT2Config(
        n_layer=N_LAYER,
        n_head=N_HEAD,
        n_embd=N_EMBD,
        vocab_size=VOCAB,
        n_positions=N_POSITIONS,
        # Dropout is off in eval mode anyway; zero makes the config say so.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    model.config._attn_implementation = "eager"
    model = model.eval().to(torch.float32)
    gen = torch.Generator().manual_seed(SEED)
    randomise(model, gen)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "lm_head must be tied"

    tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN), generator=gen, dtype=torch.int64)
    with torch.no_grad():
        logits = model(tokens).logits.to(torch.float32).numpy()
    assert logits.shape == (BATCH, SEQ_LEN, VOCAB), logits.shape
    assert np.isfinite(logits).all()

    tokens.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(out, "tokens.bin"))
    logits.astype("<f4").tofile(os.path.join(out, "logits.bin"))
    # Every parameter is bf16-representable, so this conversion is lossless.
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    # generation_config.json is not needed by anything here.
    gen_cfg = os.path.join(out, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)

    meta = {
        "seed": SEED,
        "config": {
            "n_layer": N_LAYER,
            "n_head": N_HEAD,
            "n_embd": N_EMBD,
            "vocab_size": VOCAB,
            "n_positions": N_POSITIONS,
        },
        "weights": {"file": "model.safetensors", "dtype": "bfloat16 (every value bf16-representable; logits computed in float32)"},
        "tokens": {"file": "tokens.bin", "dtype": "int32 little-endian", "shape": [BATCH, SEQ_LEN]},
        "logits": {"file": "logits.bin", "dtype": "float32 little-endian", "shape": [BATCH, SEQ_LEN, VOCAB]},
        "logits_abs_max": float(np.abs(logits).max()),
        "logits_std": float(logits.std()),
        "device": "cpu",
        "attention": "eager",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    print(json.dumps(meta, indent=2))
    for name in sorted(os.listdir(out)):
        print(f"{os.path.getsize(os.path.join(out, name)):>8} {name}")


if __name__ == "__main__":
    main()
