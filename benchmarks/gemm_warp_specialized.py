"""The block's GEMMs at release shape with Triton's automatic warp specialisation (Hopper), against h3_triton's
TMA kernel and cuBLAS, per product: the forward, the input gradient and the weight gradient.

Usage (GPU): python benchmarks/gemm_warp_specialized.py [--configs 128x256w4s3,128x256w4s3p,...]

h3_triton's bfloat16 GEMMs run one persistent program of 8 warps per SM that issues the TMA loads and the
products in turn: 0.98-1.04x cuBLAS forward at the six block shapes, 0.88-1.00x forward+backward
(``results/h200-perf/h200-release-ops-block-tma.json``), where cuBLAS's backward products run faster than its
forward ones. On Hopper, Triton 3.6 splits a loop marked ``warp_specialize=True`` whose tiles all come through
tensor descriptors into a producer warp group issuing the TMA loads and two consumer groups of 4 warps, each
owning half of the tile's rows (what the dK/dV kernel of the attention backward gained 18% from). The variant
here is h3_triton's kernel with that mark on the loop over K, with one output tile per program, or (suffix ``p``)
inside h3_triton's persistent loop over tiles (marking that loop, flattened with the K loop as h3_triton's is,
leaves the kernel unsplit). Same 64-deep steps along K in the same order, so
its products are compared bitwise with h3_triton's (max abs difference); cuBLAS's only for scale.

Measured on an H200 (``results/h200-perf/gemm-warp-specialized.log``): every variant's products are bitwise
h3_triton's, and the best runs at 0.91-1.01x of h3_triton's speed across the twelve products; not adopted.
"""

import argparse
import re

import torch
import triton
import triton.language as tl

from h3_triton import gemm
from h3_triton.gemm import _grouped_tile, _operand_descriptor, _tma_operand
from h3_triton.interpret import INTERPRET
from h3_triton.tma import program_slots, set_scratch_allocator
from h3gate.bench import median_ms

ROWS = 38222
# (name, in features, out features) of the block's projections at release (hidden 5376, 56 x 128 heads, ffn 14336).
LINEARS = (("to_q/k/v", 5376, 7168), ("to_out", 7168, 5376), ("ff up", 5376, 28672), ("ff down", 14336, 5376))


@triton.jit
def _ws_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_a, s_b, s_c,
                    A_T: tl.constexpr, B_T: tl.constexpr, NUM_SMS: tl.constexpr, PERSISTENT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """h3_triton's ``_tma_gemm_kernel`` (no bias) with a warp-specialised loop."""
    a_desc = _operand_descriptor(a_ptr, M, K, s_a, A_T, BLOCK_M, BLOCK_K)
    b_desc = _operand_descriptor(b_ptr, N, K, s_b, B_T, BLOCK_N, BLOCK_K)
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[s_c, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        for tile in range(tl.program_id(0), num_m * num_n, NUM_SMS):
            _ws_tile(a_desc, b_desc, c_desc, tile, num_m, num_n, k_tiles, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:
        _ws_tile(a_desc, b_desc, c_desc, tl.program_id(0), num_m, num_n, k_tiles, A_T, B_T, BLOCK_M, BLOCK_N, BLOCK_K,
                 GROUP_M)


@triton.jit
def _ws_tile(a_desc, b_desc, c_desc, tile, num_m, num_n, k_tiles, A_T: tl.constexpr, B_T: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile number ``tile`` (grouped order), its loop over K warp-specialised."""
    pid_m, pid_n = _grouped_tile(tile, num_m, num_n, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in tl.range(0, k_tiles, warp_specialize=True):
        a = _tma_operand(a_desc, pid_m * BLOCK_M, ki * BLOCK_K, A_T)
        b = _tma_operand(b_desc, pid_n * BLOCK_N, ki * BLOCK_K, B_T)
        acc = tl.dot(a, b.T, acc)
    c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))

def parse_config(text: str) -> dict:
    """``128x256w4s3`` (BLOCK_M x BLOCK_N, warps, stages), ``p`` suffix: persistent."""
    match = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)(p?)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"config {text!r} is not like 128x256w4s3 or 128x256w4s3p")
    m, n, warps, stages, persistent = match.groups()
    return {"BLOCK_M": int(m), "BLOCK_N": int(n), "num_warps": int(warps), "num_stages": int(stages),
            "PERSISTENT": bool(persistent), "name": text}


def products(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor):
    """(name, stored A, A_T, stored B, B_T, cuBLAS) of the three products of a linear, as h3_triton's backward
    runs them: y = x W^T; dx = dy W; dW = dy^T x (A and B stored (K, M) and (K, N))."""
    return (
        ("forward", x, False, weight, False, lambda: x @ weight.T),
        ("input grad", dy, False, weight, True, lambda: dy @ weight),
        ("weight grad", dy, True, x, True, lambda: dy.T @ x),
    )


def launch(a, a_t, b, b_t, config, slots):
    M, K = (a.shape[1], a.shape[0]) if a_t else a.shape
    N = b.shape[1] if b_t else b.shape[0]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    tiles = triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"])
    grid = (min(slots, tiles),) if config["PERSISTENT"] else (tiles,)
    _ws_gemm_kernel[grid](a, b, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), A_T=a_t, B_T=b_t, NUM_SMS=slots,
                          PERSISTENT=config["PERSISTENT"], BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                          BLOCK_K=64, GROUP_M=8, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return c


def h3_triton_product(a, a_t, b, b_t):
    """h3_triton's TMA kernel on the same stored operands, through its launcher (its tuned tiling)."""
    M, K = (a.shape[1], a.shape[0]) if a_t else a.shape
    N = b.shape[1] if b_t else b.shape[0]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    slots = program_slots(a.device)
    gemm._DESCRIBED(lambda meta: (min(slots, triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])),),
                    a, b, c, c, M, N, K, a.stride(0), b.stride(0), c.stride(0), 0, A_T=a_t, B_T=b_t,
                    HAS_BIAS=False, INTERPRETED=INTERPRET, NUM_SMS=slots)
    return c


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="128x256w4s3,128x256w4s2,128x128w4s4,128x256w4s3p",
                        type=lambda text: [parse_config(part) for part in text.split(",")],
                        help="warp-specialised tilings, comma-separated (see parse_config)")
    parser.add_argument("--linears", default=",".join(name for name, *_ in LINEARS),
                        help="which of the block's projections, comma-separated")
    args = parser.parse_args()
    set_scratch_allocator()
    slots = program_slots(torch.device("cuda"))
    generator = torch.Generator(device="cuda").manual_seed(0)
    wanted = args.linears.split(",")
    for name, k_in, n_out in LINEARS:
        if name not in wanted:
            continue
        x = torch.randn(ROWS, k_in, device="cuda", generator=generator).to(torch.bfloat16)
        weight = (torch.randn(n_out, k_in, device="cuda", generator=generator) / k_in ** 0.5).to(torch.bfloat16)
        dy = torch.randn(ROWS, n_out, device="cuda", generator=generator).to(torch.bfloat16)
        for product, a, a_t, b, b_t, cublas in products(x, weight, dy):
            label = f"linear {name} {ROWS}x{k_in}->{n_out} {product:11s}"
            reference = h3_triton_product(a, a_t, b, b_t)
            flops = 2.0 * reference.shape[0] * reference.shape[1] * (a.shape[0] if a_t else a.shape[1])
            base = median_ms(lambda: h3_triton_product(a, a_t, b, b_t), "cuda")
            rows = [("cuBLAS", median_ms(cublas, "cuda"), None), ("h3_triton", base, 0.0)]
            for config in args.configs:
                try:
                    out = launch(a, a_t, b, b_t, config, slots)
                    diff = (out.float() - reference.float()).abs().max().item()
                    rows.append((f"ws {config['name']}", median_ms(lambda: launch(a, a_t, b, b_t, config, slots),
                                                                   "cuda"), diff))
                except Exception as error:  # a tiling Triton cannot compile or run is reported, not fatal
                    print(f"{label} ws {config['name']:14s} FAILED: {str(error).splitlines()[0][:200]}", flush=True)
            for kind, ms, diff in rows:
                compared = "" if diff is None else f", max diff {diff:.1e} of h3_triton's"
                print(f"{label} {kind:18s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s x {base / ms:4.2f} of "
                      f"h3_triton's{compared}", flush=True)


if __name__ == "__main__":
    main()
