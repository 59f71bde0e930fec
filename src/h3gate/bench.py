"""``h3gate bench``: the candidate's speed against the provider's, op by op, one block, one transformer step.

Everything is measured in one process on one device, so every number comes with its ratio to the provider
measured beside it and with the fraction of the card's own ceilings measured in the same run (a bf16 GEMM
and a device-to-device copy). Times are medians of ``triton.testing.do_bench`` on a GPU (CUDA events, warm-up,
repeats; the field's standard for Triton kernels) and of wall-clock repeats on the CPU, where the kernels run
under Triton's interpreter and the numbers only show that the command works.

Shapes: ``release`` is MiniMax-H3 at 124 frames 1344x768 (sequence 38,222; 56 heads x 128; hidden 5376; ffn
14336; bf16; random weights of the release config); ``small`` is the embedded benchmark preset.

Backward passes start from an output gradient (``output_grad``): ``random`` (seeded normal, the default) or
``ones``. A constant gradient is a degenerate operand that real backward passes never see: on an H200 the
provider's backward ran 7-19% faster from one than from a random gradient, the candidate's 5-7%
(``benchmarks/results/h200-perf/release-final{,-ones}.log``).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

import torch

from h3gate import op_registry

RELEASE = dict(seq=38222, heads=56, head_dim=128, hidden=5376, ffn=14336, time_embed=2688, rotary=96, table_rows=9)
SMALL = dict(seq=467, heads=4, head_dim=64, hidden=256, ffn=512, time_embed=128, rotary=48, table_rows=9)
SHAPES = {"release": RELEASE, "small": SMALL}
SDPA_VARIANTS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
OUTPUT_GRADS = ("random", "ones")


@dataclass
class Case:
    """One op at one shape: how to make its inputs, its FLOPs or bytes (forward, backward)."""

    op: str
    label: str
    make: callable
    work: tuple[float, float]
    unit: str  # "flop" or "byte"


def _randn(shape, device, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(shape, device=device, dtype=torch.float32) * scale).to(dtype)


def _linear_cases(s: dict, device: str) -> list[dict]:
    seq, hidden, ffn, inner = s["seq"], s["hidden"], s["ffn"], s["heads"] * s["head_dim"]
    return [
        dict(
            label=f"linear {label} {seq}x{k}->{n}",
            make=lambda k=k, n=n: {"x": _randn((1, seq, k), device), "weight": _randn((n, k), device, scale=k**-0.5)},
            work=(2.0 * seq * k * n, 4.0 * seq * k * n),
            unit="flop",
        )
        for label, k, n in (("to_q/k/v", hidden, inner), ("to_out", inner, hidden), ("ff up", hidden, 2 * ffn), ("ff down", ffn, hidden))
    ]


def _silu_linear_cases(s: dict, device: str) -> list[dict]:
    embed, modulation = s["time_embed"], 6 * s["hidden"] * 3
    return [dict(
        label=f"silu_linear adaln 3x{embed}->{modulation}",
        make=lambda: {
            "temb": torch.randn((3, embed), device=device),
            "weight": _randn((modulation, embed), device, scale=embed**-0.5),
            "bias": _randn((modulation,), device),
        },
        # memory-bound: the weight streams once forward; read again and its gradient written backward
        work=(2.0 * modulation * embed, 4.0 * modulation * embed),
        unit="byte",
    )]


def _modulation(s: dict, device: str, *tables: str) -> dict:
    """AdaLN inputs as the block sees them: each table a column slice of the (rows, 6 x hidden) projection, and
    the table row of every sequence row."""
    rows, hidden = s["table_rows"], s["hidden"]
    made = {name: _randn((rows, 6 * hidden), device, scale=0.3)[:, :hidden] for name in tables}
    return {**made, "idx": torch.randint(0, rows, (s["seq"],), device=device)}


def _rms_norm_modulate_cases(s: dict, device: str) -> list[dict]:
    seq, hidden = s["seq"], s["hidden"]
    act = 2.0 * seq * hidden
    return [dict(
        label=f"norm+modulation {seq}x{hidden}",
        make=lambda: {
            "x": _randn((1, seq, hidden), device),
            "weight": _randn((hidden,), device),
            "eps": 1e-5,
            **_modulation(s, device, "scale", "shift"),
        },
        work=(2 * act, 3 * act),
        unit="byte",
    )]


def _qk_norm_rope_cases(s: dict, device: str) -> list[dict]:
    seq, heads, dim = s["seq"], s["heads"], s["head_dim"]
    heads_act = 2.0 * seq * heads * dim
    angles = torch.rand((seq, s["rotary"]), device=device)
    return [dict(
        label=f"qk norm+rope {seq}x{heads}x{dim}",
        make=lambda: {
            "x": _randn((1, seq, heads, dim), device),
            "weight": _randn((dim,), device),
            "eps": 1e-5,
            "cos": angles.cos(),
            "sin": angles.sin(),
        },
        work=(2 * heads_act, 3 * heads_act),
        unit="byte",
    )]


def _attention_cases(s: dict, device: str) -> list[dict]:
    seq, heads, dim = s["seq"], s["heads"], s["head_dim"]
    flops = 4.0 * seq * seq * dim * heads
    return [dict(
        label=f"attention {seq}x{heads}x{dim}",
        make=lambda: {k: _randn((1, seq, heads, dim), device) for k in ("q", "k", "v")},
        work=(flops, 2.5 * flops),
        unit="flop",
    )]


def _swiglu_cases(s: dict, device: str) -> list[dict]:
    seq, ffn = s["seq"], s["ffn"]
    act = 2.0 * seq * ffn
    return [dict(
        label=f"swiglu {seq}x{2 * ffn}", make=lambda: {"h": _randn((1, seq, 2 * ffn), device)}, work=(3 * act, 5 * act), unit="byte"
    )]


def _gated_residual_cases(s: dict, device: str) -> list[dict]:
    seq, hidden = s["seq"], s["hidden"]
    act = 2.0 * seq * hidden
    return [dict(
        label=f"gated residual {seq}x{hidden}",
        make=lambda: {
            "residual": _randn((1, seq, hidden), device),
            "y": _randn((1, seq, hidden), device),
            **_modulation(s, device, "gate"),
        },
        work=(3 * act, 4 * act),
        unit="byte",
    )]


# The cases of each op at a shape, in registry order; checked against the registry as the module loads.
CASES = op_registry.keyed(
    {
        "linear": _linear_cases,
        "silu_linear": _silu_linear_cases,
        "rms_norm_modulate": _rms_norm_modulate_cases,
        "qk_norm_rope": _qk_norm_rope_cases,
        "attention": _attention_cases,
        "swiglu": _swiglu_cases,
        "gated_residual": _gated_residual_cases,
    },
    "the benchmark's cases",
)


def cases(s: dict, device: str) -> list[Case]:
    return [Case(op.name, **case) for op, op_cases in CASES for case in op_cases(s, device)]


# Timing -----------------------------------------------------------------------------------------------


def median_ms(fn, device: str, repeats: int = 5) -> float:
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def output_grad(out: torch.Tensor, kind: str) -> torch.Tensor:
    """The gradient a backward starts from, shaped like ``out``: ``random`` (normal, seed 0) or ``ones``."""
    if kind == "ones":
        return torch.ones_like(out)
    if kind == "random":
        generator = torch.Generator(device=out.device).manual_seed(0)
        return torch.randn(out.shape, generator=generator, device=out.device, dtype=torch.float32).to(out.dtype)
    raise ValueError(f"output gradient {kind!r} is not one of {OUTPUT_GRADS}")


def _forward_backward(fn, inputs: dict, grad_kind: str):
    leaves = {k: (v.detach().requires_grad_(True) if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in ("cos", "sin") else v) for k, v in inputs.items()}
    out = fn(**leaves)
    grad = output_grad(out, grad_kind)

    def step():
        for value in leaves.values():
            if isinstance(value, torch.Tensor):
                value.grad = None
        fn(**leaves).backward(grad)

    return step


def ceilings(device: str) -> dict:
    """The card's own ceilings, measured now: a bf16 GEMM's TFLOP/s and a device copy's GB/s (read + write)."""
    if not device.startswith("cuda"):
        return {}
    n = 8192
    a, b = _randn((n, n), device), _randn((n, n), device)
    gemm_ms = median_ms(lambda: a @ b, device)
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), device)
    return {"bf16_gemm_tflops": 2 * n**3 / gemm_ms / 1e9, "copy_gbps": 2 * src.numel() / copy_ms / 1e6}


@contextlib.contextmanager
def _sdpa(variant: str | None):
    if variant is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, SDPA_VARIANTS[variant])):
        yield


def _rate(work: float, ms: float, unit: str) -> float:
    return work / ms / (1e9 if unit == "flop" else 1e6)  # TFLOP/s or GB/s


def check_rounds(rounds: int) -> None:
    """No round would time nothing and report nothing: refused before anything is timed."""
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: every time is the median of at least one round; pass --rounds 1 or more")


def alternating(timers: dict, rounds: int) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(each timer's median, its time of every round): ``rounds`` rounds, each calling every timer (a function
    returning milliseconds) in turn.

    A ratio of two times taken one after the other reads the card's clock drift as a speed difference: an H100
    holds its 700 W limit by moving its clock, and one ``do_bench`` median of the same forward+backward moved between
    12.1 and 15.1 ms within a minute (``results/h100-perf/linear-products/alternating-fwd-bwd.log``). Taken in turns
    and by the median of rounds, the drift reaches candidate and provider alike; the rounds, kept in the report,
    show its size.
    """
    check_rounds(rounds)
    times = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            times[name].append(timer())
    return {name: statistics.median(values) for name, values in times.items()}, times


@contextlib.contextmanager
def _within(contexts):
    """Inside a fresh instance of each of ``contexts`` (functions making context managers)."""
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        yield


def _timer(fn, device: str, contexts=(), measure=None):
    """A function that times ``fn`` by ``measure(fn, device)`` (default :func:`median_ms`) :func:`_within`
    ``contexts``: a timer for :func:`alternating`."""
    def timer() -> float:
        with _within(contexts):
            return (measure or median_ms)(fn, device)

    return timer


def _in_turn(sides: dict, peak_key: str, device: str, rounds: int, measure=None) -> dict:
    """Each side's functions (``sides``: side -> (contexts, {key: fn})) timed :func:`_within` its contexts, every
    function of every side in turn over ``rounds`` (:func:`alternating`): ``{side}_{key}`` medians, every round
    under ``rounds``, and each side's ``{side}_peak_mib`` of its function ``peak_key``."""
    timers = {f"{side}_{key}": _timer(fn, device, contexts, measure)
              for side, (contexts, fns) in sides.items() for key, fn in fns.items()}
    result, rounds_ms = alternating(timers, rounds)
    for side, (contexts, fns) in sides.items():
        with _within(contexts):
            result[f"{side}_peak_mib"] = _peak_mib(fns[peak_key], device)
    return {**result, "rounds": rounds_ms}


def bench_ops(candidate, shape: str, device: str, ops=None, progress=print, grad_kind: str = "random",
              rounds: int = 3) -> list[dict]:
    """Per op: forward and forward+backward times of candidate and provider (:func:`alternating` over ``rounds``),
    ratios, rates, and the peak memory a forward+backward adds to what its inputs hold."""
    kernel_ops = candidate.kernel_ops()
    rows = []
    for case in cases(SHAPES[shape], device):
        if ops and case.op not in ops:
            continue
        progress(case.label)
        inputs = case.make()
        provider = op_registry.provider_ops()[case.op]
        variants = [None] + (list(SDPA_VARIANTS) if case.op == "attention" and device.startswith("cuda") else [])
        row = {"op": case.op, "label": case.label, "unit": "TFLOP/s" if case.unit == "flop" else "GB/s"}
        unit = case.unit
        work_fwd, work_bwd = case.work
        sides = {}
        for name, fn, variant in [("candidate", kernel_ops[case.op], None)] + [
                ("provider" if variant is None else f"provider_{variant}", provider, variant) for variant in variants]:
            sides[name] = ((lambda variant=variant: _sdpa(variant),),
                           {"fwd_ms": torch.no_grad()(lambda fn=fn: fn(**inputs)),
                            "fwd_bwd_ms": _forward_backward(fn, inputs, grad_kind)})
        row.update(_in_turn(sides, "fwd_bwd_ms", device, rounds))
        row["ratio_fwd"] = row["provider_fwd_ms"] / row["candidate_fwd_ms"]
        row["ratio_fwd_bwd"] = row["provider_fwd_bwd_ms"] / row["candidate_fwd_bwd_ms"]
        row["candidate_fwd_rate"] = _rate(work_fwd, row["candidate_fwd_ms"], unit)
        row["provider_fwd_rate"] = _rate(work_fwd, row["provider_fwd_ms"], unit)
        bwd_ms = row["candidate_fwd_bwd_ms"] - row["candidate_fwd_ms"]
        row["candidate_bwd_rate"] = _rate(work_bwd, bwd_ms, unit) if bwd_ms > 0 else None
        rows.append(row)
        del inputs, sides
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


# One block and one transformer step -------------------------------------------------------------------

# The release contract shape: 124 frames at 1344x768 (37 latent frames of 48x84), 512 text tokens, t2va.
RELEASE_CONTRACT = dict(text_tokens=512, latent_frames=37, latent_height=48, latent_width=84, audio_latents=207)


def random_transformer(shape: str, layers: int, device: str):
    """A transformer of ``shape`` with random weights at checkpoint precision, built directly on ``device``: at
    release, :func:`h3gate.model.factory.release_transformer` (61.7 GiB for the 50 blocks, drawn a parameter at a
    time: never in float32 whole, which took 123 GiB)."""
    from h3gate.model.factory import build_preset, release_transformer

    if shape == "small":
        transformer = build_preset("small").transformer
        del transformer.transformer_blocks[layers:]
        transformer.register_to_config(num_layers=layers)
        return transformer.to(device), dict(transformer.config)
    transformer = release_transformer(layers, 0, device)
    return transformer, dict(transformer.config)


def contract(shape: str):
    """The model contract whose packed sequence is the bench shape's (38,222 rows at release, 467 small)."""
    from h3gate.model.contract import ModelContract

    geometry = RELEASE_CONTRACT if shape == "release" else dict(text_tokens=15, latent_frames=37, latent_height=2, latent_width=2, audio_latents=207)
    return ModelContract(seed=0, keyframes=(), video_timestep=0.5, audio_timestep=0.7, **geometry)


def _contract_inputs(shape: str, config: dict, device: str):
    from h3gate.model.contract import model_inputs

    inputs, _ = model_inputs(contract(shape), config)
    return {k: v.to(device) for k, v in inputs.items()}


def _block_inputs(transformer, inputs: dict):
    """What block 0 receives at the contract input (captured by a pre-hook on one provider forward)."""
    captured = {}

    def grab(_module, args):
        captured["args"] = tuple(a.detach() if isinstance(a, torch.Tensor) else tuple(t.detach() for t in a) for a in args)
        raise _Captured

    handle = transformer.transformer_blocks[0].register_forward_pre_hook(grab)
    try:
        with torch.no_grad():
            transformer(**inputs)
    except _Captured:
        pass
    finally:
        handle.remove()
    return captured["args"]


class _Captured(Exception):
    pass


def _peak_mib(fn, device: str) -> float | None:
    """MiB that a warm call of ``fn`` allocates at its peak beyond what is allocated before it (CUDA only; None
    elsewhere). The call before it takes the one-time work: a candidate's first call of each op after it is installed
    is checked against the provider's (:mod:`h3gate.candidates.op_invariants`), which took a release block's
    forward+backward from 10.1 to 13.8 GiB on an H100."""
    if not device.startswith("cuda"):
        return None
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_block(candidate, shape: str, device: str, progress=print, grad_kind: str = "random", rounds: int = 3) -> dict:
    """Block 0 forward and forward+backward at the contract input: candidate, provider, provider with flash SDPA,
    in turn over ``rounds`` (:func:`alternating`)."""
    from diffusers.models.attention_dispatch import attention_backend

    transformer, config = random_transformer(shape, 1, device)
    hidden, temb, indices, rotary = _block_inputs(transformer, _contract_inputs(shape, config, device))
    block = transformer.transformer_blocks[0]

    def forward():
        with torch.no_grad():
            block(hidden, temb, indices, rotary)

    grad = output_grad(hidden, grad_kind)

    def forward_backward():
        leaf = hidden.detach().requires_grad_(True)
        block(leaf, temb, indices, rotary).backward(grad)

    contexts = {"provider": (), "provider_flash": (lambda: attention_backend("_native_flash"),),
                "candidate": (lambda: candidate.installed(transformer),)}
    progress(f"block: {', '.join(contexts)} in turn, {rounds} rounds")
    fns = {"fwd_ms": forward, "fwd_bwd_ms": forward_backward}
    sides = {side: (context, fns) for side, context in contexts.items()}
    result = {"seq": hidden.shape[1], **_in_turn(sides, "fwd_bwd_ms", device, rounds)}
    result["ratio_fwd"] = result["provider_fwd_ms"] / result["candidate_fwd_ms"]
    result["ratio_fwd_bwd"] = result["provider_fwd_bwd_ms"] / result["candidate_fwd_bwd_ms"]
    return result


def once_ms(fn, device: str) -> float:
    """One call of ``fn`` in milliseconds after a warm one (CUDA events on a GPU): for a call of seconds, where
    ``do_bench`` would take five calls to estimate it before the one it times."""
    fn()
    if not device.startswith("cuda"):
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench_step(candidate, shape: str, device: str, layers: int, progress=print, rounds: int = 3) -> dict:
    """One whole transformer forward (a denoising step) at the contract input: candidate against provider, in turn
    over ``rounds`` (:func:`alternating`), each timed by one call after a warm one (:func:`once_ms`)."""
    transformer, config = random_transformer(shape, layers, device)
    inputs = _contract_inputs(shape, config, device)

    def step():
        with torch.no_grad():
            transformer(**inputs)

    progress(f"step: provider, candidate in turn, {rounds} rounds")
    sides = {"provider": ((), {"ms": step}), "candidate": ((lambda: candidate.installed(transformer),), {"ms": step})}
    result = {"layers": layers, **_in_turn(sides, "ms", device, rounds, once_ms)}
    result["ratio"] = result["provider_ms"] / result["candidate_ms"]
    return result


def machine() -> dict:
    from h3gate.evidence import environment

    facts = environment.collect()
    return {k: facts[k] for k in ("python", "torch", "cuda", "driver", "triton", "diffusers", "gpus")}


# What the release transformer's call adds to its weights at its peak (the provider's 50-block call: 6,557 MiB,
# results/h200-release.json).
STEP_CALL_BYTES = 6557 * 2**20


def check_step(shape: str, device: str, layers: int | None) -> None:
    """A release step whose transformer cannot fit the GPU is refused before anything is timed, with the number of
    blocks that would: running out of memory after minutes of ops would waste them."""
    if shape != "release" or not layers or not device.startswith("cuda"):
        return
    from h3gate.model.factory import transformer_skeleton
    from h3gate.model.presets import RELEASE_CONFIG

    def weights(blocks: int) -> int:
        skeleton = transformer_skeleton({**RELEASE_CONFIG, "num_layers": blocks})
        return sum(param.numel() * param.element_size() for param in skeleton.parameters())

    one, two = weights(1), weights(2)
    need = one + (layers - 1) * (two - one) + STEP_CALL_BYTES
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        fit = (free - STEP_CALL_BYTES - one) // (two - one) + 1
        advice = f"pass --step-layers {fit} or fewer" if fit >= 1 else "use a GPU with more memory"
        raise ValueError(
            f"--step-layers {layers}: the release transformer's {layers} blocks and their call take "
            f"{need / 2**30:.1f} GiB, and {torch.cuda.get_device_name(device)} has {free / 2**30:.1f} GiB free; "
            f"{advice}"
        )


def check_ops(ops) -> None:
    """An unknown op is refused before anything is timed, never skipped: a report missing an op asked for would pass
    for a complete one."""
    known = [op.name for op, _ in CASES]
    unknown = [op for op in ops or () if op not in known]
    if unknown:
        raise ValueError(f"--ops: unknown ops {', '.join(unknown)}; choose among {', '.join(known)}")


def run(candidate, shape: str, device: str, ops=None, block=True, step_layers: int | None = None, progress=print,
        on_section=lambda report: None, grad_kind: str = "random", rounds: int = 3) -> dict:
    """Every section in turn; ``on_section`` sees the report after each, so a later failure loses nothing."""
    if grad_kind not in OUTPUT_GRADS:
        raise ValueError(f"output gradient {grad_kind!r} is not one of {OUTPUT_GRADS}")
    check_ops(ops)
    check_step(shape, device, step_layers)
    check_rounds(rounds)
    report = {"shape": shape, "device": device, "machine": machine(), "ceilings": ceilings(device),
              "candidate": candidate.identity(), "output_grad": grad_kind, "rounds": rounds}
    report["ops"] = bench_ops(candidate, shape, device, ops, progress, grad_kind, rounds)
    on_section(report)
    if block:
        report["block"] = bench_block(candidate, shape, device, progress, grad_kind, rounds)
        on_section(report)
    if step_layers:
        report["step"] = bench_step(candidate, shape, device, step_layers, progress, rounds)
        on_section(report)
    return report


def _mib(row: dict, who: str) -> str:
    """``who``'s peak memory in a row, or '-' where none was measured (CPU; reports from before it was)."""
    peak = row.get(f"{who}_peak_mib")
    return "-" if peak is None else f"{peak:.0f}"


def table(report: dict) -> str:
    """The readable form: one line per op, then the block and the step."""
    ceiling = report.get("ceilings", {})
    lines = [
        f"{'op':44s} {'cand fwd':>9s} {'prov fwd':>9s} {'x':>5s} {'cand f+b':>9s} {'prov f+b':>9s} {'x':>5s} {'rate':>9s} {'of peak':>7s}"
        f" {'f+b MiB cand/prov':>17s}"
    ]
    for row in report["ops"]:
        peak = ceiling.get("bf16_gemm_tflops" if row["unit"] == "TFLOP/s" else "copy_gbps")
        share = f"{row['candidate_fwd_rate'] / peak:7.0%}" if peak else "      -"
        lines.append(
            f"{row['label']:44s} {row['candidate_fwd_ms']:9.3f} {row['provider_fwd_ms']:9.3f} {row['ratio_fwd']:5.2f} "
            f"{row['candidate_fwd_bwd_ms']:9.3f} {row['provider_fwd_bwd_ms']:9.3f} {row['ratio_fwd_bwd']:5.2f} "
            f"{row['candidate_fwd_rate']:9.1f} {share} {_mib(row, 'candidate'):>8s}/{_mib(row, 'provider'):<8s}"
        )
        for variant in SDPA_VARIANTS:
            if f"provider_{variant}_fwd_ms" in row:
                lines.append(
                    f"{'  provider SDPA ' + variant:44s} {'':9s} {row[f'provider_{variant}_fwd_ms']:9.3f} "
                    f"{row[f'provider_{variant}_fwd_ms'] / row['candidate_fwd_ms']:5.2f} {'':9s} "
                    f"{row[f'provider_{variant}_fwd_bwd_ms']:9.3f} {row[f'provider_{variant}_fwd_bwd_ms'] / row['candidate_fwd_bwd_ms']:5.2f}"
                    f" {'':9s} {'':7s} {'':8s}/{_mib(row, f'provider_{variant}'):<8s}"
                )
    if "block" in report:
        b = report["block"]
        lines.append(
            f"block (seq {b['seq']}): fwd {b['candidate_fwd_ms']:.2f} vs {b['provider_fwd_ms']:.2f} ms (x{b['ratio_fwd']:.2f}), "
            f"fwd+bwd {b['candidate_fwd_bwd_ms']:.2f} vs {b['provider_fwd_bwd_ms']:.2f} ms (x{b['ratio_fwd_bwd']:.2f}); "
            f"peak MiB {_mib(b, 'candidate')} vs {_mib(b, 'provider')}"
        )
    if "step" in report:
        st = report["step"]
        lines.append(f"step ({st['layers']} blocks): {st['candidate_ms']:.1f} vs {st['provider_ms']:.1f} ms (x{st['ratio']:.2f}); "
                     f"peak MiB {_mib(st, 'candidate')} vs {_mib(st, 'provider')}")
    if ceiling:
        lines.append(f"ceilings: bf16 GEMM {ceiling['bf16_gemm_tflops']:.0f} TFLOP/s, copy {ceiling['copy_gbps']:.0f} GB/s")
    lines.append("x = provider time / candidate time (above 1: candidate faster); MiB: peak memory a forward+backward "
                 "adds (GPU only)")
    if "rounds" in report:
        rounds = report["rounds"]
        taken = f"medians of {rounds} rounds" if rounds > 1 else "one round"
        lines.append(f"times: {taken}, candidate and provider timed in turn in each (every round's time is in the JSON "
                     "report)")
    return "\n".join(line.rstrip() for line in lines)
