"""The ``kernel`` gate: every op of a candidate alone, forward and every gradient, over shapes hypothesis draws.

Rule, in the spirit of flash-attention's own tests: against a float64 torch reference computed from the same
(rounded) inputs, the candidate's error may be at most 2 x the error of torch's own op at the same precision (the
worst of its backends, :func:`torch_modes`) plus a noise floor of two ULP
at the reference's magnitude — checked both as relative L2 (the error everywhere) and as max abs (the
error of the worst element, which a bug confined to a few rows or one tile cannot hide from) - and, at half
precision, for the mean error signed along the reference, its bias, at most 2 x torch's plus a few of its own standard errors
(a scaling or truncation bug errs one way by less than an ULP, which no bound on the error's size sees). No fixed
atol: the floor scales with the reference. Also per op: two runs bitwise equal, and inputs carved out of
NaN-filled buffers (padding NaN must never reach an output or gradient). And the op's contract with its caller,
which no error measure sees: every output and gradient has the provider's dtype, shape and device and owns its
memory (shares no storage with an input), and the inputs are unchanged after the forward and the backward.

hypothesis draws the shapes (ragged sequence lengths, non-power-of-two widths, all head dims, random row
tables): it explores edges a hand-written list misses, shrinks a failure to its smallest shape, and
replays deterministically with ``derandomize=True`` so a failure in CI reproduces anywhere. Derandomized, it
meets the same few shapes every run, so every search also runs :func:`edge_examples`: partial last tiles of
every tile size in use, odd widths, batch 2, the last AdaLN table row, and on a GPU long reductions.
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass
from typing import Callable

import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis.errors import FlakyFailure
from hypothesis import strategies as st

from h3gate import numerics, op_calls, op_registry
from h3gate.candidates import launch_paths, op_invariants
from h3gate.compare import bias, max_abs, relative_l2
from h3gate.model.presets import RELEASE, TRANSFORMER_CONFIGS
from h3gate.verdict import Check, GateResult, Provenance, one_line, raised_under_determinism

GATE = "kernel"
ERROR_FACTOR = 2.0
FLOOR_ULPS = 2.0
# Standard errors of its own a candidate's bias may reach beyond torch's: rounding noise stays within a few.
BIAS_SIGMAS = 5.0
# The bias is gated at half precision, where every output is narrowed from a float32 accumulator: a truncating
# store or a bf16 accumulation errs one way by a large share of an ULP. A float32 output is its accumulator (no
# narrowing store to get wrong), and there a correct kernel's own summation order leaves a mean error that the
# grouped standard error does not cover (h3_triton's silu_linear three-row weight gradient at 1.05x the bound,
# attention's dk at two rows at 1.23x), so the check cannot tell the bug it exists for from correct arithmetic.
# The float32 items keep every other check, and the power gate requires each to reject a mutant of its op.
FLOAT32_EPS = torch.finfo(torch.float32).eps
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# Range tier: large diffusion transformers carry a few activation channels 1e3-1e4 x the median ("massive
# activations"); the ``outliers`` examples scale the first input's second and last channels by these.
OUTLIERS = (1e3, 1e4)
# The attention logit tier: an ``aligned`` example sends queries normalised to an RMS of sqrt(gain) against keys equal
# to them, logits of gain x sqrt(head_dim), the most the QK-norm weights allow (:func:`qk_logit_gain`): a checkpoint's
# from its weights; the embedded presets' QK-norm weights are drawn from 1.5 to 3, so 3 x 3, logits of 102 at head_dim
# 128, past float32's exp overflow at 88.7.
QK_NORM_GAIN = 9.0
INDEPENDENT = "independent"  # a ``layout`` where every input is a view of its own, with strides of its own


@dataclass(frozen=True)
class Limits:
    """Shape ranges: the full issue's ranges on a GPU, the same kinds of shapes smaller under the interpreter."""

    max_rows: int
    max_width: int
    max_heads: int
    # The largest tile a kernel of ours runs along a row or reduction axis; tiles are powers of two
    # (tests/kernels/test_tilings.py checks both against h3_triton's launchers).
    largest_tile: int
    long_reduction: int = 0  # a reduction length where accumulation errors show; 0: none (too slow to interpret)


GPU_LIMITS = Limits(max_rows=600, max_width=1000, max_heads=4, largest_tile=256, long_reduction=8193)
INTERPRETER_LIMITS = Limits(max_rows=600, max_width=200, max_heads=2, largest_tile=128)


@dataclass(frozen=True)
class OpSpec:
    """How to draw inputs for one op; its provider formula is the torch reference (low precision and float64)."""

    op: op_registry.Op
    dims: Callable[[Limits], st.SearchStrategy]
    build: Callable[[dict, torch.dtype, torch.Generator], dict]  # -> {"args": [...], "grads": [arg names]}
    from_call: Callable[[op_calls.Call], dict]  # the op's dims of a model's call (:mod:`h3gate.op_calls`)
    # Shapes every search runs first, whatever it draws: the MiniMax-H3 block's own layout at a ragged length.
    examples: tuple[dict, ...] = ()
    # Dims that :func:`edge_examples` sets to tile-edge lengths, and those it sets to a long reduction.
    edges: tuple[str, ...] = ()
    long: tuple[str, ...] = ()
    # The dims of a model's call the interpreter narrows, (dim, tile, thresholds) each (:func:`narrowed`); every
    # other dim of a model's call is kept whole on the CPU too.
    narrow: tuple[tuple[str, int, tuple[int, ...]], ...] = (("rows", 16, ()),)
    # Dims along which the op or one of its gradients reduces, each with the values of the other dims that keep an
    # example at the model's longest such length cheap on the CPU (:func:`long_examples`).
    reduces: tuple[tuple[str, dict], ...] = ()
    # The range tier's own examples beyond :func:`tier_examples`' (attention's logits past 88).
    tiers: tuple[dict, ...] = ()
    # The input :func:`tier_examples` puts a NaN or an infinity in (default: the first): where torch spreads it most.
    nonfinite_input: str = ""


def _normal(shape, generator, scale=1.0):
    return torch.randn(shape, generator=generator, dtype=torch.float64, device=generator.device) * scale


def _rows(limits: Limits):
    # Ragged lengths everywhere, with the tile edges (multiples of 16/32/64/128 and one past) drawn often.
    edges = st.sampled_from([1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 255, 257])
    return st.one_of(edges, st.integers(1, limits.max_rows)).filter(lambda s: s <= limits.max_rows)


def edge_lengths(limit: int, largest_tile: int) -> tuple[int, ...]:
    """Lengths leaving a last tile of one row, of three rows and of all but one row, for every tile size in use.

    Tiles are powers of two, so one tile ``P`` (the largest in use that fits ``2P - 1`` in ``limit``) serves all
    smaller ones too: ``P + e`` leaves ``e`` (mod ``T``) rows for every tile ``T <= P``."""
    tile = min(largest_tile, 1 << ((limit + 1) // 2).bit_length() - 1)
    return tile + 1, tile + 3, 2 * tile - 1


def edge_examples(spec: "OpSpec", limits: Limits) -> list[dict]:
    """The op's first example with its ``edges`` dims at each of :func:`edge_lengths` (not powers of two), batch 2,
    one head and the last row alone on the last AdaLN table row; with a ``long_reduction`` also its ``long`` dims
    at that length."""
    first = spec.examples[0]
    # One head: the block layout example runs several; the edges are about lengths, batch and table rows.
    batch = {k: v for k, v in (("batch", 2), ("heads", 1)) if k in first}
    base = {**first, **batch, **({"last_row_alone": True} if "table_rows" in first else {})}
    lengths = {k: edge_lengths(limits.max_rows if k == "rows" else limits.max_width, limits.largest_tile) for k in spec.edges}
    out = [{**base, **{k: lengths[k][i] for k in spec.edges}} for i in range(3)]
    long = [{**base, **dict.fromkeys(spec.long, limits.long_reduction)}] if limits.long_reduction and spec.long else []
    return out + long


def narrowed(length: int, tile: int, past: tuple[int, ...] = ()) -> int:
    """``length`` as the interpreter runs it: the shortest length past ``tile`` and past every threshold of ``past``
    that ``length`` passes, with ``length``'s residue modulo ``tile`` (the same partial last tile and alignment);
    lengths up to two tiles stay whole."""
    if length <= 2 * tile:
        return length
    floor = max([tile] + [t for t in past if t < length])
    return floor + 1 + (length - floor - 1) % tile


FEW = 24  # the short dims of a long-reduction example: past a 16-row skinny tile, rows of 48 bytes (16-byte aligned)


NONFINITE = {"nan": float("nan"), "inf": float("inf")}
NONFINITE_ROWS = 33  # past a 32-row tile: the row holding the NaN among others of its tile and program


def tier_examples(spec: "OpSpec", logit_gain: float = QK_NORM_GAIN) -> list[dict]:
    """The op's first example with every input a view of its own strides (q, k and v as a caller outside the model
    passes them), with outlier activations (but attention, whose range is its logits), ``spec.tiers`` (an ``aligned``
    one at ``logit_gain``), and with a NaN, then an infinity, in one element of ``spec.nonfinite_input``
    (:func:`_propagation_checks`)."""
    first = spec.examples[0]
    outliers = [] if spec.op.name == "attention" else [{**first, "outliers": True}]
    tiers = [{**tier, "aligned": logit_gain} if "aligned" in tier else tier for tier in spec.tiers]
    few = {"rows": NONFINITE_ROWS} if "rows" in first else {}
    nonfinite = [{**first, **few, "nonfinite": kind} for kind in NONFINITE]
    return [{**first, "layout": INDEPENDENT}, *outliers, *tiers, *nonfinite]


def qk_logit_gain(transformer) -> float:
    """The largest attention logit a transformer's QK-norm weights allow, over sqrt(head_dim): the largest
    ``max|w_q| x max|w_k|`` of its attention modules.

    After the RMSNorm a head's query ``q^ = x / sqrt(m + eps)`` (``m`` the mean square of x over the head_dim ``d``
    channels) has ``|q^|^2 = d m / (m + eps) < d``; times the weight, ``|q| <= max|w_q| |q^| < sqrt(d) max|w_q|``; RoPE
    rotates pairs of channels, which keeps the norm. So ``|q . k| <= |q| |k| < d max|w_q| max|w_k|`` and the scaled
    logit ``q . k / sqrt(d) < sqrt(d) max|w_q| max|w_k|``, approached by a query and a key that put their weight on the
    channels of the largest weights, aligned (rounding q and k to bfloat16 adds at most a factor (1 + 2^-8)^2)."""
    attentions = [module for module in transformer.modules()
                  if getattr(getattr(module, "norm_q", None), "weight", None) is not None]
    gains = [m.norm_q.weight.detach().abs().max().item() * m.norm_k.weight.detach().abs().max().item()
             for m in attentions]
    if not gains:
        raise ValueError("the transformer has no attention module with QK-norm weights (norm_q, norm_k)")
    return max(gains)


def logit_gain(model_name: str, load) -> tuple[float, str]:
    """The logit tier's gain for a model (:func:`qk_logit_gain`) and where it comes from: a checkpoint's own QK-norm
    weights (``load()`` gives the model), or, for the embedded and release presets, the largest their init draws."""
    if model_name in TRANSFORMER_CONFIGS or re.fullmatch(rf"{RELEASE}(-layers\d+)?", model_name):
        return QK_NORM_GAIN, "the presets' QK-norm weights, drawn from 1.5 to 3"
    return qk_logit_gain(load().transformer), "the checkpoint's QK-norm weights"


def long_examples(spec: "OpSpec", calls, dtype_name: str) -> list[dict]:
    """For every dim of ``spec.reduces``, the model call reaching the longest length there, at that length and with
    the other dims short: the release model's weight gradients sum 38,733 rows, its AdaLN input gradient 96,768
    products, where accumulation errors show that no short reduction reveals."""
    shaped = [spec.from_call(c) for c in calls
              if c.op == spec.op.name and c.mode == op_calls.AUTOGRAD and _call_dtype(c) == dtype_name]
    out = []
    for dim, short in spec.reduces if shaped else ():
        longest = max(shaped, key=lambda d: d[dim])
        out.append({**longest, **short, "mode": op_calls.AUTOGRAD})
    return out


def _call_dtype(call: op_calls.Call) -> str:
    """The precision a call computes at: its weight's where it has one (silu_linear's temb is float32), else its
    first input's."""
    args = dict(call.args)
    return (args.get("weight") or call.args[0][1]).dtype


# Dims that select no code path: the free row count the interpreter shrinks (its partial last tile is the edge
# examples' business) and the inputs' magnitudes. (The AdaLN table's rows do: the kernels' deterministic sums over
# table rows run as many programs, in blocks of the next power of two.)
FREE = ("rows", "magnitude", "peak")


def path_class(dims: dict) -> tuple:
    """The code paths an example selects: its dims but the :data:`FREE` ones, with autograd where it names no mode."""
    return tuple(sorted((k, v) for k, v in {"mode": op_calls.AUTOGRAD, **dims}.items() if k not in FREE))


def _call_dims(spec: "OpSpec", call: op_calls.Call, narrow: bool) -> dict:
    """The dims of ``spec``'s example of a model's call: its shapes as the op's dims, its grad mode and, where the call
    differs from the op's default there, the inputs that need gradients; ``narrow`` narrows the dims of
    ``spec.narrow``."""
    dims = {**spec.from_call(call), "mode": call.mode}
    if narrow:
        dims.update({name: narrowed(dims[name], tile, past) for name, tile, past in spec.narrow})
    needs = [name for name, arg in call.args if arg is not None and arg.grad]
    if call.mode == op_calls.AUTOGRAD and needs != spec.build(dims, torch.float32, torch.Generator())["grads"]:
        dims["grads"] = tuple(needs)
    return dims


def _narrowing(calls, narrow: bool, shrunk) -> list[tuple[op_calls.Call, bool]]:
    """Each of ``calls`` with ``narrow``, then each of ``shrunk`` narrowed."""
    return [(call, narrow) for call in calls] + [(call, True) for call in shrunk]


def model_examples(spec: "OpSpec", calls, dtype_name: str, narrow: bool, shrunk=()) -> list[dict]:
    """One example per path class (:func:`path_class`) of ``spec``'s op's calls at ``dtype_name`` among a model's
    ``calls`` and ``shrunk`` calls that ``spec``'s own examples do not run, with its grad mode and, where the call
    differs from the op's default there, the inputs that need gradients; ``narrow`` (the interpreter) narrows the dims
    of ``spec.narrow`` of ``calls``, and those of ``shrunk`` are narrowed on every device (the release model's on a
    GPU, at the row counts a GPU run of a small model can afford).
    The first call without autograd is also made under ``torch.inference_mode()``, as callers outside the pipeline
    make it. A path class runs once: the tiny and the release model share most, and every repeat of a 56-head or
    5,376-wide example cost seconds under the interpreter."""
    out = [_call_dims(spec, call, narrow_it) for call, narrow_it in _narrowing(calls, narrow, shrunk)
           if call.op == spec.op.name and _call_dtype(call) == dtype_name]
    out += [{**d, "mode": op_calls.INFERENCE} for d in out if d["mode"] == op_calls.NO_GRAD][:1]
    seen, kept = {path_class(d) for d in spec.examples}, []
    for dims in out:
        if path_class(dims) not in seen:
            seen.add(path_class(dims))
            kept.append(dims)
    return kept


def _table_rows(d, g):
    """Per packed row, its AdaLN table row; with ``last_row_alone`` the last row is the only one on the last table row."""
    top = d["table_rows"] - 1 if d.get("last_row_alone") and d["table_rows"] > 1 else d["table_rows"]
    idx = torch.randint(0, top, (d["rows"],), generator=g, device=g.device)
    if top < d["table_rows"]:
        idx[-1] = top
    return idx


def _width(limits: Limits, multiple: int = 1, least: int = 1):
    return st.integers(least, max(least, limits.max_width // multiple)).map(lambda w: w * multiple)


# Op specs ---------------------------------------------------------------------------------------------


def _linear_dims(limits):
    return st.fixed_dictionaries(
        {"rows": _rows(limits), "k": _width(limits), "n": _width(limits), "bias": st.booleans(), "batched": st.booleans()}
    )


def _linear_build(d, dtype, g):
    shape = (1, d["rows"], d["k"]) if d["batched"] else (d["rows"], d["k"])
    args = {
        "x": _normal(shape, g),
        "weight": _normal((d["n"], d["k"]), g, d["k"] ** -0.5),
        "bias": _normal((d["n"],), g, 0.1) if d["bias"] else None,
    }
    return {"args": args, "grads": [n for n in ("x", "weight", "bias") if args[n] is not None], "dtypes": {}}


def _silu_linear_dims(limits):
    return st.fixed_dictionaries({"t": st.integers(1, 3), "e": _width(limits), "n": _width(limits, 6)})


def _silu_linear_build(d, dtype, g):
    args = {
        "temb": _normal((d["t"], d["e"]), g, 2.0),
        "weight": _normal((d["n"], d["e"]), g, d["e"] ** -0.5),
        "bias": _normal((d["n"],), g, 0.1),
    }
    # temb stays float32 at checkpoint precision: it comes from the fp32 time embedder.
    return {"args": args, "grads": ["temb", "weight", "bias"], "dtypes": {"temb": torch.float32}}


def _table_dims(limits):
    # At least 8 channels: below that an RMSNorm's input gradient is pure rounding noise (its exact value
    # nearly vanishes), for torch and any kernel alike, and no real model is that narrow.
    return st.fixed_dictionaries(
        {
            "rows": _rows(limits),
            "c": _width(limits, least=8),
            "magnitude": st.sampled_from([1e-3, 1.0, 3.0]),
            "table_rows": st.integers(1, 9),
            "batch": st.integers(1, 2),
            "modulated": st.booleans(),
        }
    )


def _table(d, g, scale):
    # An (R, C) column slice of an (R, 6C) projection, as the AdaLN chunks are.
    full = _normal((d["table_rows"], 6 * d["c"]), g, scale)
    return full[:, d["c"] : 2 * d["c"]]


def _rms_build(d, dtype, g):
    # Row magnitudes from 1e-3 up: at 1e-3 the mean square (1e-6) is below eps, so eps visibly matters.
    args = {
        "x": _normal((d["batch"], d["rows"], d["c"]), g, d["magnitude"]),
        "weight": 1.0 + _normal((d["c"],), g, 0.25),
        "eps": 1e-5,
        "scale": _table(d, g, 0.5) if d["modulated"] else None,
        "shift": _table(d, g, 0.5) if d["modulated"] else None,
        "idx": _table_rows(d, g) if d["modulated"] else None,
    }
    grads = ["x", "weight"] + (["scale", "shift"] if d["modulated"] else [])
    return {"args": args, "grads": grads, "dtypes": {}}


def _rope_dims(limits):
    return st.fixed_dictionaries(
        {
            "rows": _rows(limits),
            "heads": st.integers(1, limits.max_heads),
            "head_dim": st.sampled_from([32, 64, 128]),
            "freq": st.integers(1, 5),
            "rope": st.sampled_from([True, True, False]),  # the refiner's norm-only case is the rarer one
            "batch": st.integers(1, 2),
            "magnitude": st.sampled_from([1e-3, 1.0, 2.0]),
        }
    )


def _rope_build(d, dtype, g):
    rotary = min(6 * d["freq"], d["head_dim"])
    positions = torch.rand((d["rows"], 1), generator=g, dtype=torch.float64, device=g.device) * 64
    angles = positions * torch.linspace(0.01, 1.0, rotary // 2, dtype=torch.float64, device=g.device)
    angles = torch.cat([angles, angles], dim=-1)
    args = {
        "x": _normal((d["batch"], d["rows"], d["heads"], d["head_dim"]), g, d["magnitude"]),
        "weight": 1.5 + 1.5 * torch.rand((d["head_dim"],), generator=g, dtype=torch.float64, device=g.device),
        "eps": 1e-5,
        "cos": angles.cos() if d["rope"] else None,
        "sin": angles.sin() if d["rope"] else None,
    }
    # cos/sin are float32 in diffusers whatever the model's dtype (the rope module is kept in fp32).
    return {"args": args, "grads": ["x", "weight"], "dtypes": {"cos": torch.float32, "sin": torch.float32}}


def _attention_dims(limits):
    return st.fixed_dictionaries(
        {
            "rows": _rows(limits),
            "heads": st.integers(1, limits.max_heads),
            "head_dim": st.sampled_from([32, 64, 128]),
            "batch": st.integers(1, 2),
            "peak": st.sampled_from([1.0, 2.0, 4.0]),
        }
    )


def _attention_build(d, dtype, g):
    shape = (d["batch"], d["rows"], d["heads"], d["head_dim"])
    # Peaky attention (as after the trained model's Q/K norms), so that a dropped or misweighted key shows.
    args = {"q": _normal(shape, g, d["peak"]), "k": _normal(shape, g, d["peak"]), "v": _normal(shape, g)}
    if d.get("aligned"):
        q = args["q"]
        args["q"] = d["aligned"] ** 0.5 * q / q.pow(2).mean(-1, keepdim=True).sqrt()
        args["k"] = args["q"].clone()
    return {"args": args, "grads": ["q", "k", "v"], "dtypes": {}}


def _swiglu_dims(limits):
    return st.fixed_dictionaries({"rows": _rows(limits), "f": _width(limits), "batch": st.integers(1, 2)})


def _swiglu_build(d, dtype, g):
    return {"args": {"h": _normal((d["batch"], d["rows"], 2 * d["f"]), g, 2.0)}, "grads": ["h"], "dtypes": {}}


def _residual_build(d, dtype, g):
    shape = (d["batch"], d["rows"], d["c"])
    args = {
        "residual": _normal(shape, g, 2.0),
        "y": _normal(shape, g),
        "gate": _table(d, g, 1.0) if d["modulated"] else None,
        "idx": _table_rows(d, g) if d["modulated"] else None,
    }
    return {"args": args, "grads": ["residual", "y"] + (["gate"] if d["modulated"] else []), "dtypes": {}}


# A model's calls as the ops' dims ------------------------------------------------------------------------


def _batch_rows(arg: op_calls.Arg) -> dict:
    return {"batch": arg.shape[0], "rows": arg.shape[1]}


def _table_of(call: op_calls.Call, name: str) -> dict:
    table = call.arg(name)
    return {"table_rows": table.shape[0] if table else 1, "modulated": table is not None}


def _linear_call(call):
    x, weight = call.arg("x"), call.arg("weight")
    rows = 1
    for size in x.shape[:-1]:
        rows *= size
    return {"rows": rows, "k": weight.shape[1], "n": weight.shape[0], "bias": call.arg("bias") is not None,
            "batched": len(x.shape) == 3}


def _silu_linear_call(call):
    temb, weight = call.arg("temb"), call.arg("weight")
    return {"t": temb.shape[0], "e": weight.shape[1], "n": weight.shape[0]}


def _rms_call(call):
    x = call.arg("x")
    return {**_batch_rows(x), "c": x.shape[-1], "magnitude": 1.0, **_table_of(call, "scale")}


def _rope_call(call):
    x, cos = call.arg("x"), call.arg("cos")
    return {**_batch_rows(x), "heads": x.shape[2], "head_dim": x.shape[3], "freq": cos.shape[1] // 6 if cos else 1,
            "rope": cos is not None, "magnitude": 1.0}


def _attention_call(call):
    q = call.arg("q")
    return {**_batch_rows(q), "heads": q.shape[2], "head_dim": q.shape[3], "peak": 2.0}


def _swiglu_call(call):
    h = call.arg("h")
    return {**_batch_rows(h), "f": h.shape[-1] // 2}


def _residual_call(call):
    x = call.arg("residual")
    return {**_batch_rows(x), "c": x.shape[-1], "magnitude": 1.0, **_table_of(call, "gate")}


_DRAWS = {
    "linear": dict(
        dims=_linear_dims, build=_linear_build,
        # and a deep reduction, where an accumulator that rounds between K steps drifts visibly
        examples=({"rows": 467, "k": 192, "n": 96, "bias": False, "batched": True},
                  {"rows": 33, "k": 2048, "n": 48, "bias": True, "batched": False}),
        edges=("rows", "k", "n"), long=("rows", "k"),  # the weight gradient reduces over the rows
        reduces=(("rows", {"k": FEW, "n": FEW}), ("k", {"rows": FEW, "n": FEW}), ("n", {"rows": FEW, "k": FEW})),
        # K and N select no path of their own past 64 (the K step) but through their residue (partial tiles, 16-byte
        # rows) and, for a product of at most 16 rows, past two chunks of 4,096 (split K: the forward's K, the input
        # gradient's N); the long-reduction examples keep the model's lengths.
        from_call=_linear_call, narrow=(("rows", 16, ()), ("k", 64, (8192,)), ("n", 64, (8192,))),
    ),
    # The input gradient reduces over N: past two chunks of 4,096 it is split K, so N stays past 8,192.
    "silu_linear": dict(dims=_silu_linear_dims, build=_silu_linear_build, examples=({"t": 3, "e": 32, "n": 1152},),
                        edges=("e",), long=("e",), from_call=_silu_linear_call,
                        reduces=(("n", {"e": FEW}), ("e", {"n": FEW})),
                        narrow=(("e", 64, ()), ("n", 64, (8192,)))),
    "rms_norm_modulate": dict(
        dims=_table_dims, build=_rms_build,
        examples=({"rows": 467, "c": 64, "table_rows": 6, "batch": 1, "modulated": True, "magnitude": 3.0},),
        edges=("rows", "c"), from_call=_rms_call, reduces=(("rows", {"c": FEW}),),
    ),
    "qk_norm_rope": dict(
        dims=_rope_dims, build=_rope_build,
        examples=({"rows": 467, "heads": 2, "head_dim": 32, "freq": 4, "rope": True, "batch": 1, "magnitude": 2.0},),
        edges=("rows",), from_call=_rope_call,  # heads x head_dim is its tile: kept whole
        # The weight gradient sums rows x heads; the model's rows alone (56 heads would hold 17 M elements).
        reduces=(("rows", {"heads": 1, "head_dim": 8, "freq": 1}),),
    ),
    # The second example is the release head_dim, at which h3_triton's Hopper forward runs: two batches, a
    # partial last key tile and a last query block whose second half is past the sequence.
    "attention": dict(
        dims=_attention_dims, build=_attention_build,
        examples=({"rows": 467, "heads": 2, "head_dim": 32, "batch": 1, "peak": 2.0},
                  {"rows": 300, "heads": 3, "head_dim": 128, "batch": 2, "peak": 2.0}),
        edges=("rows",), long=("rows",), nonfinite_input="k",  # a key's NaN reaches every query
        # Each (batch, head) is a program of its own: past two heads, more select nothing and only cost time. Its
        # reductions over the model's 38,733 keys and queries cost S x S: none runs on the CPU.
        from_call=_attention_call, narrow=(("rows", 16, ()), ("heads", 2, (2,))),
        tiers=({"rows": 33, "heads": 3, "head_dim": 128, "batch": 1, "peak": 1.0, "aligned": QK_NORM_GAIN},),
    ),
    "swiglu": dict(dims=_swiglu_dims, build=_swiglu_build, examples=({"rows": 467, "f": 128, "batch": 1},),
                   edges=("rows", "f"), from_call=_swiglu_call),
    "gated_residual": dict(
        dims=_table_dims, build=_residual_build,
        examples=({"rows": 467, "c": 64, "table_rows": 6, "batch": 1, "modulated": True, "magnitude": 1.0},),
        edges=("rows", "c"), from_call=_residual_call, reduces=(("rows", {"c": FEW}),),
    ),
}
OP_SPECS = {op.name: OpSpec(op, **draws) for op, draws in op_registry.keyed(_DRAWS, "the kernel gate's input draws")}
OPS = tuple(OP_SPECS)


# Evaluation -------------------------------------------------------------------------------------------


def _carve(tensor: torch.Tensor, device, extra: int = 0) -> torch.Tensor:
    """``tensor`` as a strided view into a larger NaN-filled buffer: ``1 + extra`` extra slots on every axis but the
    last, 16 bytes more on the last, so rows whose length is a multiple of 16 bytes stay 16-byte aligned (the layout
    kernels reading through tensor descriptors require) and the others do not."""
    pads = [1 + extra] * (tensor.dim() - 1) + [max(1, 16 // tensor.element_size()) * (1 + extra)] if tensor.dim() else []
    buffer = torch.full([s + p for s, p in zip(tensor.shape, pads)], float("nan"), dtype=tensor.dtype, device=device)
    view = buffer[tuple(slice(0, s) for s in tensor.shape)]
    view.copy_(tensor)
    return view


def _prepared(built: dict, dtype: torch.dtype, device, poison: bool, reference: bool = False) -> dict:
    """The op's arguments at the run's precision; for the reference, the same rounded values held in float64."""
    out = {}
    independent = built.get("layout") == INDEPENDENT
    for index, (name, value) in enumerate(built["args"].items()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            value = value.to(built["dtypes"].get(name, dtype))
            value = value.double() if reference else value
            value = _carve(value, device, index if independent else 0) if poison else value.to(device)
            value = value.detach().requires_grad_(name in built["grads"])
        elif isinstance(value, torch.Tensor):
            value = value.to(device)
        out[name] = value
    return out


@dataclass
class _Run:
    """One forward and backward: its outputs and gradients (detached, on the run's device), the tensors it was
    given and which of them it changed in place (name -> the pass that did)."""

    results: dict[str, torch.Tensor]
    inputs: dict[str, torch.Tensor]
    changed: dict[str, str]


_MODE_CONTEXTS = {op_calls.NO_GRAD: torch.no_grad, op_calls.INFERENCE: torch.inference_mode}


def _forward_backward(fn, built, dtype, device, upstream_seed, poison=False, reference=False) -> _Run:
    """A forward and, with autograd, its backward; without (the built example's ``mode``), the forward alone under
    the mode's context."""
    mode = built["mode"]
    args = _prepared(built, dtype, device, poison, reference)
    inputs = {name: value for name, value in args.items() if isinstance(value, torch.Tensor)}
    before = {name: value.detach().clone() for name, value in inputs.items()}
    changed: dict[str, str] = {}

    def note_changes(phase: str) -> None:
        changed.update({name: phase for name, value in inputs.items()
                        if name not in changed and not _same(value.detach(), before[name])})

    with _MODE_CONTEXTS.get(mode, contextlib.nullcontext)():
        out = fn(**args)
    if out is NotImplemented:
        raise Declined()
    note_changes("forward")
    if mode != op_calls.AUTOGRAD:
        return _Run({"out": out.detach()}, inputs, changed)
    (out.double() * _upstream(tuple(out.shape), upstream_seed, dtype, str(device))).sum().backward()
    note_changes("backward")
    results = {"out": out.detach()}
    for name in built["grads"]:
        grad = args[name].grad
        results[f"grad_{name}"] = grad if grad is not None else torch.zeros_like(args[name])
    return _Run({k: v.detach() for k, v in results.items()}, inputs, changed)


@functools.lru_cache(maxsize=4)
def _upstream(shape: tuple, seed: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The upstream gradient of an example, drawn once for all its runs and on their device (a draw of a long example's
    gradient in float64 on the host took longer than the runs themselves). Drawn at the run's precision too, so every
    run back-propagates the same values."""
    upstream = torch.randn(shape, generator=torch.Generator(device).manual_seed(seed), dtype=torch.float64, device=device)
    return upstream.to(dtype).double()


def torch_modes(device: str, dtype_name: str) -> list[numerics.Mode]:
    """torch's own ways to compute an op at ``dtype_name``: the provider and every variant that changes ops through
    a process switch (attention backend, BLAS library, threads) and takes the dtype and every drawn shape. Their
    worst error is "torch's error" of the rule. Anchored on the default backends alone, the rule rejected two of
    torch's own on an H200, in max abs at float32 reductions of 8,193: math SDPA's key gradient (8.7e-5 against a
    bound of 5.3e-5) and cuBLASLt's GEMM (1.7e-5 against 1.4e-5). (``compiled`` compiles a model, not an op.)"""
    return [numerics.PROVIDER] + [mode for mode in numerics.variants(device)
                                  if mode.sets_switches and mode.takes(dtype_name) and mode.every_shape]


def _verdict(where: str, kind: str, problem: str | None, key: dict) -> Check:
    """A check that fails for a reason (``problem``) or passes where there is none."""
    return Check.failed(where, kind, problem, **key) if problem else Check(where, kind, 0.0, 0.0, True, key)


def _contract_checks(label: str, dtype_name: str, candidate: _Run, provider: _Run) -> list[Check]:
    """The op's contract with its caller, which no error measure sees: its inputs unchanged (``inputs_unchanged``)
    and every output and gradient as the provider's (``output_contract``)."""
    changed = [f"{name} (shape {tuple(candidate.inputs[name].shape)}) by the {phase}" for name, phase in candidate.changed.items()]
    checks = [_verdict(f"{label}.inputs", "inputs_unchanged", f"changed in place: {', '.join(changed)}" if changed else None,
                       {"output": "inputs", "dtype": dtype_name})]
    for name, got in candidate.results.items():
        breach = op_invariants.breach(got, provider.results[name], candidate.inputs)
        checks.append(_verdict(f"{label}.{name}", "output_contract", breach, {"output": name, "dtype": dtype_name}))
    return checks


def _built(spec: OpSpec, dims: dict, dtype: torch.dtype, device: str, seed: int) -> dict:
    """The op's inputs for ``dims``, drawn on the run's device (a long example's float64 draws took a worker's share
    of a GPU node's cores longer than its runs), with the grad mode it is called in and, where ``dims`` names them (a
    model's call), only the inputs that need gradients there."""
    built = spec.build(dims, dtype, torch.Generator(device).manual_seed(seed))
    mode = dims.get("mode", op_calls.AUTOGRAD)
    grads = [] if mode != op_calls.AUTOGRAD else [g for g in built["grads"] if g in dims.get("grads", built["grads"])]
    if dims.get("outliers"):
        first = next(iter(built["args"].values()))
        first[..., 1] *= OUTLIERS[0]
        first[..., -1] *= OUTLIERS[1]
    if dims.get("nonfinite"):
        target = built["args"][spec.nonfinite_input or next(iter(built["args"]))]
        target[tuple(min(1, n - 1) for n in target.shape)] = NONFINITE[dims["nonfinite"]]
    return {**built, "mode": mode, "grads": grads, "layout": dims.get("layout"), "nonfinite": dims.get("nonfinite")}


def _fresh_checks(label: str, dtype_name: str, first: _Run, again: _Run) -> list[Check]:
    """Every output and gradient of a second call in memory of its own (``output_fresh``): a kernel handing back one
    buffer on every call overwrites the result its caller kept from the call before."""
    checks = []
    for name, got in again.results.items():
        shared = [earlier for earlier, kept in first.results.items() if op_invariants.shares_storage(got, kept)]
        problem = f"shares storage with the previous call's {', '.join(shared)}" if shared else None
        checks.append(_verdict(f"{label}.{name}", "output_fresh", problem, {"output": name, "dtype": dtype_name}))
    return checks


@dataclass
class _TorchSide:
    """What every candidate's check of one example compares with: the inputs, the float64 reference, torch's own run
    at the precision (for the op contract) and, per output, torch's worst errors and the reference's peak."""

    built: dict
    reference: dict[str, torch.Tensor]
    torch_low: _Run
    scale: float  # the largest magnitude among all reference outputs: the op's natural scale
    errors: dict[str, dict[str, float]]  # output -> relative_l2, max_abs, bias (half precision) of torch's worst, peak
    # With a NaN or infinity among the inputs, instead of errors: output -> (finite in every torch run, in none).
    agreed: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None


_SHARED: dict | None = None  # (op, dims, dtype, device, seed) -> _TorchSide while :func:`shared_torch_side` holds


@contextlib.contextmanager
def shared_torch_side():
    """Within the body, each example's torch side is computed once for every candidate checked on it (the power gate
    checks dozens of subjects on the same derandomized examples): the same inputs, seeds and modes give the same
    values, so reusing them proves exactly what recomputing them did."""
    global _SHARED
    outer, _SHARED = _SHARED, {} if _SHARED is None else _SHARED
    try:
        yield
    finally:
        _SHARED = outer


def _torch_side(spec: OpSpec, dims: dict, dtype: torch.dtype, device: str, seed: int) -> _TorchSide:
    key = (spec.op.name, repr(sorted(dims.items())), dtype, str(device), seed)  # a model call's dims hold tuples and lists
    if _SHARED is not None and key in _SHARED:
        return _SHARED[key]
    built = _built(spec, dims, dtype, device, seed)
    dtype_name = str(dtype).removeprefix("torch.")
    # float64 arithmetic on the very inputs the low-precision runs get (rounded to their dtypes), as
    # flash-attention's tests do: the errors then measure the ops' arithmetic, not the rounding of the inputs
    # every run shares. Computed on the run's device: a GPU does float64 at tens of TFLOP/s, where the host's cores
    # are shared by every worker of the node. Torch's own ops run deterministically, as the candidate's two runs do.
    with numerics.deterministic():
        reference = _forward_backward(spec.op.provider, built, dtype, device, seed, reference=True).results
        torch_runs = {}
        for mode in torch_modes(device, dtype_name):
            with numerics.activate(mode):
                torch_runs[mode.name] = _forward_backward(spec.op.provider, built, dtype, device, seed)
    torch_low = torch_runs[numerics.PROVIDER.name]
    runs = [run.results for run in torch_runs.values()]
    if built["nonfinite"]:
        side = _TorchSide(built, reference, torch_low, 0.0, {}, _agreed_finiteness([reference, *runs]))
    else:
        scale = max(ref.double().abs().max().item() for ref in reference.values() if ref.numel())
        side = _TorchSide(built, reference, torch_low, scale, _torch_errors(reference, runs, dtype))
    if _SHARED is not None:
        _SHARED[key] = side
    return side


def _torch_errors(reference: dict, runs: list[dict], dtype: torch.dtype) -> dict[str, dict[str, float]]:
    """Per output, torch's worst relative L2 and max abs error (and, at half precision, bias) over its ``runs``, and
    the reference's peak."""
    half = torch.finfo(dtype).eps > FLOAT32_EPS
    errors = {}
    for name, ref in reference.items():
        errors[name] = {
            "relative_l2": max(relative_l2(run[name], ref) for run in runs),
            "max_abs": max(max_abs(run[name], ref) for run in runs),
            "peak": ref.double().abs().max().item() if ref.numel() else 0.0,
        }
        if half:
            errors[name]["bias"] = max((bias(run[name], ref)[0] for run in runs), key=abs)
    return errors


def _agreed_finiteness(runs: list[dict]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per output, where every one of torch's ``runs`` (the float64 reference and each backend at the precision) is
    finite, and where none is: torch's own propagation of a NaN or infinity in an input. Where its runs disagree (a
    backend that adds an infinity into a sum where another subtracts it first) the rule asks nothing."""
    agreed = {}
    for name in runs[0]:
        finite = torch.stack([torch.isfinite(run[name]) for run in runs])
        agreed[name] = (finite.all(0), (~finite).all(0))
    return agreed


def evaluate(spec: OpSpec, candidate_fn: Callable, dims: dict, dtype: torch.dtype, device: str, seed: int) -> list[Check]:
    """Every check of one op at one drawn shape and dtype."""
    side = _torch_side(spec, dims, dtype, device, seed)
    built, reference = side.built, side.reference
    dtype_name = str(dtype).removeprefix("torch.")
    label = _example_label(spec.op.name, dims, dtype_name)
    # Two runs are compared bitwise, so torch's own ops run deterministically in both (on CUDA the provider's
    # index_select and SDPA backwards otherwise add with atomics in any order).
    with numerics.deterministic():
        try:
            candidate = _forward_backward(candidate_fn, built, dtype, device, seed, poison=True)
            again = _forward_backward(candidate_fn, built, dtype, device, seed, poison=True)
        except Declined:
            candidate = strict = None
        except torch.OutOfMemoryError:
            raise
        except Exception as error:
            strict = error
        else:
            strict = None
    if strict is not None:
        try:
            _forward_backward(candidate_fn, built, dtype, device, seed, poison=True)
        except torch.OutOfMemoryError:
            raise
        except Exception as error:  # the op breaks its caller: a verdict naming the op, not a crash of the item
            return [Check.failed(label, "error", raised(spec.op.name, error), output="all", dtype=dtype_name)]

        def rerun():
            with numerics.deterministic():
                _forward_backward(candidate_fn, built, dtype, device, seed, poison=True)

        return [raised_under_determinism(label, strict, rerun, raised(spec.op.name, strict), output="all",
                                         dtype=dtype_name)]
    if candidate is None:
        return [Check(label, DECLINED, 0.0, 0.0, True, {"output": "all", "dtype": dtype_name,
                                                          "reason": "declined (NotImplemented): the provider's op runs"})]
    checks = _contract_checks(label, dtype_name, candidate, side.torch_low) + _fresh_checks(label, dtype_name, candidate, again)
    if side.agreed is not None:
        return checks + _propagation_checks(label, dtype_name, candidate.results, side.agreed)
    candidate, again = candidate.results, again.results
    eps = torch.finfo(dtype).eps
    # The floor's magnitude: the reference's own, or, where the reference is below a few float32 ULP of the op's
    # natural scale (the largest magnitude among all its reference outputs), that natural scale. Such a reference
    # is the float64 residue of an exact zero (dq and dk with a single key: up to ~1e-15 of the scale), and
    # relative L2 would divide by that residue, so max abs decides alone. float32's ULP for both dtypes: a
    # bfloat16 item gates relative L2 wherever a float32 item does.
    scale = side.scale
    noise = FLOOR_ULPS * torch.finfo(torch.float32).eps * scale
    for name, ref in reference.items():
        where = f"{label}.{name}"
        key = {"output": name, "dtype": dtype_name}
        got = candidate[name]
        if got.shape != ref.shape:
            continue  # its output_contract check says so
        bad = int((~torch.isfinite(got)).sum())
        if bad:
            checks.append(Check.failed(where, "non_finite", f"{bad} NaN/Inf (NaN padding leaked or overflow)", value=float(bad), **key))
            continue
        repeated = torch.equal(got, again[name])
        checks.append(_verdict(where, "determinism", None if repeated else "two runs on the same inputs differ bitwise", key))
        cand_rel, cand_abs = relative_l2(got, ref), max_abs(got, ref)
        torch_errors = side.errors[name]
        torch_rel, torch_abs, peak = torch_errors["relative_l2"], torch_errors["max_abs"], torch_errors["peak"]
        magnitude = peak if peak > noise else scale
        abs_bound = ERROR_FACTOR * torch_abs + FLOOR_ULPS * eps * magnitude
        if peak > noise:
            rel_bound = ERROR_FACTOR * torch_rel + FLOOR_ULPS * eps
            checks.append(Check(where, "relative_l2", cand_rel, rel_bound, cand_rel <= rel_bound, {**key, "torch_error": torch_rel}))
            if eps > FLOAT32_EPS:  # half precision: see BIAS_SIGMAS
                cand_bias, spread = bias(got, ref)
                torch_bias = torch_errors["bias"]
                bias_bound = ERROR_FACTOR * abs(torch_bias) + BIAS_SIGMAS * spread + FLOOR_ULPS * eps / ref.numel() ** 0.5
                checks.append(Check(where, "bias", abs(cand_bias), bias_bound, abs(cand_bias) <= bias_bound,
                                    {**key, "torch_error": torch_bias, "signed": cand_bias}))
        checks.append(Check(where, "max_abs", cand_abs, abs_bound, cand_abs <= abs_bound, {**key, "torch_error": torch_abs}))
    return checks


def _propagation_checks(label: str, dtype_name: str, results: dict, agreed: dict) -> list[Check]:
    """A NaN or infinity in an input must come out where torch's does (:func:`_agreed_finiteness`): every output
    element non-finite in every torch run is non-finite in the candidate's (NaN and infinity alike: backends differ
    in which), and every element finite in every torch run is finite. A kernel whose max or clamp drops a NaN, or
    whose softmax turns a NaN row into zeros, swallows it; one that reads past its row spreads it."""
    checks = []
    for name, got in results.items():
        finite, nonfinite = agreed[name]
        if got.shape != finite.shape:
            continue  # its output_contract check says so
        got_finite = torch.isfinite(got)
        swallowed, spread = int((nonfinite & got_finite).sum()), int((finite & ~got_finite).sum())
        problems = ([f"{swallowed} elements finite where every torch run has NaN or infinity"] if swallowed else []) + \
                   ([f"{spread} NaN or infinity where every torch run is finite"] if spread else [])
        key = {"output": name, "dtype": dtype_name}
        checks.append(Check.failed(f"{label}.{name}", "nonfinite_propagation", "; ".join(problems),
                                   value=float(swallowed + spread), **key) if problems else
                      Check(f"{label}.{name}", "nonfinite_propagation", 0.0, 0.0, True,
                            {**key, "nonfinite": int(nonfinite.sum()), "finite": int(finite.sum())}))
    return checks


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, a NaN equal to a NaN (an input that holds one is unchanged if it still does)."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(torch.where(a.isnan(), 0, a), torch.where(b.isnan(), 0, b))


def raised(op: str, error: Exception) -> str:
    """The verdict of a candidate op that raised: the op, the error's first line, and what a detached output means."""
    reason = f"the candidate's {op} raised {one_line(error)}"
    if "does not require grad" in str(error):
        reason += " (its output is detached from autograd: the op contract wants outputs that carry their gradient)"
    return reason


DECLINED = "declined"  # the check kind of an example the candidate's op returned NotImplemented for


def _dims_label(dims: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in dims.items())


class Declined(Exception):
    """The candidate's op returned ``NotImplemented`` for a drawn example: the provider's op runs for such a call in
    the model, so the example qualifies nothing (:func:`evaluate` records it)."""


class KernelMismatch(AssertionError):
    """Raised inside the search so hypothesis shrinks a failing shape to a minimal one."""


def check(
    candidate,
    op: str,
    device: str,
    *,
    dtypes=tuple(DTYPES),
    max_examples: int = 8,
    limits: Limits | None = None,
    shrink: bool = True,
    calls: tuple = (),
    shrunk: tuple = (),
    logit_gain: float = QK_NORM_GAIN,
    progress=lambda message: None,
) -> GateResult:
    """Search shapes for one op of ``candidate``; the worst check per (dtype, output) is kept, failures shrunk. The
    model-shaped examples come from ``calls`` (at full size on a GPU) and ``shrunk`` (:func:`shipped_calls`), the
    attention logit tier's gain from the model's QK-norm weights (:func:`logit_gain`)."""
    ops = candidate.kernel_ops()
    if op not in OP_SPECS:
        raise ValueError(f"unknown kernel op {op!r}; ops: {', '.join(OPS)}")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        raise ValueError(f"kernel dtypes {list(dtypes)}: give one or more of {', '.join(DTYPES)}")
    # A search over some of the dtypes says so in its params (the pytest item of one op and one dtype).
    params = {"op": op} if set(dtypes) == set(DTYPES) else {"op": op, "dtype": "+".join(dtypes)}
    if op not in ops:
        missing = Check.failed(op, "missing", f"candidate {candidate.name} offers no standalone {op}")
        return GateResult(GATE, params, [missing], provenance=Provenance.of(candidate=candidate))
    spec = OP_SPECS[op]
    limits = limits or (GPU_LIMITS if torch.device(device).type == "cuda" else INTERPRETER_LIMITS)
    interpreted = torch.device(device).type != "cuda"
    kept: dict[str, Check] = {}
    failure: list[Check] = []
    examples = {"count": 0}
    probe = candidate.launch_paths()
    reached: dict[str, str] = {}  # path -> the first example that reached it

    def keep(checks: list[Check]) -> None:
        for c in checks:
            key = f"{c.detail['dtype']}.{c.detail['output']}.{c.kind}"
            if key not in kept or c.ratio > kept[key].ratio:
                kept[key] = c

    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]

        def visit(dims, seed):
            examples["count"] += 1
            progress(f"{op} {dtype_name} #{examples['count']}")
            with probe.recording() if probe else contextlib.nullcontext([_class_path(op, dims)]) as launched:
                checks = evaluate(spec, ops[op], dims, dtype, device, seed)
            for path in launched:
                reached.setdefault(str(path), _example_label(op, dims, dtype_name))
            bad = [c for c in checks if not c.passed]
            if bad:
                failure[:] = checks
                raise KernelMismatch(bad[0].line())
            keep(checks)

        try:
            _search(spec, limits, calls, shrunk, logit_gain, dtype_name, interpreted, max_examples, shrink, visit)
        except KernelMismatch:
            keep(failure)  # the shrunk (minimal) failing example's checks
        except FlakyFailure:
            # An example that failed once and passed when hypothesis ran it again: a candidate whose results vary
            # from call to call (a race on a GPU, say). The failing call's checks are its verdict.
            if not failure:
                raise
            keep(failure)
    if kept and all(c.kind == DECLINED for c in kept.values()):
        from h3gate.gates import NotClaimed

        raise NotClaimed(f"not claimed: candidate {candidate.name}'s {op} declined every shape the kernel gate drew "
                         "(returned NotImplemented; the provider's op runs for them)")
    entries = _path_entries(probe, spec, _narrowing(calls, interpreted, shrunk), dtypes, str(device), reached)
    path_checks = _path_checks(op, entries, "+".join(dtypes)) if probe and not failure else []
    paths = {"source": "launches" if probe else "model-shaped examples", "device": str(device),
             "complete": not failure, "entries": [entry.__dict__ for entry in entries]}
    return GateResult(
        GATE,
        params,
        list(kept.values()) + path_checks,
        {"rule": f"error <= {ERROR_FACTOR} x torch's + {FLOOR_ULPS} ULP", "paths": paths},
        {"examples": examples["count"]},
        provenance=Provenance.of(candidate=candidate),
    )


def _search(spec: OpSpec, limits: Limits, calls, shrunk, logit_gain: float, dtype_name: str, interpreted: bool,
            max_examples: int, shrink: bool, visit: Callable[[dict, int], None]) -> None:
    """``visit(dims, seed)`` on every example of ``spec`` at ``dtype_name``: the op's own, its edges and range tiers
    (attention's logits at ``logit_gain``), one per path class of the model's ``calls`` and the ``shrunk`` ones
    (:func:`model_examples`) and their long reductions, then ``max_examples`` that hypothesis draws (derandomized: the
    same every run). A :class:`KernelMismatch` raised by ``visit`` ends the search, with the failing example shrunk to
    a minimal one where ``shrink``."""

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else []),
        suppress_health_check=list(HealthCheck),
    )
    @given(dims=spec.dims(limits), seed=st.integers(0, 2**31 - 1))
    def search(dims, seed):
        visit(dims, seed)

    shaped = model_examples(spec, calls, dtype_name, narrow=interpreted, shrunk=shrunk)
    shaped += long_examples(spec, calls if interpreted else shrunk, dtype_name)
    for explicit in (*spec.examples, *edge_examples(spec, limits), *tier_examples(spec, logit_gain), *shaped):
        search = example(dims=explicit, seed=0)(search)
    with _draws_of_the_search_alone():
        search()


@contextlib.contextmanager
def _draws_of_the_search_alone():
    """Derandomized draws that follow the op's strategy and hypothesis' version alone. Hypothesis draws a constant now
    and then (about one draw in twenty) from a pool of the literals of every local module the process has imported
    (``_get_local_constants``, hypothesis >= 6.131): the same search would otherwise meet other shapes in a user's
    repository than in ours, after another gate's modules were imported, or once code only moved. Within the search
    that pool is empty (and its cache of allowed constants, shared by every provider, is cleared on the way in and
    out); hypothesis' own global constants stay. A hypothesis without the pool draws the same either way."""
    from hypothesis.internal.conjecture import providers

    if not hasattr(providers, "_get_local_constants"):
        yield
        return
    pool, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    providers._get_local_constants = providers.Constants
    cache.cache.clear()
    try:
        yield
    finally:
        providers._get_local_constants = pool
        cache.cache.clear()


def planned_paths(candidate, op: str, device: str, *, calls, suite: tuple, dtypes=tuple(DTYPES), max_examples: int = 8,
                  limits: Limits | None = None) -> list[launch_paths.Entry]:
    """The kernel gate's path report of ``op`` without running a kernel: the paths the model's ``calls`` take and the
    example of the gate's search (as it runs over ``suite``, :func:`suite_calls`) that reaches each, both planned
    through the candidate's declared paths from the same host code its launches run (the gate itself records its
    examples' launches)."""
    probe = candidate.launch_paths()
    if probe is None:
        raise ValueError(f"candidate {candidate.name} declares no launch paths: the kernel gate reports its model's "
                         "path classes by its model-shaped examples")
    spec, fn = OP_SPECS[op], probe.ops[op]
    interpreted = torch.device(device).type != "cuda"
    limits = limits or (GPU_LIMITS if not interpreted else INTERPRETER_LIMITS)
    reached: dict[str, str] = {}
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]

        def visit(dims, seed):
            built = _built(spec, dims, dtype, device, seed)
            with probe.planning() as launched, contextlib.suppress(Declined):
                _forward_backward(fn, built, dtype, device, seed, poison=True)
            for path in launched:
                reached.setdefault(str(path), _example_label(op, dims, dtype_name))

        _search(spec, limits, *suite, QK_NORM_GAIN, dtype_name, interpreted, max_examples, False, visit)
    return _path_entries(probe, spec, _narrowing(calls, interpreted, ()), dtypes, str(device), reached)


def _example_label(op: str, dims: dict, dtype_name: str) -> str:
    return f"{op}[{_dims_label(dims)}, {dtype_name}]"


def _class_path(op: str, dims: dict) -> str:
    """A path as the model-shaped examples see it, for a candidate that declares none: the op and its path class."""
    return f"{op}[{' '.join(f'{k}={v}' for k, v in path_class(dims))}]"


def _path_entries(probe, spec: OpSpec, calls: list[tuple[op_calls.Call, bool]], dtypes, device: str,
                  reached: dict) -> list[launch_paths.Entry]:
    """Each path the model's ``calls`` (each with whether its examples are narrowed) of ``spec``'s op at ``dtypes``
    take, planned shape-only through the candidate's declared paths (or, where it declares none, its path class),
    with the example that reached it."""
    taken: dict[str, list[str]] = {}
    left: dict[str, tuple[str, list[str]]] = {}
    for call, narrow in calls:
        if call.op != spec.op.name or _call_dtype(call) not in dtypes:
            continue
        label = launch_paths.call_label(call)
        if probe:
            planned, elsewhere = launch_paths.planned(probe, call, device)
        else:
            planned, elsewhere = [_class_path(spec.op.name, _call_dims(spec, call, narrow))], []
        for path in planned:
            taken.setdefault(path, []).append(label)
        for path, why in elsewhere:
            left.setdefault(path, (why, []))[1].append(label)
    once = {path: list(dict.fromkeys(labels)) for path, labels in taken.items()}  # calls apart only in storage offsets
    return launch_paths.report(once, {path: (why, list(dict.fromkeys(labels))) for path, (why, labels) in left.items()},
                               reached)


def _path_checks(op: str, entries: list, dtype: str) -> list[Check]:
    """One failed check per path the model launches that no example reached (naming it), else one passed check (none
    where the model launches none at this dtype)."""
    unreached = [entry for entry in entries if entry.reached_by is None and entry.left_out is None]
    key = {"output": "paths", "dtype": dtype}
    if not entries:
        return []
    if not unreached:
        return [Check(f"{op}.paths", "path_coverage", 0.0, 0.0, True, {**key, "paths": len(entries)})]
    return [Check.failed(f"{op}.paths", "path_coverage", f"the model launches {entry.path}, which no example reached "
                         f"(model calls: {'; '.join(entry.calls)})", **key) for entry in unreached]


# The gate protocol (:mod:`h3gate.gates`) ------------------------------------------------------------------

LIST_CHOICES = {"ops": OPS, "dtypes": tuple(DTYPES)}


def items(run) -> list[dict]:
    return [{"op": op, "dtype": dtype} for op in OPS for dtype in DTYPES]


def bounds_file(run) -> None:
    return None  # the rule compares with torch in the same run


def suite_calls(model_name: str, thresholds, device: str, load=None) -> tuple[tuple[op_calls.Call, ...],
                                                                          tuple[op_calls.Call, ...]]:
    """The op calls the kernel gate of ``model_name`` on ``device`` qualifies, as ``(calls, shrunk)`` for :func:`check`:
    the model's, and the release model's too (shape-only), so that narrowed examples reach the paths the shipped
    model's widths, heads and lengths take (rows wider than 2,048, 56 heads, reductions over 38,733 rows) on every
    device and with every model. On a GPU the model's calls run at full size and the release model's narrowed; under
    the interpreter all are narrowed. ``load``: the model, for a checkpoint's config."""
    calls = op_calls.model_calls(model_name, thresholds, load)
    release = () if model_name == RELEASE else op_calls.model_calls(RELEASE, thresholds)
    if torch.device(device).type == "cuda":
        return calls, release
    return calls + release, ()


def shipped_calls(run) -> tuple[tuple[op_calls.Call, ...], tuple[op_calls.Call, ...]]:
    """:func:`suite_calls` of a gate run."""
    return suite_calls(run.model_name, run.thresholds, run.device, lambda: run.model)


def check_item(run, _bounds) -> GateResult:
    import dataclasses

    from h3gate.gates import NotClaimed

    op = run.params["op"]
    asked = (run.params["dtype"],) if "dtype" in run.params else tuple(DTYPES)
    reasons = [run.candidate.unclaimed(op, dtype) for dtype in asked]
    dtypes = tuple(dtype for dtype, reason in zip(asked, reasons) if reason is None)
    if not dtypes:
        raise NotClaimed(reasons[0])
    calls, shrunk = shipped_calls(run)
    gain, gain_from = logit_gain(run.model_name, lambda: run.model)
    with run.progress(None) as bar:
        result = check(run.candidate, op, run.device, dtypes=dtypes, max_examples=run.kernel_examples,
                       shrink=run.kernel_shrink, progress=bar.step, calls=calls, shrunk=shrunk, logit_gain=gain)
    # The item's own params, whatever dtypes the candidate left out of them, which its evidence names.
    unclaimed = {dtype: reason for dtype, reason in zip(asked, reasons) if reason is not None}
    context = {**result.context, **({"logit_gain": {"gain": gain, "from": gain_from}} if op == "attention" else {}),
               **({"not_claimed": unclaimed} if unclaimed else {})}
    return dataclasses.replace(result, params=dict(run.params), context=context)
