"""Variants of the few-rows backward (``h3_triton.gemm._few_rows_backward_kernel``, silu_linear's AdaLN backward),
each bitwise the product kernel, compared by what they compile to and by their time at the release shape.

Usage: python benchmarks/few_rows_variants.py --sass [--variants XT,XT+TRANS] [--tilings 64x2x3,...]
           (any machine: compiles for sm_90 and prints registers, shared memory and the main loop's instructions)
       TRITON_INTERPRET=1 python benchmarks/few_rows_variants.py --check   (CPU: every variant's bits against the
           product kernel's, at a ragged shape with three chunks)
       python benchmarks/few_rows_variants.py   (GPU: forward+backward at the release shape, wall and GPU time beside
           the provider's and the product's, every gradient compared bitwise with the product's)

The kernel runs a 64-row step of W per iteration: a tensor-core product for dX, and dW written beside it as R
multiply-adds per element. As first written (every flag below off) it reached 50% of the DRAM bandwidth on an H200
with SMs active 76% of its time (``results/h200-perf/silu-linear/ncu-bwd-few-rows.csv``), where the provider's two
cuBLAS kernels reach 71% and 92%. Compiled for sm_90 (Triton 3.6), its loop issued 0.42-0.73 warp-instructions per
element of W over its tilings; at 128 x 4 x 3 Triton lays the dW tile out with all 64 rows in every thread (each
column's x in one thread), so every thread loads all 64 dY values of each row and converts them, the tile passes
through shared memory to be stored in 16-byte pieces, and 3 programs fit an SM: 1.27 waves of the release grid, the
last one short. ``TRANS+XT`` measured fastest (``results/h200-perf/silu-linear/few-rows-variants*.log``: 0.408-0.425
ms of GPU time for the forward+backward at 128 columns, against 0.563-0.566 ms) and is now the product kernel's form;
the variant kernel keeps the first form (``none``) and the other flags to compare. The flags change how dW's
operands reach the loop, never its arithmetic (each element is the sum over rows, in row order, of
dY[r, n] x act(x)[r, k], two bfloat16 values whose product float32 holds exactly):

- ``XT``: act(x) for all rows loaded and rounded once before the loop, each row taken from that tile inside it
  (a sum of one value and zeros, exact) where the first form reloads and recomputes it every step;
- ``TRANS``: the dW tile formed transposed (columns by rows) and stored through transposed pointers;
- ``GT``: dY's rows taken from the step's dY tile (already loaded for the dX product) instead of loads of their own;
- ``SUMS_IF``: dbias's rows loaded only by the programs that store dbias (the first column tile);
- ``EVICT``: W loaded and dW stored with ``evict_first``, neither being read again.

``--sass`` needs only a triton that compiles for sm_90; to read the SASS the H200 runs, the H200's Triton 3.6, which
``make setup`` installs in ``.venv/triton-3.6`` (``PYTHONPATH=.venv/triton-3.6:benchmarks .venv/bin/python
benchmarks/few_rows_variants.py --sass``); the instruction counts are the static body of the kernel's longest loop
(its 64-row step), per thread and per element of W.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys

import torch
import triton
import triton.language as tl

from h3_triton import gemm
from h3_triton.gemm import _finish_chunks, _row_offsets
from h3_triton.interpret import INTERPRET, mma, to_dtype

import sm90_sass

FLAGS = ("XT", "TRANS", "GT", "SUMS_IF", "EVICT")
VARIANTS = "product,none,XT,XT+SUMS_IF,TRANS+XT,TRANS+XT+SUMS_IF,TRANS+XT+GT+SUMS_IF,XT+EVICT"
TILINGS = "64x2x3,64x2x4,64x4x3,128x4x3,128x8x3,256x8x3"


@triton.jit
def _variant_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_ptr, dbias_ptr, partial_ptr, count_ptr,
    N, K, R_INNER, N_CHUNK, CHUNKS,
    s_dy_mo, s_dy_mi, s_dy_n,
    s_x_mo, s_x_mi, s_x_k,
    s_w_n, s_w_k,
    s_dx_mo, s_dx_mi, s_dx_k,
    s_dw_n, s_dw_k,
    s_dbias,
    R: tl.constexpr, M_SPLIT: tl.constexpr, SILU: tl.constexpr, HAS_DBIAS: tl.constexpr, INTERPRETED: tl.constexpr,
    BLOCK_K: tl.constexpr,
    XT: tl.constexpr, TRANS: tl.constexpr, GT: tl.constexpr, SUMS_IF: tl.constexpr, EVICT: tl.constexpr,
):
    """The kernel as first written, with the flags of the module docstring (``TRANS+XT``: the product kernel's
    form, instruction for instruction)."""
    STEP: tl.constexpr = 64
    ROWS: tl.constexpr = 16
    EVICTION: tl.constexpr = "evict_first" if EVICT else ""
    pid_k = tl.program_id(0)
    chunk = tl.program_id(1).to(tl.int64)
    n_start = chunk * N_CHUNK
    n_len = tl.minimum(N - n_start, N_CHUNK)
    rr = tl.arange(0, ROWS)
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    rs = tl.arange(0, STEP)
    in_r = rr < R
    in_k = rk < K
    dy_rows = dy_ptr + _row_offsets(rr, R_INNER, s_dy_mo, s_dy_mi, M_SPLIT)
    w_cols = w_ptr + rk.to(tl.int64) * s_w_k
    dw_cols = dw_ptr + rk.to(tl.int64) * s_dw_k
    if XT:
        xs = tl.load(x_ptr + _row_offsets(rr, R_INNER, s_x_mo, s_x_mi, M_SPLIT)[:, None] + rk[None, :] * s_x_k,
                     mask=in_r[:, None] & in_k[None, :], other=0.0)
        if SILU:
            xs = xs.to(tl.float32)
            xs = to_dtype(xs * tl.sigmoid(xs), dy_ptr.dtype.element_ty, INTERPRETED)
        xs = xs.to(tl.float32)
    acc = tl.zeros((ROWS, BLOCK_K), dtype=tl.float32)
    for step in range(0, n_len, STEP):
        n = n_start + step + rs
        in_n = rs < n_len - step
        g = tl.load(dy_rows[:, None] + n[None, :] * s_dy_n, mask=in_r[:, None] & in_n[None, :], other=0.0)
        w = tl.load(w_cols[None, :] + n[:, None] * s_w_n, mask=in_n[:, None] & in_k[None, :], other=0.0,
                    eviction_policy=EVICTION)
        acc = mma(g, w, acc, INTERPRETED)
        if TRANS:
            dw = tl.zeros((BLOCK_K, STEP), dtype=tl.float32)
        else:
            dw = tl.zeros((STEP, BLOCK_K), dtype=tl.float32)
        sums = tl.zeros((STEP,), dtype=tl.float32)
        for r in tl.static_range(R):
            if GT:
                g_r = tl.sum(tl.where(rr[:, None] == r, g.to(tl.float32), 0.0), axis=0)
            else:
                g_r = tl.load(dy_ptr + _row_offsets(r, R_INNER, s_dy_mo, s_dy_mi, M_SPLIT) + n * s_dy_n, mask=in_n,
                              other=0.0).to(tl.float32)
            if XT:
                x_r = tl.sum(tl.where(rr[:, None] == r, xs, 0.0), axis=0)
            else:
                x_r = tl.load(x_ptr + _row_offsets(r, R_INNER, s_x_mo, s_x_mi, M_SPLIT) + rk * s_x_k, mask=in_k,
                              other=0.0)
                if SILU:
                    x_r = x_r.to(tl.float32)
                    x_r = to_dtype(x_r * tl.sigmoid(x_r), dy_ptr.dtype.element_ty, INTERPRETED)
                x_r = x_r.to(tl.float32)
            if TRANS:
                dw += x_r[:, None] * g_r[None, :]
            else:
                dw += g_r[:, None] * x_r[None, :]
            if not SUMS_IF:
                sums += g_r
        if TRANS:
            dw_ptrs = dw_cols[:, None] + n.to(tl.int64)[None, :] * s_dw_n
            in_dw = in_k[:, None] & in_n[None, :]
        else:
            dw_ptrs = dw_cols[None, :] + n.to(tl.int64)[:, None] * s_dw_n
            in_dw = in_n[:, None] & in_k[None, :]
        tl.store(dw_ptrs, to_dtype(dw, dw_ptr.dtype.element_ty, INTERPRETED), mask=in_dw, eviction_policy=EVICTION)
        if HAS_DBIAS:
            if pid_k == 0:
                if SUMS_IF:
                    for r in tl.static_range(R):
                        sums += tl.load(dy_ptr + _row_offsets(r, R_INNER, s_dy_mo, s_dy_mi, M_SPLIT) + n * s_dy_n,
                                        mask=in_n, other=0.0).to(tl.float32)
                tl.store(dbias_ptr + n * s_dbias, to_dtype(sums, dbias_ptr.dtype.element_ty, INTERPRETED), mask=in_n)
    _finish_chunks(acc, pid_k, chunk, rr, rk, R, K, R_INNER, CHUNKS, partial_ptr, count_ptr,
                   dx_ptr, s_dx_mo, s_dx_mi, s_dx_k, x_ptr, s_x_mo, s_x_mi, s_x_k, M_SPLIT, SILU, INTERPRETED)


def _flags(variant: str) -> dict:
    named = [] if variant in ("product", "none") else variant.split("+")
    unknown = set(named) - set(FLAGS)
    if unknown:
        raise SystemExit(f"variant {variant!r}: unknown flags {sorted(unknown)}; use 'product', 'none' or "
                         f"'+'-joined {FLAGS}")
    return {flag: flag in named for flag in FLAGS}


def _tiling(text: str) -> tuple[dict, int, int]:
    try:
        block_k, warps, stages = (int(part) for part in text.split("x"))
    except ValueError:
        raise SystemExit(f"tiling {text!r}: give BLOCK_K x num_warps x num_stages, e.g. 64x2x3") from None
    return {"BLOCK_K": block_k}, warps, stages


class _Forced:
    """Stands in for ``gemm._FEW_ROWS_BACKWARD``: every launch runs ``variant`` (the product kernel for
    'product') at ``tiling`` (None: the interpreter's), so the product's host code is exercised."""

    def __init__(self, variant: str, tiling: str | None):
        self.kernel = gemm._few_rows_backward_kernel if variant == "product" else _variant_kernel
        self.flags = {} if variant == "product" else _flags(variant)
        if tiling is None:
            self.options = dict(gemm._FEW_ROWS_BACKWARD.interpreter)
        else:
            meta, warps, stages = _tiling(tiling)
            self.options = {**meta, "num_warps": warps, "num_stages": stages}

    def __call__(self, grid, *args, branches=None, **meta):
        self.kernel[grid](*args, **meta, **self.flags, **self.options)


@contextlib.contextmanager
def _using(launcher):
    """``launcher`` as the few-rows backward of every silu_linear inside."""
    saved, gemm._FEW_ROWS_BACKWARD = gemm._FEW_ROWS_BACKWARD, launcher
    try:
        yield
    finally:
        gemm._FEW_ROWS_BACKWARD = saved


def _gradients(inputs: dict) -> list[torch.Tensor]:
    """The temb, weight and bias gradients of silu_linear's forward+backward."""
    leaves = {k: v.detach().requires_grad_() for k, v in inputs.items()}
    gemm.silu_linear(**leaves).float().square().sum().backward()
    return [leaves[k].grad for k in ("temb", "weight", "bias")]


def check(variants: list[str]) -> bool:
    """Every variant's gradients bitwise the product kernel's, under the interpreter: 3 rows, 8,292 weight rows (three
    chunks, the last partial), 200 columns (a partial column tile)."""
    torch.manual_seed(0)
    inputs = {"temb": torch.randn(3, 200), "weight": (torch.randn(8292, 200) * 0.07).bfloat16(),
              "bias": torch.randn(8292).bfloat16()}
    with _using(_Forced("product", None)):
        reference = _gradients(inputs)
    ok = True
    for variant in variants:
        with _using(_Forced(variant, None)):
            grads = _gradients(inputs)
        same = [torch.equal(a, b) for a, b in zip(reference, grads)]
        ok &= all(same)
        print(f"{variant}: temb, weight, bias gradients bitwise the product's: {same}", flush=True)
    return ok


_SPECIALISED = {
    # what Triton's launch specialisation sees at the release shape: unit strides as the constant 1, and every
    # pointer and every integer that is a multiple of 16 marked divisible by 16 (vectorised, pipelined loads)
    "ones": ("s_dy_n", "s_x_k", "s_w_k", "s_dx_k", "s_dw_k", "s_dbias"),
    "div16": ("N", "K", "N_CHUNK", "s_dy_mi", "s_x_mi", "s_w_n", "s_dx_mi", "s_dw_n"),
    "tensors": dict(dy_ptr="*bf16", x_ptr="*fp32", w_ptr="*bf16", dx_ptr="*fp32", dw_ptr="*bf16",
                    dbias_ptr="*bf16", partial_ptr="*fp32", count_ptr="*i32"),
    "consts": dict(R=3, M_SPLIT=False, SILU=True, HAS_DBIAS=True, INTERPRETED=False),
}


def _compile(kernel, consts: dict, warps: int, stages: int):
    consts = {**consts, **{name: 1 for name in _SPECIALISED["ones"]}}
    tensors = _SPECIALISED["tensors"]
    types = {name: tensors.get(name, "i32") for name in kernel.arg_names if name not in consts}
    return sm90_sass.compile_sm90(kernel, types, consts, (*tensors, *_SPECIALISED["div16"]), num_warps=warps,
                                  num_stages=stages)


def sass(variants: list[str], tilings: list[str]) -> None:
    print(f"triton {triton.__version__}, sm_90, R=3 rows, SiLU, dbias. Per thread: instructions of the loop body (one "
          "64-row step); per element: warp-instructions per element of W; waves: the release grid (2,688 columns, "
          "24 chunks) over 132 SMs")
    memory = ("LDG", "LDGSTS", "STG", "LDS", "STS", "LDSM", "STSM")
    for text in tilings:
        meta, warps, stages = _tiling(text)
        programs = -(-2688 // meta["BLOCK_K"]) * 24
        for variant in variants:
            forced = _Forced(variant, text)
            try:
                compiled = _compile(forced.kernel, {**_SPECIALISED["consts"], **forced.flags, **meta}, warps, stages)
            except Exception as error:  # a tiling the compiler rejects is reported, the others still compile
                print(f"{text:9s} {variant:22s} not compiled: {str(error).splitlines()[-1][:160]}", flush=True)
                continue
            read = sm90_sass.inspect(compiled)
            registers, shared = read.registers, read.shared
            opcodes = collections.Counter(sm90_sass.loops(read.sass)[0].opcodes)  # the 64-row step
            length = sum(opcodes.values())
            resident = sm90_sass.resident(registers, shared, warps)
            moves = " ".join(f"{op}:{count}" for op, count in sorted(opcodes.items()) if op.split(".")[0] in memory)
            print(f"{text:9s} {variant:22s} {registers:3d} regs {shared:6d} B shared, {resident:2d}/SM "
                  f"{programs / (132 * resident):4.2f} waves | {length:4d} per thread "
                  f"{length * warps / (64 * meta['BLOCK_K']):.3f} per element | {moves}", flush=True)


def bench(variants: list[str], tilings: list[str]) -> None:
    """Forward+backward at the release shape per variant and tiling, as ``gemm_tilings.py`` times tilings."""
    from gemm_tilings import gpu_ms, report, timed

    from h3gate import op_registry
    from h3gate.bench import RELEASE, _forward_backward, cases, median_ms

    case = next(case for case in cases(RELEASE, "cuda") if case.op == "silu_linear")
    inputs = case.make()
    provider = _forward_backward(op_registry.provider_ops()["silu_linear"], inputs, "random")
    provider_times = median_ms(provider, "cuda"), gpu_ms(provider)
    print(f"{case.label}: provider forward+backward {provider_times[0]:.4f} ms wall, {provider_times[1]:.4f} ms GPU",
          flush=True)
    reference = None
    for text in tilings:
        for variant in variants:
            try:
                with _using(_Forced(variant, text)):
                    grads = _gradients(inputs)
                    times = timed(_forward_backward(gemm.silu_linear, inputs, "random"))
            except (triton.runtime.errors.OutOfResources, RuntimeError) as error:
                print(f"  {text} {variant}: not launched ({type(error).__name__}: {str(error).splitlines()[0]})")
                continue
            reference = reference or grads
            report(f"{text} {variant}", times, provider_times, reference, grads, "the first variant")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--sass", action="store_true", help="compile for sm_90 and summarise the SASS (no GPU needed)")
    mode.add_argument("--check", action="store_true", help="bits against the product kernel, under the interpreter")
    parser.add_argument("--variants", default=VARIANTS, help=f"comma-separated, flags joined by '+' (default {VARIANTS})")
    parser.add_argument("--tilings", default=TILINGS, help=f"BLOCK_KxWARPSxSTAGES, comma-separated (default {TILINGS})")
    args = parser.parse_args(argv)
    variants, tilings = args.variants.split(","), args.tilings.split(",")
    for variant in variants:
        _flags(variant)
    if args.sass:
        sass(variants, tilings)
    elif args.check:
        if not INTERPRET:
            raise SystemExit("--check runs under Triton's interpreter: set TRITON_INTERPRET=1")
        sys.exit(0 if check(variants) else 1)
    else:
        bench(variants, tilings)


if __name__ == "__main__":
    main()
