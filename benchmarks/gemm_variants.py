"""The block's bf16 forward GEMMs at release shapes: h3_triton's tiled kernel, a persistent TMA kernel, cuBLAS.

Usage (GPU): python benchmarks/gemm_variants.py [--configs 128x256x64w8s3,...]
             TRITON_INTERPRET=1 python benchmarks/gemm_variants.py --shape small --device cpu   (checks itself)

h3_triton's GEMM reaches 0.72-0.75x cuBLAS forward at release shapes on an H200 (``results/h200-perf``): a
pointer-based kernel, one program per output tile, masked loads along K. The variant here is the Hopper
recipe: tensor descriptors (TMA loads that fill out-of-range rows with zeros, so no masks), one program per SM
looping over output tiles in grouped order (``NUM_SMS`` programs; the epilogue of one tile overlaps the loads of
the next). This is a measurement to decide whether ``h3_triton.gemm`` should move to it; every variant's output
is compared with cuBLAS's (max abs difference, relative to the output's max) so a fast wrong kernel shows.
"""

import re

import torch
import triton
import triton.language as tl

from h3_triton.gemm import linear
from h3_triton.interpret import INTERPRET, mma, to_dtype
from h3gate.bench import SHAPES, cases, median_ms

import variant_cli


@triton.jit
def _persistent_tma(a_ptr, w_ptr, c_ptr, M, N, K,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    NUM_SMS: tl.constexpr, UPCAST: tl.constexpr):
    """C (M, N) = A (M, K) @ W^T for row-major A, W (N, K), C; fp32 accumulation, one rounding to bf16."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[N, K], strides=[K, 1], block_shape=[BLOCK_N, BLOCK_K])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N])
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_group = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_SMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        group_m = tl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % group_m
        pid_n = (tile % per_group) // group_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            w = w_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = mma(a, w.T, acc, UPCAST)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], to_dtype(acc, c_ptr.dtype.element_ty, UPCAST))


def persistent_tma(x: torch.Tensor, weight: torch.Tensor, config: dict, programs: int) -> torch.Tensor:
    a = x.reshape(-1, x.shape[-1])
    out = torch.empty((a.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
    meta = {k: v for k, v in config.items() if k.startswith(("BLOCK", "GROUP"))}
    _persistent_tma[(programs,)](a, weight, out, a.shape[0], weight.shape[0], a.shape[1], **meta, NUM_SMS=programs,
                                 UPCAST=INTERPRET,
                                 num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out.view(*x.shape[:-1], weight.shape[0])


def parse_config(text: str) -> dict:
    """``128x256x64w8s3`` -> BLOCK_M 128, BLOCK_N 256, BLOCK_K 64, 8 warps, 3 stages (GROUP_M 8)."""
    found = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not found:
        raise ValueError(f"config {text!r}: write BLOCK_MxBLOCK_NxBLOCK_K, warps, stages as 128x256x64w8s3")
    m, n, k, warps, stages = map(int, found.groups())
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, num_warps=warps, num_stages=stages)


def main():
    args, configs = variant_cli.parse(__doc__, "128x256x64w8s3,128x256x64w8s4,128x128x64w8s4,256x128x64w8s3",
                                      "128x256x64w8s3", parse_config)
    on_gpu = args.device.startswith("cuda")
    programs = torch.cuda.get_device_properties(args.device).multi_processor_count if on_gpu else 4
    for case in cases(SHAPES[args.shape], args.device):
        if case.op != "linear":
            continue
        inputs = case.make()
        x, weight = inputs["x"], inputs["weight"]
        reference = (x.float() @ weight.float().T).to(x.dtype) if not on_gpu else x @ weight.T
        scale = reference.float().abs().max().item()
        runs = {"cuBLAS": lambda: x @ weight.T, "h3_triton": lambda: linear(x, weight)}
        runs.update({f"tma {name}": (lambda config=config: persistent_tma(x, weight, config, programs))
                     for name, config in configs.items()})
        base_ms = None
        for name, run in runs.items():
            error = (run().float() - reference.float()).abs().max().item() / scale
            ms = median_ms(run, args.device)
            base_ms = base_ms or ms
            print(f"{case.label:34s} {name:22s} {ms:8.3f} ms {case.work[0] / ms / 1e9:7.1f} TFLOP/s "
                  f"x{base_ms / ms:5.2f} of cuBLAS, max diff {error:.1e} of max |C|")


if __name__ == "__main__":
    main()
