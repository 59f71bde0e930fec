"""Forward+backward time of a GEMM op at its release shapes under each tiling of one of its launchers.

Usage (GPU): python benchmarks/gemm_tilings.py --op silu_linear --launcher _OUTER \
    --tilings 64x256x4x1,128x128x8x1,...

A tiling is BLOCK_M x BLOCK_N x num_warps x num_stages (BLOCK_K x num_warps x num_stages for the few-rows
backward, whose tiles span all rows); each is forced on the launcher
(``h3_triton.tuning.Launcher.forcing``) for the whole forward+backward, timed with ``triton.testing.do_bench``
(median wall time, which includes the host's launch work), and by the sum of its kernels' durations in a
torch.profiler trace (GPU time alone), beside the provider's forward+backward in the same run. Every gradient is compared with the one of the
launcher's first tiling: the GEMM's reduction order does not follow the tiling, so any difference is printed as a
defect. A tiling the kernel cannot launch (too much shared memory) is reported and skipped.
"""

import argparse
import time

import torch
import triton

from h3_triton import gemm
from h3_triton.backend import H3Triton
from h3gate import op_registry
from h3gate.bench import RELEASE, _forward_backward, cases, median_ms


def _tiling(text: str, first: triton.Config) -> triton.Config:
    """``text``'s tiling, with the other sizes of the launcher's first tiling (BLOCK_K, GROUP_M)."""
    *sizes, warps, stages = (int(part) for part in text.split("x"))
    names = [name for name in ("BLOCK_M", "BLOCK_N") if name in first.kwargs] or ["BLOCK_K"]
    if len(sizes) != len(names):
        raise SystemExit(f"tiling {text!r}: give {' x '.join(names)} x num_warps x num_stages")
    fixed = {key: value for key, value in first.kwargs.items() if key not in names}
    return triton.Config({**dict(zip(names, sizes)), **fixed}, num_warps=warps, num_stages=stages)


def gpu_ms(step, repeats: int = 10) -> float:
    """The summed duration of the CUDA kernels of one ``step()``, from a torch.profiler trace of ``repeats`` calls."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(repeats):
            step()
        torch.cuda.synchronize()
    return sum(event.device_time_total for event in trace.events() if event.device_type.name == "CUDA") / 1e3 / repeats


def host_ms(step, repeats: int = 20) -> float:
    """The host's time to enqueue one ``step()``, the GPU left to run behind it."""
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed * 1e3 / repeats


def timed(step) -> tuple[float, float, float]:
    """(wall, GPU, host) milliseconds of one ``step()``."""
    return median_ms(step, "cuda"), gpu_ms(step), host_ms(step)


def report(label: str, times: tuple[float, float, float], provider: tuple[float, float], reference: list, grads: list,
           first: str) -> None:
    """One line: ``times`` beside the provider's wall and GPU time, and whether ``grads`` differ from ``first``'s."""
    (ms, gpu, host), (provider_ms, provider_gpu) = times, provider
    same = all(torch.equal(a, b) for a, b in zip(reference, grads))
    print(f"  {label}: {ms:.4f} ms wall ({provider_ms / ms:.2f}x provider), {gpu:.4f} ms GPU "
          f"({provider_gpu / gpu:.2f}x), {host:.4f} ms host{'' if same else f'  GRADIENTS DIFFER from {first}'}",
          flush=True)


def _gradients(fn, inputs: dict) -> list[torch.Tensor]:
    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    fn(**leaves).float().square().sum().backward()
    return [v.grad for v in leaves.values() if v.grad is not None]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--op", default="silu_linear", choices=("linear", "silu_linear"))
    parser.add_argument("--launcher", default="_OUTER",
                        choices=("_TILED", "_SKINNY", "_OUTER", "_DESCRIBED", "_FEW_ROWS_BACKWARD"))
    parser.add_argument("--tilings", required=True, help="comma-separated BLOCK_MxBLOCK_Nxwarpsxstages")
    args = parser.parse_args(argv)
    launcher = getattr(gemm, args.launcher)
    fn = H3Triton().kernel_ops()[args.op]
    for case in cases(RELEASE, "cuda"):
        if case.op != args.op:
            continue
        inputs = case.make()
        provider = _forward_backward(op_registry.provider_ops()[args.op], inputs, "random")
        provider_ms, provider_gpu = median_ms(provider, "cuda"), gpu_ms(provider)
        print(f"{case.label}: provider forward+backward {provider_ms:.4f} ms wall, {provider_gpu:.4f} ms GPU, "
              f"{host_ms(provider):.4f} ms host", flush=True)
        first = next(iter(launcher.tilings.values()))[0]  # a launcher's tilings share their fixed sizes
        reference = None
        for text in args.tilings.split(","):
            config = _tiling(text, first)
            try:
                with launcher.forcing(config):
                    grads = _gradients(fn, inputs)
                    times = timed(_forward_backward(fn, inputs, "random"))
            except (triton.runtime.errors.OutOfResources, RuntimeError) as error:
                print(f"  {text}: not launched ({type(error).__name__}: {str(error).splitlines()[0]})", flush=True)
                continue
            reference = reference or grads
            report(text, times, (provider_ms, provider_gpu), reference, grads, "the first tiling")


if __name__ == "__main__":
    main()
