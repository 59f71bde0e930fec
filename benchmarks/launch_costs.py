"""What the host spends on the pieces of a short op's call on a GPU: allocations, an autograd Function, a Triton
launch through ``kernel[grid]`` (Triton's binder, its cache lookup, the driver), through the compiled kernel
directly (the driver's part alone) and through ``h3_triton.launch``'s direct launch (which keeps the compiled kernel
of each call signature; ``H3_TRITON_DIRECT_LAUNCH=1`` turns it on for the package), for a kernel of few and of many
arguments.

Usage (GPU): python benchmarks/launch_costs.py [--batches 10] [--steps 200]

Each piece is the median over ``--batches`` batches of ``--steps`` calls, timed without synchronising (the GPU is
idle or behind: these pieces enqueue microseconds of work), in microseconds a call.
"""

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl

from h3_triton import launch


@triton.jit
def _few(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, 0.0, mask=offsets < n)


@triton.jit
def _many(x_ptr, p1, p2, p3, p4, p5, p6, p7, n, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, i12, i13, i14, i15,
          i16, i17, i18, i19, i20, i21, i22, i23, i24, i25, i26, i27, i28, i29, i30,
          A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, 0.0, mask=offsets < n)


def micros(call, batches: int, steps: int) -> float:
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(steps):
            call()
        samples.append((time.perf_counter() - start) * 1e6 / steps)
        torch.cuda.synchronize()
    return statistics.median(samples)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return dy


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    device = "cuda"
    x = torch.empty(4096, device=device)
    ints = [64 * (i + 1) for i in range(30)]
    many = (x, *[x] * 7, 4096, *ints)
    many_meta = dict(A=True, B=False, C=1, D=2, BLOCK=1024)
    compiled_few = _few[(4,)](x, 4096, BLOCK=1024)
    compiled_many = _many[(4,)](*many, **many_meta)
    leaf = torch.zeros(3, 2688, device=device, requires_grad=True)
    grad = torch.ones(3, 2688, device=device)
    pieces = {
        "torch.empty((3, 96768), bf16)": lambda: torch.empty((3, 96768), dtype=torch.bfloat16, device=device),
        "torch.empty((24, 3, 2688), f32)": lambda: torch.empty((24, 3, 2688), dtype=torch.float32, device=device),
        "torch.zeros((168,), int32)": lambda: torch.zeros((168,), dtype=torch.int32, device=device),
        "torch.cuda.current_stream()": torch.cuda.current_stream,
        "identity autograd.Function forward+backward": lambda: _Identity.apply(leaf).backward(grad),
        "autograd forward+backward of leaf * 1": lambda: (leaf * 1).backward(grad),
        "triton kernel[grid], 3 arguments": lambda: _few[(4,)](x, 4096, BLOCK=1024),
        "triton compiled[grid], 3 arguments": lambda: compiled_few[(4, 1, 1)](x, 4096, 1024),
        "triton kernel[grid], 44 arguments": lambda: _many[(4,)](*many, **many_meta),
        "triton kernel[lambda grid], 44 arguments": lambda: _many[lambda meta: (4,)](*many, **many_meta),
        "triton compiled[grid], 44 arguments": lambda: compiled_many[(4, 1, 1)](*many, *many_meta.values()),
        "h3_triton.launch direct, 3 arguments": lambda: launch._direct(_few).launch((4,), (x, 4096), {"BLOCK": 1024}),
        "h3_triton.launch direct, 44 arguments": lambda: launch._direct(_many).launch((4,), many, many_meta),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, call in pieces.items():
        print(f"{name:50s} {micros(call, args.batches, args.steps):8.2f} us a call", flush=True)


if __name__ == "__main__":
    main()
