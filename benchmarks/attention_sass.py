"""The Gluon attention kernels compiled for an H200 and read without one: h3_triton's Hopper forward and backward
(:mod:`h3_triton.attention_hopper`) and the two single-partition forward schedules of ``attention_fwd_gluon.py``,
each at the release shape's specialisation (38,222 tokens x 56 heads x 128, every stride a multiple of 16).

Usage: python benchmarks/attention_sass.py   (any machine, in a virtual environment with triton==3.6.0 and torch:
           the release the H200 runs, whose wheel ships ptxas and nvdisasm; see :mod:`sm90_sass`)

For each kernel: registers (and the counts its warp-specialised partitions set), shared memory, the bytes ptxas
spills, and every loop that issues products or touches local memory: its instructions, ``HGMMA`` instructions and
commit groups, the waits for all of them, exponentials, and local loads and stores (spilled values reloaded each
iteration). A loop with as many waits as groups runs its products one after another.
"""

from __future__ import annotations

import triton

import sm90_sass

S, H, D = 38222, 56, 128
_STRIDES = {"b": S * H * D, "s": H * D, "h": D}


def _forward_args(prefixes: str) -> dict[str, int]:
    """Stride arguments ``stride_{x}{b,s,h}`` of each tensor prefix at the release layout (B, S, H, D)."""
    return {f"stride_{x}{axis}": value for x in prefixes.split() for axis, value in _STRIDES.items()}


def _kernels():
    """(label, kernel, argument types, constexprs, aligned arguments, options) of every kernel reported."""
    from h3_triton import attention_hopper as hopper

    import attention_fwd_gluon

    forward = {name: "*bf16" for name in ("Q", "K", "V", "O")} | {"ROW_MAX": "*fp32", "ROW_LOG_SUM": "*fp32"}
    strides = _forward_args("q k v o")
    forward_types = forward | {name: "i32" for name in (*strides, "H", "S")} | {"qk_scale": "fp32"}
    yield ("h3_triton's Hopper forward (attention_hopper._forward_kernel)", hopper._forward_kernel, forward_types,
           dict(HEAD_DIM=D, BLOCK_M=hopper.BLOCK_M, BLOCK_N=hopper.BLOCK_N, STAGES=hopper.STAGES),
           (*forward, *strides), dict(num_warps=4, maxnreg=168))

    backward = ({name: "*bf16" for name in ("Q", "K", "V", "DO", "DK", "DV")}
                | {name: "*fp32" for name in ("LSE", "DELTA", "DQ_SUM")} | {"LOCKS": "*i32"})
    strides = _forward_args("q k v do g")
    backward_types = (backward | {name: "i32" for name in (*strides, "H", "S", "S_PADDED")}
                      | {"sm_scale": "fp32", "qk_scale": "fp32"})
    yield ("h3_triton's Hopper backward (attention_hopper._backward_kernel)", hopper._backward_kernel,
           backward_types, dict(HEAD_DIM=D, BLOCK_M=hopper.BWD_BLOCK_M, BLOCK_N=hopper.BWD_BLOCK_N,
                                STAGES=hopper.BWD_STAGES),
           (*backward, *strides, "S_PADDED"), dict(num_warps=4, maxnreg=168))

    single = {name: "i32" for name in ("stride_b", "stride_s", "stride_h", "H", "S")} | {"qk_scale": "fp32"}
    for schedule, lag in (("lockstep", False), ("lag-pv", True)):
        yield (f"attention_fwd_gluon.py --schedule {schedule} (one partition of 8 warps, 3 stages)",
               attention_fwd_gluon._gluon_fwd_kernel, forward | single,
               dict(HEAD_DIM=D, BLOCK_M=attention_fwd_gluon.BLOCK, BLOCK_N=attention_fwd_gluon.BLOCK, STAGES=3,
                    LAG_PV=lag),
               (*forward, "stride_b", "stride_s", "stride_h"), dict(num_warps=8))


def main() -> None:
    print(f"triton {triton.__version__}, sm_90, release shape {S} x {H} heads x {D}")
    for label, kernel, types, consts, aligned, options in _kernels():
        read = sm90_sass.inspect(sm90_sass.compile_sm90(kernel, types, consts, aligned, **options))
        print(f"\n{label}\n  {read.summary()}")
        for loop in sm90_sass.loops(read.sass):
            if loop.count("HGMMA", "LDL", "STL"):
                print(f"  loop: {loop.summary()}")


if __name__ == "__main__":
    main()
