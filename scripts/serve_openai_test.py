#!/usr/bin/env python3
"""The `serve` binary against the official `openai` Python client.

Two modes:

  serve_openai_test.py write-checkpoint PATH
      Writes a small random llm.c checkpoint with GPT-2's vocabulary (so the
      real tokenizer applies), for a server to load; needs only the standard
      library.

  serve_openai_test.py run URL EXPECTED_FILE
      Talks to the server at URL (loopback only) with `openai`: completions
      plain and streamed, a list of prompts, seeded sampling, stop strings,
      the models list and a bad request. EXPECTED_FILE holds the CLI's
      greedy continuation of PROMPT with MAX_TOKENS tokens, which the
      server must reproduce exactly.

scripts/serve_openai_test.sh runs both (venv, install, server, curl).
"""

import array
import ipaddress
import random
import socket
import struct
import sys
import urllib.parse

# llm.c checkpoint header (host/src/model/llmc.rs).
LLMC_MAGIC = 20240326
LLMC_VERSION_F32 = 3
LLMC_HEADER_INTS = 256
# The tiny model: GPT-2's vocabulary and head size (64, which the GPU
# engine's decode kernels need), small everything else.
MAX_SEQ_LEN = 64
VOCAB = 50257
PADDED_VOCAB = 50304
LAYERS = 1
HEADS = 1
CHANNELS = 64
WEIGHT_STD = 0.02
SEED = 7

# The request whose greedy text the CLI also produced (serve_openai_test.sh).
PROMPT = "The quick brown fox"
MAX_TOKENS = 8
# Seconds for any one request.
REQUEST_TIMEOUT = 60.0


def write_checkpoint(path):
    rng = random.Random(SEED)
    c, l = CHANNELS, LAYERS
    # (count, values per layer, mean, std) in llm.c's tensor order.
    tensors = [
        (1, PADDED_VOCAB * c, 0.0, WEIGHT_STD),  # wte (padding rows random too: never chosen)
        (1, MAX_SEQ_LEN * c, 0.0, WEIGHT_STD / 2),  # wpe
        (l, c, 1.0, 0.1),  # ln1w
        (l, c, 0.0, WEIGHT_STD),  # ln1b
        (l, 3 * c * c, 0.0, WEIGHT_STD),  # qkvw
        (l, 3 * c, 0.0, WEIGHT_STD),  # qkvb
        (l, c * c, 0.0, WEIGHT_STD),  # attprojw
        (l, c, 0.0, WEIGHT_STD),  # attprojb
        (l, c, 1.0, 0.1),  # ln2w
        (l, c, 0.0, WEIGHT_STD),  # ln2b
        (l, 4 * c * c, 0.0, WEIGHT_STD),  # fcw
        (l, 4 * c, 0.0, WEIGHT_STD),  # fcb
        (l, 4 * c * c, 0.0, WEIGHT_STD),  # fcprojw
        (l, c, 0.0, WEIGHT_STD),  # fcprojb
        (1, c, 1.0, 0.1),  # lnfw
        (1, c, 0.0, WEIGHT_STD),  # lnfb
    ]
    header = [0] * LLMC_HEADER_INTS
    header[:8] = [LLMC_MAGIC, LLMC_VERSION_F32, MAX_SEQ_LEN, VOCAB, LAYERS, HEADS, CHANNELS, PADDED_VOCAB]
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        for count, n, mean, std in tensors:
            values = array.array("f", (rng.gauss(mean, std) for _ in range(count * n)))
            if sys.byteorder != "little":
                values.byteswap()
            f.write(values.tobytes())


def check_loopback(url):
    host = urllib.parse.urlparse(url).hostname or ""
    for info in socket.getaddrinfo(host, None):
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            sys.exit(f"refusing {url}: not a loopback address")


def run(url, expected_file):
    import openai
    from openai import OpenAI

    check_loopback(url)
    with open(expected_file, encoding="utf-8") as f:
        expected = f.read()
    client = OpenAI(base_url=f"{url}/v1", api_key="not-needed", timeout=REQUEST_TIMEOUT, max_retries=0)

    # Plain completion: the CLI's greedy text, OpenAI's reply shape.
    r = client.completions.create(model="gpt2", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert r.object == "text_completion", r
    assert r.choices[0].text == expected, (r.choices[0].text, expected)
    assert r.choices[0].index == 0
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert r.usage.completion_tokens <= MAX_TOKENS
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    print(f"completion ok: {r.choices[0].text!r}")

    # Streamed: the same text, chunk by chunk, then usage.
    stream = client.completions.create(
        model="gpt2",
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        assert chunk.object == "text_completion"
        for c in chunk.choices:
            pieces.append(c.text)
            finish = c.finish_reason or finish
        usage = chunk.usage or usage
    assert "".join(pieces) == expected, (pieces, expected)
    assert finish == r.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage
    print(f"stream ok: {len(pieces)} chunks")

    # A list of prompts: one choice each, in order.
    r = client.completions.create(model="gpt2", prompt=[PROMPT, "Another prompt"], max_tokens=4, temperature=0)
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == [0, 1], r
    first = next(c for c in r.choices if c.index == 0)
    assert expected.startswith(first.text), (first.text, expected)
    print("prompt list ok")

    # Seeded sampling repeats.
    kwargs = dict(model="gpt2", prompt=PROMPT, max_tokens=6, temperature=0.9, top_p=0.95, seed=11)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b, (a, b)
    print("seeded sampling ok")

    # A stop string cuts the text before it.
    if len(expected) >= 4:
        stop = expected[2:4]
        r = client.completions.create(model="gpt2", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stop=[stop])
        assert r.choices[0].text == expected[: expected.find(stop)], (r.choices[0].text, stop, expected)
        assert r.choices[0].finish_reason == "stop"
        print("stop string ok")

    models = client.models.list()
    assert [m.id for m in models.data] == ["gpt2"], models
    print("models ok")

    try:
        client.completions.create(model="gpt2", prompt=PROMPT, max_tokens=0)
    except openai.BadRequestError as e:
        assert e.status_code == 400
        assert e.body["type"] == "invalid_request_error", e.body
        assert e.body["param"] == "max_tokens", e.body
    else:
        raise AssertionError("max_tokens = 0 was accepted")
    try:
        client.completions.create(model="gpt2", prompt=PROMPT, temperature=3)
    except openai.BadRequestError as e:
        assert e.body["param"] == "temperature", e.body
    else:
        raise AssertionError("temperature = 3 was accepted")
    print("bad requests ok")
    print("openai client test passed")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write-checkpoint":
        write_checkpoint(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
