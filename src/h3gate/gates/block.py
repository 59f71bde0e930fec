"""The ``block`` gate: one transformer block replayed from captured inputs, every internal tap compared.

When the model gate fails the next question is "which op?". Capture: when the bounds are frozen, a provider
forward at the model contract records the exact inputs of the block (hidden_states, temb, adaln_indices, rotary
cos/sin) into ``block<N>-capture.safetensors`` beside ``block<N>-bounds.json``, its sha256 in the bounds and in the
lock. A check replays from that file, never from a capture of its own: a bf16 forward's bits follow the machine's
kernels (AVX2, AVX-512 and AMX CPUs differ), and the replay must start where the bounds started. Replay:
the block alone, forward and backward from a seeded upstream gradient, under golden (an fp32 copy of the
block), the provider and each variant (the block program over the provider's ops, bitwise diffusers) and
the candidate, recording every named point of the block program, its gradient, every parameter gradient and
the input gradients. Bounds: the ensemble rule per tap, frozen like the model gate's.

Attribution, when a check of the block failed: hybrids of the candidate with one op group at a time run as the
provider; the group whose swap back removes most of the error is named (a passing block has no error to attribute,
and its hybrids would be two thirds of its check on a CPU). With every group as the provider the block must be
bitwise the provider: the gate checks that self-consistency every time. ULP sweep: per tap the histogram of ULP distances to golden
rounded to the tap's dtype, candidate beside provider, as JSON and as a PNG heat map (matplotlib's ``Figure``,
without pyplot's global state, so it renders on a host thread while attribution replays on the device).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import load as safetensors_load

from h3gate import bounds as bounds_mod, numerics, seeded
from h3gate.block_program import BLOCK_TAP_POINTS, OP_GROUPS, PROVIDER_OPS, TAP_POINT, transformer_block_forward
from h3gate.candidates import Candidate, CandidateError, coverage
from h3gate.compare import relative_l2, ulp_distance
from h3gate.files import FileFormatError, dumps, sha256_bytes, write_atomic
from h3gate.gates.model import contract_of, frozen_for_contract, inventory_checks
from h3gate.measure import timed
from h3gate.model.contract import ModelContract, load_model_contract, model_inputs
from h3gate.model.identity import Model
from h3gate.taps import TapStore
from h3gate.verdict import Check, GateResult, Provenance, raised_under_determinism, repeatability

GATE = "block"
CAPTURE_SUFFIX = "-capture.safetensors"
ULP_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096, math.inf)


def bounds_stem(block: int) -> str:
    return f"block{block}"


def in_background(function, *args) -> Future:
    """``function(*args)`` on a thread of its own; the future's ``result()`` returns or raises what it did."""
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        return executor.submit(function, *args)
    finally:
        executor.shutdown(wait=False)  # the thread ends when its one call does


# Capture ----------------------------------------------------------------------------------------------


def capture_path(bounds_file: Path) -> Path:
    """The capture frozen beside a block's bounds file: ``block<N>-capture.safetensors``."""
    bounds_file = Path(bounds_file)
    return bounds_file.with_name(bounds_file.name.removesuffix("-bounds.json") + CAPTURE_SUFFIX)


def capture(model: Model, contract: ModelContract, device: str, block: int) -> bytes:
    """The inputs of ``block`` in a provider forward at the contract, as safetensors bytes (CPU tensors).

    Their bits follow the machine's kernels (a bf16 forward: AVX2, AVX-512 and AMX CPUs, and GPU kinds, differ), so
    they are made once, when the bounds are frozen, and travel beside them (:func:`freeze`, :func:`load_capture`)."""
    from safetensors.torch import save

    inputs, _ = model_inputs(contract, model.config)
    captured = {}

    def grab(_module, args, kwargs):
        names = ("hidden_states", "temb", "adaln_indices", "rotary_emb")
        bound = dict(zip(names, args)) | kwargs
        cos, sin = bound["rotary_emb"]
        for name, tensor in (("hidden_states", bound["hidden_states"]), ("temb", bound["temb"]),
                             ("adaln_indices", bound["adaln_indices"]), ("cos", cos), ("sin", sin)):
            captured[name] = tensor.detach().to("cpu", copy=True).contiguous()

    transformer = model.transformer.to(device)
    handle = transformer.transformer_blocks[block].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with numerics.activate(numerics.PROVIDER), torch.no_grad():
            transformer(**{k: v.to(device) for k, v in inputs.items()})
    finally:
        handle.remove()
    return save(captured)


def _capture_command(path: Path, digest: str) -> str:
    return (f"`h3gate capture {path}` re-makes it and keeps it only if its sha256 is the frozen {digest[:12]} (a "
            "machine of the kind that froze it makes the same bits); elsewhere copy the file from where the bounds "
            "were frozen")


def load_capture(path: Path, digest: str, block: int) -> tuple[dict, Future]:
    """(the captured inputs, future of the check that the file is the frozen one): the file is hashed on a host
    thread while the caller's golden replay runs on the device (0.8 GB at release size); the future's ``result()``
    raises :class:`h3gate.bounds.BoundsError` for a file that is not the frozen one. A missing file (a release-size
    capture may live outside git) is one error naming the file, its digest and the command that makes it."""
    from safetensors import SafetensorError

    path = Path(path)
    if not path.is_file():
        raise bounds_mod.BoundsError(f"the frozen capture of block {block} is missing: {path} (sha256 {digest}); "
                                     + _capture_command(path, digest))
    data = path.read_bytes()

    def verified() -> str:
        found = sha256_bytes(data)
        if found != digest:
            raise bounds_mod.BoundsError(
                f"{path} (sha256 {found[:12]}) is not the capture its bounds were frozen from ({digest[:12]}): restore it "
                "from version control, or " + _capture_command(path, digest)
            )
        return found

    try:
        captured = safetensors_load(data)
    except SafetensorError as error:
        raise FileFormatError(path, f"capture is not a readable safetensors file ({error}): restore it from version "
                              "control") from error
    return captured, in_background(verified)


def recapture(capture_file: Path, model: Model, device: str) -> Path:
    """Make the frozen capture ``capture_file`` again (it may live outside version control) and write it only if it
    is bitwise the frozen one, which its bounds file beside it names; else :class:`h3gate.bounds.BoundsError`."""
    capture_file = Path(capture_file)
    bounds_file = capture_file.with_name(capture_file.name.removesuffix(CAPTURE_SUFFIX) + "-bounds.json")
    frozen = bounds_mod.load(bounds_file, GATE, model.identity, bounds_mod.device_class(device))
    contract_file = bounds_file.parent.parent / "model-contract.json"
    contract = load_model_contract(contract_file)
    if frozen.provenance.get("contract") != contract.to_json():
        raise bounds_mod.BoundsError(f"{bounds_file} was frozen for another model contract than {contract_file}")
    data = capture(model, contract, device, int(frozen.provenance["block"]))
    found, digest = sha256_bytes(data), frozen.provenance.get("capture_sha256")
    if found != digest:
        raise bounds_mod.BoundsError(
            f"this machine captures other bits (sha256 {found[:12]}) than the frozen {capture_file.name} "
            f"({str(digest)[:12]}): its CPU or GPU kind or its libraries differ from those that froze the bounds; copy "
            "the file from where they were frozen"
        )
    write_atomic(capture_file, data)
    return capture_file


# Replay -----------------------------------------------------------------------------------------------


_NORMAL_CHUNK = 1 << 24  # elements per generator of :func:`seeded_normal`


def seeded_normal(shape: torch.Size, seed: int) -> torch.Tensor:
    """Unit-variance float32 of ``shape`` (:func:`h3gate.seeded.normal`), drawn on the host in chunks of 16 M
    elements, chunk ``i`` by its own generator seeded ``seed + i``, the chunks on a thread pool (torch releases the
    GIL while it draws).

    The values depend on nothing but ``shape`` and ``seed`` (not the machine, its CPU kind, core count or device); the
    chunks draw a release block's 205 M elements faster than one generator would.
    """
    out = torch.empty(shape, dtype=torch.float32)
    flat = out.view(-1)

    def draw(index: int) -> None:
        chunk = flat[index * _NORMAL_CHUNK:(index + 1) * _NORMAL_CHUNK]
        chunk.copy_(seeded.normal(chunk.shape, torch.Generator().manual_seed(seed + index)))

    chunks = range(math.ceil(flat.numel() / _NORMAL_CHUNK))
    with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), os.cpu_count() or 1))) as pool:
        list(pool.map(draw, chunks))
    return out


def replay_inputs(captured: dict, device: str, seed: int = 0) -> dict:
    """The captured inputs on ``device`` and the seeded upstream gradient of the block's output (``upstream``),
    made once per gate run rather than per replay: at release size each is 0.8 GB. The gradient is drawn while
    the inputs are moved."""
    upstream = in_background(seeded_normal, captured["hidden_states"].shape, seed)
    inputs = {name: tensor.to(device) for name, tensor in captured.items()}
    inputs["upstream"] = upstream.result().to(device)
    return inputs


def replay(block_module, inputs: dict, device: str, call=None) -> TapStore:
    """Forward+backward of one block at :func:`replay_inputs`; every program point, gradient and parameter
    gradient, kept on ``device``, where the gate compares them."""
    store = TapStore(device=device)
    dtype = next(block_module.parameters()).dtype
    # Fresh leaves per replay: a leaf shared across replays would accumulate their gradients.
    hidden = inputs["hidden_states"].to(device, dtype, copy=True).requires_grad_(True)
    temb = inputs["temb"].to(device, copy=True).requires_grad_(True)
    rotary = (inputs["cos"], inputs["sin"])
    indices = inputs["adaln_indices"]

    def point(module, name, tensor):
        if module is block_module:
            store.put(name, tensor)
            if tensor.requires_grad:
                tensor.register_hook(lambda grad, name=name: store.put(f"{name}.grad", grad))

    block_module.zero_grad(set_to_none=True)
    token = TAP_POINT.set(point)
    try:
        output = (block_module if call is None else call)(hidden, temb, indices, rotary)
        store.put("output", output)
        (output.float() * inputs["upstream"]).sum().backward()
    finally:
        TAP_POINT.reset(token)
    for name, tensor in (("hidden_states", hidden), ("temb", temb)):
        store.put(f"input_gradients.{name}", tensor.grad if tensor.grad is not None else torch.zeros_like(tensor))
    for name, param in block_module.named_parameters():
        store.put(f"parameter.{name}.grad", param.grad if param.grad is not None else torch.zeros_like(param))
    block_module.zero_grad(set_to_none=True)
    return store


@contextlib.contextmanager
def alone_on_device(model: Model, block: int, device: str):
    """The transformer on ``device`` but for its other blocks, which wait in host memory meanwhile (and go back
    after, also on error): a block's replays need only that block, and at release size the other 49 (60 GiB) would
    leave no room for golden's and a replay's taps (57 GB). Nothing moves on a CPU."""
    transformer = model.transformer.to(device)
    others = [module for index, module in enumerate(transformer.transformer_blocks) if index != block]
    if torch.device(device).type == "cpu" or not others:
        yield
        return
    for module in others:
        module.to("cpu")
    torch.cuda.empty_cache()
    try:
        yield
    finally:
        for module in others:
            module.to(device)


def _program_block(block_module, ops):
    """A standalone copy of a block whose forward is the block program over ``ops``."""
    module = copy.deepcopy(block_module)
    module.forward = functools.partial(transformer_block_forward, ops, module)
    return module


def provider_replay(model: Model, block: int, inputs: dict, device: str, mode: numerics.Mode) -> TapStore:
    """Golden, the provider or a variant: the block program over the provider's ops (bitwise diffusers)."""
    source = model.transformer.transformer_blocks[block]
    module = _program_block(source, PROVIDER_OPS).to(device)
    if mode.fp32_weights:
        module.float()
    with numerics.activate(mode):
        return replay(module, inputs, device, numerics.runner(mode, module))


def candidate_replay(model: Model, block: int, inputs: dict, device: str, candidate: Candidate) -> TapStore:
    """The candidate installed into the whole transformer (placed by :func:`alone_on_device`); its block ``block``
    replayed."""
    transformer = model.transformer
    with numerics.activate(numerics.PROVIDER), candidate.installed(transformer):
        store = replay(transformer.transformer_blocks[block], inputs, device)
    for name in store:
        tensor = store[name]
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CandidateError(f"candidate {candidate.name} produced non-finite values in block {block} tap {name}")
    return store


def _errors(store: TapStore, golden: TapStore) -> dict[str, float]:
    return {name: relative_l2(store[name], golden[name]) for name in store if name in golden}


# Freeze and check -------------------------------------------------------------------------------------


def _golden_of_capture(model, captured, hashing, device, block, timings, progress):
    """(replay inputs, golden's taps) for freeze and check alike; the capture file's check (:func:`load_capture`)
    runs on a host thread while golden replays, and raises here if it failed."""
    with timed(timings, "capture"):
        inputs = replay_inputs(captured, device)
    progress("golden")
    with timed(timings, "golden"):
        golden = provider_replay(model, block, inputs, device, numerics.GOLDEN)
    with timed(timings, "capture"):
        hashing.result()
    return inputs, golden


def freeze(model, contract, device, block, thresholds, variant_names=None, force_reason=None, progress=lambda m: None):
    """Capture, then golden, provider and variants replays; the ensemble bounds of every tap, frozen and locked with
    the capture written beside them."""
    device_class = bounds_mod.device_class(device)
    path = bounds_mod.bounds_path(thresholds, model.name, device_class, bounds_stem(block))
    bounds_mod.refuse_overwrite(path, force_reason)
    timings: dict[str, float] = {}
    progress("capture")
    with timed(timings, "capture"):
        data = capture(model, contract, device, block)
        digest = sha256_bytes(data)
        captured = safetensors_load(data)
    hashing: Future = Future()  # the bytes were just made: nothing to check while golden replays
    hashing.set_result(digest)
    modes = [numerics.PROVIDER] + [numerics.get(n, device) for n in (variant_names or [m.name for m in numerics.variants(device)])]
    errors = {}
    with alone_on_device(model, block, device):
        inputs, golden = _golden_of_capture(model, captured, hashing, device, block, timings, progress)
        for mode in modes:
            progress(mode.name)
            with timed(timings, mode.name):
                errors[mode.name] = _errors(provider_replay(model, block, inputs, device, mode), golden)
        del inputs, golden
    capture_file = capture_path(path)
    frozen = bounds_mod.frozen_by_ensemble(
        GATE,
        model,
        device_class,
        errors,
        {"block": block, "capture_file": capture_file.name, "capture_sha256": digest, "contract": contract.to_json(),
         "timings_s": timings},
    )
    # Written only now, with its bounds: a freeze that fails on the way leaves no capture that its lock lacks.
    write_atomic(capture_file, data)
    bounds_mod.save(frozen, path, thresholds, force_reason, companions=[capture_file])
    return frozen


def check(model, candidate, contract, frozen, device, block, out_dir, progress=lambda m: None, diagnostics=True) -> GateResult:
    """The candidate's block, replayed from the capture frozen beside its bounds, against those bounds, with
    a second replay (repeatability), self-consistency, the ULP sweep and, when a check failed, attribution
    (``diagnostics=False`` leaves those out: the verdict alone, as the power report needs it)."""
    timings: dict[str, float] = {}
    digest = frozen.provenance.get("capture_sha256")
    if not isinstance(digest, str):
        raise bounds_mod.BoundsError(f"{frozen.path} names no frozen capture of block {block}: freeze it again "
                                     "(--h3-freeze --h3-freeze-force=REASON)")
    progress("capture")
    captured, hashing = load_capture(capture_path(frozen.path), digest, block)
    with alone_on_device(model, block, device):
        return _check(model, candidate, frozen, device, block, out_dir, progress, diagnostics, timings, digest,
                      _golden_of_capture(model, captured, hashing, device, block, timings, progress))


def _check(model, candidate, frozen, device, block, out_dir, progress, diagnostics, timings, digest, replay) -> GateResult:
    inputs, golden = replay
    # Taps stay on the device (a release block's are 19 GB per bf16 replay, 38 GB golden's): each replay is
    # reduced to its errors and ULP histograms before the next, so only golden's are held beside one replay's.
    progress("provider")
    with timed(timings, "provider"):
        provider = provider_replay(model, block, inputs, device, numerics.PROVIDER)
        provider_errors = _errors(provider, golden)
    if diagnostics:
        with timed(timings, "ulp"):
            provider_ulp = ulp_histograms(provider, golden)
    del provider
    progress(f"candidate {candidate.name}")
    with timed(timings, "candidate"), coverage.counting(candidate) as counts:  # not the hybrids' calls
        measured = candidate_replay(model, block, inputs, device, candidate)
        candidate_errors = _errors(measured, golden)
    ulp, rendering = {}, None
    if diagnostics:
        with timed(timings, "ulp"):
            ulp = ulp_sweep(ulp_histograms(measured, golden), provider_ulp)
        rendering = in_background(write_ulp_artifacts, ulp, Path(out_dir) / "block" / f"{model.name}-block{block}")
    recorded = set(measured)
    del measured
    if not any(point in recorded for point in BLOCK_TAP_POINTS):
        reason = (
            f"candidate {candidate.name} exposes none of the block program's tap points (its blocks do not run "
            "through h3gate.block_program), so the block's internal taps cannot be compared"
        )
        checks = [Check.failed("internal taps", "inventory", reason)]
    else:
        checks = inventory_checks(recorded, set(frozen.bounds))
    for tap, value in candidate_errors.items():
        if tap in frozen.bounds:
            detail = {"provider_relative_l2": provider_errors[tap]}
            checks.append(Check(tap, "relative_l2", value, frozen.bounds[tap], value <= frozen.bounds[tap], detail))
    attribution = {}
    if diagnostics:
        progress(f"candidate {candidate.name} twice")
        with timed(timings, "repeat"):
            checks.append(replayed_twice(model, block, inputs, device, candidate, golden))
        with timed(timings, "consistency"):
            checks += self_consistency(model, block, inputs, device, candidate)
        if all(check.passed for check in checks):
            attribution = {"not_run": "every check passed: no error to attribute (the hybrids run when one fails)"}
        else:
            with timed(timings, "attribution"):
                attribution = attribute(model, block, inputs, device, candidate, golden, frozen, progress)
    return coverage.judged(GateResult(
        gate=GATE,
        params={"block": block},
        checks=checks,
        context={"capture_sha256": digest, "artifacts": rendering.result() if rendering else {}},
        metrics={"candidate": candidate_errors, "provider": provider_errors, "attribution": attribution, "ulp": ulp},
        timings=timings,
        provenance=Provenance.of(frozen, model, candidate),
    ), counts)


def replayed_twice(model, block, inputs, device, candidate, golden) -> Check:
    """Two replays under torch's deterministic algorithms (torch's own ops too, as the kernel gate runs them) must
    give bitwise the same errors. The candidate's first replay ran without them, so an error raised here, and again
    by one more replay, means a backend with no deterministic kernel: a failed check naming it."""
    name = "candidate[replayed twice]"

    def replayed():
        with numerics.deterministic():
            return _errors(candidate_replay(model, block, inputs, device, candidate), golden)

    try:
        twice = [replayed() for _ in range(2)]
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as error:
        return raised_under_determinism(name, error, replayed)
    return repeatability(name, *twice)


def self_consistency(model, block, inputs, device, candidate) -> list[Check]:
    """The candidate's block with every op group run as the provider must be bitwise the provider's block: its
    program adds nothing of its own, so the hybrids' errors are the groups' own. No check for a candidate that cannot
    run its ops as the provider's (not a block program)."""
    try:
        everything = candidate.with_provider_groups(OP_GROUPS)
    except CandidateError:
        return []
    with numerics.deterministic():
        provider = provider_replay(model, block, inputs, device, numerics.PROVIDER)
        all_provider = candidate_replay(model, block, inputs, device, everything)
    differing = [name for name in provider if name not in all_provider or not torch.equal(all_provider[name], provider[name])]
    detail = {"reason": f"{len(differing)} taps differ bitwise from the provider: {differing[:5]}"} if differing else {}
    return [Check("hybrid[all groups as provider]", "self_consistency", float(len(differing)), 0.0, not differing, detail)]


def attribute(model, block, inputs, device, candidate, golden, frozen, progress) -> dict:
    """Hybrids, run when a check of the block failed: per op group swapped back to the provider, the error table,
    and the group they point at (the one whose swap leaves the smallest worst ratio to the bounds)."""
    try:
        hybrids = {group: candidate.with_provider_groups((group,)) for group in OP_GROUPS}
    except CandidateError as error:
        return {"unavailable": str(error)}
    tables = {}
    for group, hybrid in hybrids.items():
        progress(f"hybrid {group}")
        tables[group] = _errors(candidate_replay(model, block, inputs, device, hybrid), golden)

    def score(table):
        return max((table[tap] / frozen.bounds[tap] for tap in table if tap in frozen.bounds), default=0.0)

    scores = {group: score(table) for group, table in tables.items()}
    return {"tables": tables, "worst_ratio": scores, "attributed_group": min(scores, key=scores.get)}


# The gate protocol (:mod:`h3gate.gates`) ------------------------------------------------------------------


def items(run) -> list[dict]:
    return [{"block": block} for block in range(run.model.config["num_layers"])]


def bounds_file(run) -> Path:
    return bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, bounds_stem(run.params["block"]))


def load_bounds(run) -> bounds_mod.Bounds:
    return frozen_for_contract(run, GATE, bounds_stem(run.params["block"]))


def freeze_item(run) -> bounds_mod.Bounds:
    names = run.variant_names or [mode.name for mode in numerics.variants(run.device)]
    with run.progress(len(names) + 3) as bar:
        return freeze(run.model, contract_of(run)[1], run.device, run.params["block"], run.thresholds, names,
                      run.force_reason, progress=bar.step)


def check_item(run, frozen: bounds_mod.Bounds) -> GateResult:
    with run.progress(4 + (len(OP_GROUPS) + 1 if run.diagnostics else 0)) as bar:
        return check(run.model, run.candidate, contract_of(run)[1], frozen, run.device, run.params["block"], run.out,
                     progress=bar.step, diagnostics=run.diagnostics)


# ULP sweep --------------------------------------------------------------------------------------------


_ULP_CHUNK = 1 << 26  # elements per step of a histogram: its int64 temporaries stay near 0.5 GB each


def _histogram(x: torch.Tensor, ref: torch.Tensor) -> list[int]:
    """Counts of the ULP distances of ``x`` to ``ref`` per bin of ``ULP_BINS``, in chunks of the flattened taps
    (a release block's SwiGLU input has 1.1 G elements, whose distances alone would take 8.8 GB)."""
    x, ref = x.reshape(-1), ref.reshape(-1)
    edges = torch.tensor([b for b in ULP_BINS[1:-1]], dtype=torch.int64, device=x.device)
    counts = torch.zeros(len(ULP_BINS) - 1, dtype=torch.int64, device=x.device)
    for start in range(0, x.numel(), _ULP_CHUNK):
        distances = ulp_distance(x[start:start + _ULP_CHUNK], ref[start:start + _ULP_CHUNK])
        counts += torch.bincount(torch.bucketize(distances, edges, right=True), minlength=len(counts))
    return counts.tolist()


def ulp_histograms(store: TapStore, golden: TapStore) -> dict:
    """Per floating tap of golden: ``(dtype, ULP-distance histogram)`` of ``store``'s tap against golden's."""
    return {name: (str(store[name].dtype).removeprefix("torch."), _histogram(store[name], golden[name]))
            for name in golden if name in store and golden[name].is_floating_point()}


def ulp_sweep(candidate: dict, provider: dict) -> dict:
    """Per tap: the candidate's and the provider's histograms (:func:`ulp_histograms`) side by side."""
    sweep = {name: {"dtype": dtype, "candidate": counts, "provider": provider[name][1]}
             for name, (dtype, counts) in candidate.items() if name in provider}
    return {"bins": [str(b) for b in ULP_BINS], "taps": sweep}


def write_ulp_artifacts(sweep: dict, stem: Path) -> dict[str, str]:
    """``<stem>-ulp.json`` and ``<stem>-ulp.png`` (heat maps: tap x ULP bin, provider beside candidate)."""
    import numpy as np
    from matplotlib.figure import Figure

    json_path = stem.with_name(stem.name + "-ulp.json")
    write_atomic(json_path, dumps(sweep))
    taps = list(sweep["taps"])
    labels = [f"[{sweep['bins'][i]}, {sweep['bins'][i + 1]})" for i in range(len(sweep["bins"]) - 1)]
    figure = Figure(figsize=(14, 0.28 * len(taps) + 2))
    axes = figure.subplots(1, 2, sharey=True)
    for axis, who in zip(axes, ("provider", "candidate")):
        counts = np.array([sweep["taps"][t][who] for t in taps], dtype=float)
        fractions = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
        image = axis.imshow(fractions, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        axis.set_title(f"{who}: fraction of elements per ULP distance to golden")
        axis.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        axis.set_yticks(range(len(taps)), taps, fontsize=7)
    figure.colorbar(image, ax=axes, shrink=0.6)
    png_path = stem.with_name(stem.name + "-ulp.png")
    image_bytes = io.BytesIO()
    figure.savefig(image_bytes, format="png", dpi=110, bbox_inches="tight")
    write_atomic(png_path, image_bytes.getvalue())
    return {"ulp_json": str(json_path), "ulp_png": str(png_path)}
