"""The Gluon attention kernels compiled for an H200 and read without one: h3_triton's Hopper forward and backward
(:mod:`h3_triton.attention_hopper`) and the two single-partition forward schedules of ``attention_fwd_gluon.py``, each at the release shape's specialisation (38,222 tokens x 56
heads x 128, every stride a multiple of 16).

Usage: PYTHONPATH=.venv/triton-3.6:benchmarks .venv/bin/python benchmarks/attention_sass.py [--json]
           (any machine: the Triton the H200 runs, which ``make setup`` installs in ``.venv/triton-3.6``, ships
           ptxas and nvdisasm; see :mod:`sm90_sass`). ``--json``: one object a kernel (its shared memory, spills, and
           each loop's products, groups, waits and local loads and stores), for ``tests/kernels/test_hopper_sass.py``

For each kernel: registers (and the counts its warp-specialised partitions set), shared memory, the bytes ptxas
spills, and every loop that issues products or touches local memory: its instructions, ``HGMMA`` instructions and
commit groups, the waits for all of them, exponentials, and local loads and stores (spilled values reloaded each
iteration). A loop with as many waits as groups runs its products one after another.
"""

from __future__ import annotations

import argparse
import json

import triton

import sm90_sass

S, H, D = 38222, 56, 128
_STRIDES = {"b": S * H * D, "s": H * D, "h": D}


def _forward_args(prefixes: str) -> dict[str, int]:
    """Stride arguments ``stride_{x}{b,s,h}`` of each tensor prefix at the release layout (B, S, H, D)."""
    return {f"stride_{x}{axis}": value for x in prefixes.split() for axis, value in _STRIDES.items()}


def _kernels():
    """(name, kernel, argument types, constexprs, aligned arguments, options) of every kernel reported: h3_triton's
    Hopper forward and backward, and the ``lockstep`` and ``lag-pv`` schedules of ``attention_fwd_gluon.py`` (one partition of 8 warps, 3
    stages)."""
    from h3_triton import attention_hopper as hopper

    import attention_fwd_gluon

    forward = {name: "*bf16" for name in ("Q", "K", "V", "O")} | {"ROW_MAX": "*fp32", "ROW_LOG_SUM": "*fp32"}
    strides = _forward_args("q k v o")
    forward_types = forward | {name: "i32" for name in (*strides, "H", "S")} | {"qk_scale": "fp32"}
    yield ("attention_hopper._forward_kernel", hopper._forward_kernel, forward_types,
           dict(HEAD_DIM=D, BLOCK_M=hopper.BLOCK_M, BLOCK_N=hopper.BLOCK_N, STAGES=hopper.STAGES),
           (*forward, *strides), dict(num_warps=4, maxnreg=168))

    backward = ({name: "*bf16" for name in ("Q", "K", "V", "DO", "DK", "DV")}
                | {name: "*fp32" for name in ("LSE", "DELTA", "DQ_SUM")} | {"LOCKS": "*i32"})
    strides = _forward_args("q k v do g")
    backward_types = (backward | {name: "i32" for name in (*strides, "H", "S", "S_PADDED")}
                      | {"sm_scale": "fp32", "qk_scale": "fp32"})
    backward_consts = dict(HEAD_DIM=D, BLOCK_M=hopper.BWD_BLOCK_M, BLOCK_N=hopper.BWD_BLOCK_N,
                           STAGES=hopper.BWD_STAGES)
    yield ("attention_hopper._backward_kernel", hopper._backward_kernel, backward_types, backward_consts,
           (*backward, *strides, "S_PADDED"), dict(num_warps=4, maxnreg=168))

    single = {name: "i32" for name in ("stride_b", "stride_s", "stride_h", "H", "S")} | {"qk_scale": "fp32"}
    for schedule, lag in (("lockstep", False), ("lag-pv", True)):
        yield (f"attention_fwd_gluon.py --schedule {schedule}",
               attention_fwd_gluon._gluon_fwd_kernel, forward | single,
               dict(HEAD_DIM=D, BLOCK_M=attention_fwd_gluon.BLOCK, BLOCK_N=attention_fwd_gluon.BLOCK, STAGES=3,
                    LAG_PV=lag),
               (*forward, "stride_b", "stride_s", "stride_h"), dict(num_warps=8))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object a kernel instead of the report")
    args = parser.parse_args()
    if not args.json:
        print(f"triton {triton.__version__}, sm_90, release shape {S} x {H} heads x {D}")
    for name, kernel, types, consts, aligned, options in _kernels():
        read = sm90_sass.inspect(sm90_sass.compile_sm90(kernel, types, consts, aligned, **options))
        found = [loop for loop in sm90_sass.loops(read.sass) if loop.count("HGMMA", "LDL", "STL")]
        if args.json:
            print(json.dumps({"kernel": name, "triton": triton.__version__, "shared": read.shared,
                              "spill_stores": read.spill_stores, "spill_loads": read.spill_loads,
                              "loops": [loop.products for loop in found],
                              "loop_locals": [loop.count("LDL", "STL") for loop in found]}))
            continue
        print(f"\n{name}\n  {read.summary()}")
        for loop in found:
            print(f"  loop: {loop.summary()}")


if __name__ == "__main__":
    main()
