"""Which float32 attention is golden's: math SDPA in query chunks (today's) or the memory-efficient kernel?

Golden must be closer to exact than any provider configuration it calibrates. For each small shape this measures,
against a float64 math SDPA of the same inputs, the float32 errors (relative L2 and max abs) of the output and of
dQ, dK, dV for both kernels; then, at the release block's attention (38,222 rows, 56 heads of 128), the time and
peak memory of a forward and backward through each (math through the block program's chunking,
:func:`h3gate.block_program._provider_attention`). Inputs are peaky as in the embedded init (logit std about 4).

    python benchmarks/golden_attention.py --out benchmarks/results/h200-release/golden-attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from types import SimpleNamespace

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn

from h3gate.block_program import _provider_attention
from h3gate.files import dumps, write_atomic

KERNELS = {"math": "_native_math", "efficient": "_native_efficient"}
SMALL = ((1024, 8), (4096, 8), (16384, 4))  # (rows, heads), head dim 128
RELEASE = (38222, 56)


def inputs(rows: int, heads: int, dtype, device, seed: int = 0):
    generator = torch.Generator(device).manual_seed(seed)
    shape = (1, rows, heads, 128)
    q, k, v, grad = (torch.randn(shape, generator=generator, device=device, dtype=torch.float64) for _ in range(4))
    q, k = q * 2.0, k * 2.0  # scores q.k / sqrt(128) with std 4: peaky rows, as the embedded init makes them
    # rounded to float32 first, so the float64 reference computes exactly on the float32 runs' inputs
    return [t.float().to(dtype).requires_grad_(i < 3) for i, t in enumerate((q, k, v, grad))]


def attention(kernel: str, q, k, v):
    if kernel == "math":  # golden's path: chunked once the scores pass 2 GiB, each chunk recomputed in the backward
        return _provider_attention(SimpleNamespace(_attention_backend=KERNELS["math"], _parallel_config=None), q, k, v)
    return dispatch_attention_fn(q, k, v, backend=KERNELS[kernel])


def forward_backward(kernel: str, q, k, v, grad):
    out = attention(kernel, q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    return {"out": out.detach(), "dq": dq, "dk": dk, "dv": dv}


def errors(got: dict, exact: dict) -> dict:
    result = {}
    for name, reference in exact.items():
        diff = got[name].double() - reference
        result[name] = {"relative_l2": (diff.norm() / reference.norm()).item(), "max_abs": diff.abs().max().item()}
    return result


def accuracy(device: str) -> list[dict]:
    rows = []
    for length, heads in SMALL:
        exact = forward_backward("math", *inputs(length, heads, torch.float64, device))
        entry = {"rows": length, "heads": heads}
        for kernel in KERNELS:
            entry[kernel] = errors(forward_backward(kernel, *inputs(length, heads, torch.float32, device)), exact)
        rows.append(entry)
        print(json.dumps(entry), flush=True)
        del exact
        torch.cuda.empty_cache()
    return rows


def timing(device: str, repeats: int = 3) -> dict:
    result = {}
    for kernel in KERNELS:
        tensors = inputs(*RELEASE, torch.float32, device)
        forward_backward(kernel, *tensors)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            forward_backward(kernel, *tensors)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        result[kernel] = {"seconds": sorted(seconds)[repeats // 2],
                          "peak_extra_gib": (torch.cuda.max_memory_allocated() - base) / 2**30}
        print(kernel, json.dumps(result[kernel]), flush=True)
        del tensors
        torch.cuda.empty_cache()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/golden-attention.json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.fp32_precision = "ieee"  # golden's switches: no TF32
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "accuracy": accuracy("cuda"),
              "release_forward_backward": timing("cuda")}
    write_atomic(args.out, dumps(report))
    print(f"log: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
