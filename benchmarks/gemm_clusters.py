"""Whether h3_triton's TMA GEMM can share its operand tiles across a cluster of CTAs on an H200 (sm_90), read from
what Triton compiles, on any machine (see :mod:`sm90_sass`; put the H200's Triton first on ``PYTHONPATH``).

Usage (any machine): PYTHONPATH=.venv/triton-3.6:kernels:src:benchmarks TRITON_INTERPRET=0 \\
    python benchmarks/gemm_clusters.py [--ctas 1,2] [--tiling 128x256x8x3]

cuBLAS runs the block's projections in clusters of two CTAs (``results/h100-perf/linear-products/ncu-*.csv``:
cluster size 2, kernels ``nvjet_sm90_tst_..._2x1`` or ``_1x2``), whose TMA loads can multicast a tile of the operand
the two share, so it leaves L2 once for both. Under Nsight Compute its products keep the SMs 96.3-98.4% busy
against h3_triton's 94.6-96.9% at the same clock (within 0.3% in three of the four products profiled), the gap of
the bench's ratios. A multicast
load is a ``cp.async.bulk.tensor`` with ``.multicast::cluster`` in the PTX; this prints, per ``num_ctas``, the
cluster the kernel asks for, the shared memory of each CTA, its TMA loads and how many of them multicast. With
Triton 3.6, ``num_ctas=2`` gives a cluster of two that splits the tile's columns between its CTAs (131 KB of shared
memory each against 213 KB: 128 x 128 apiece), each loading the whole tile of A itself: no load multicasts, and
neither Triton's descriptor loads nor Gluon's Hopper TMA copy take a multicast argument.
"""

import argparse
import re

from sm90_sass import compile_sm90

from h3_triton import gemm


def compile_gemm(ctas: int, block_m: int, block_n: int, warps: int, stages: int):
    consts = dict(A_T=False, B_T=False, HAS_BIAS=False, INTERPRETED=False, NUM_SMS=132, BLOCK_M=block_m,
                  BLOCK_N=block_n, BLOCK_K=64, GROUP_M=8)
    tensors = {name: "*bf16" for name in ("a_ptr", "b_ptr", "c_ptr", "bias_ptr")}
    types = {**tensors, **{name: "i32" for name in ("M", "N", "K", "s_a", "s_b", "s_c", "s_bias")}}
    aligned = [*tensors, "s_a", "s_b", "s_c", "s_bias"]
    return compile_sm90(gemm._tma_gemm_kernel, types, consts, aligned, num_warps=warps, num_stages=stages,
                        num_ctas=ctas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ctas", default="1,2", help="num_ctas values, comma-separated")
    parser.add_argument("--tiling", default="128x256x8x3", help="BLOCK_MxBLOCK_Nxwarpsxstages (the shipped first)")
    args = parser.parse_args()
    block_m, block_n, warps, stages = map(int, args.tiling.split("x"))
    for ctas in map(int, args.ctas.split(",")):
        done = compile_gemm(ctas, block_m, block_n, warps, stages)
        ptx = done.asm["ptx"]
        cluster = re.search(r"\.reqnctapercluster (\d+)", ptx)
        loads = [line for line in ptx.splitlines() if re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared", line)]
        print(f"num_ctas {ctas}: cluster of {cluster.group(1) if cluster else 1}, {done.metadata.shared} B shared a "
              f"CTA, {len(loads)} TMA loads in the PTX, {sum('multicast' in line for line in loads)} of them multicast")


if __name__ == "__main__":
    main()
