"""The ``generation`` gate: the whole pipeline, one seed at a time, the candidate against the provider's generation.

The pipeline is diffusers' modular MiniMax-H3 pipeline as shipped (:mod:`h3gate.generation.pipeline`); only the transformer
call is wrapped, by the resumable run store (:mod:`h3gate.generation.resume`), which saves or replays every call. What the
candidate does not touch, the text encoder's prompt encoding and the fl2va keyframe's VAE encoding, is made once per
contract, workflow and component identity and cached on disk (:func:`encodings`); the text encoder then leaves the
device, which at release size holds the transformer, both VAEs and the runs.

:func:`check` (one seed, one pytest item; every workflow the contract names, each its own pair of generations):

1. Cheap before expensive: the model gate must have passed for this model and candidate identity
   (:mod:`h3gate.gates.passes` records the verdict and checks it); an override reason lets it run anyway and is
   recorded in the result.
2. The provider's generation of the seed, cached as a resumable run under ``out_dir`` (freezing made it) and
   reused when its identity matches; otherwise generated (or resumed) now.
3. Same start: the candidate's first transformer call's inputs (video latents, audio latents, text states,
   layout) must equal the provider's bitwise; otherwise the gate fails naming both digests, before a single
   candidate step is computed.
4. Metrics (:mod:`h3gate.generation.metrics`) against the provider's generation under both rules, ``fixed`` (the
   contract's bounds) and ``calibrated`` (the frozen bounds); the contract's ``gating_rule`` makes the checks
   (``both``: every bound of both, named ``<workflow>.<rule>.<metric>``), a rule that does not gate is reported
   in ``GateResult.metrics``.
5. Coverage (:mod:`h3gate.candidates.coverage`): each replaced op of the candidate must have served some of its calls over the
   seed's generations; the counts are saved with each step, so a reused or resumed generation keeps them.

:func:`freeze`, before any candidate generates: the provider and every variant generate every seed; per gated
metric the worst value over the variants, workflows and seeds, widened by the contract's margin ``m`` as the metric's row
of :data:`h3gate.generation.metrics.METRICS` says, is the calibrated bound. A variant whose generations equal the provider's
(or an earlier variant's) bitwise adds nothing and is dropped, as recorded; when no variant changes a metric at
all freezing is refused, since the rule would then demand bitwise equality. The bounds file is written and locked
with :mod:`h3gate.bounds` (``thresholds/<model>/<device class>/<contract name>-bounds.json``).

Run store: ``out_dir/generation/<model>/<contract name>/<role>-<identity digest>/<workflow>-seed<k>/``, role
``provider``, ``variant-<mode>`` or ``candidate-<name>``; each run's identity holds the workflow, model identity,
components and encodings digests, contract digest, candidate identity (name, source digest), numerics mode and switches, device class and the
torch / triton / diffusers versions. A run of another identity in that folder is refused, never replaced.

Pipeline components: the embedded presets' are built (:func:`h3gate.generation.pipeline.build_components`, seed 0), a
checkpoint folder's loaded (:func:`h3gate.model.checkpoint.load_components`); kept in memory per model source. Each finished
run records the video VAE's tiling; a generation's costs (the time and peak memory of its encodings when it made
them, of its transformer calls and of its decodes, :func:`h3gate.generation.pipeline.measured`) are those of the process that
ran them, kept out of the run folder, which a resumed run repeats bitwise.

Entry points (``progress`` is a text stream for tqdm's step bars, or None for none), besides the gate protocol of
:mod:`h3gate.gates` at the end, whose items are seeds of the marker's ``contract`` (default ``generation``):

- ``freeze(model, contract, device, thresholds, variant_names=None, force_reason=None, out_dir, progress)``
  -> :class:`GenerationBounds` (written and locked);
- ``frozen_bounds(thresholds, model, contract, device)`` -> :class:`GenerationBounds`, or ``BoundsError``;
- ``check(model, candidate, contract, frozen, device, seed, out_dir, *, verify_last_step=False, progress=None,
  model_gate_override=None)`` -> ``GateResult`` of one seed: per workflow, checks ``<workflow>.same_start``
  (+ ``determinism`` when a step was verified) and the gating rule's four metrics; ``metrics["workflows"]`` holds
  every value, per-frame lists and both rules; ``context["workflows"]`` the artifacts (path, sha256) of both generations, noise digests, run folders,
  costs (encoding, decodes, transformer calls); ``context`` the contract and bounds digests and the model gate's
  pass or override;
- ``run_generation(...)`` -> :class:`Generation`, one resumable generation (also the provider cache).

``check`` raises (rather than fails) what a person must fix: :class:`h3gate.gates.passes.NotPassed`, a
``BoundsError``, a refused or damaged run folder (:class:`h3gate.generation.resume.ResumeError`); SIGTERM/SIGINT end a
generation with :class:`h3gate.generation.resume.Preempted`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from h3gate import bounds as bounds_mod, numerics
from h3gate.candidates import Candidate, CandidateError, coverage, op_invariants
from h3gate.files import FileFormatError, read_json, sha256_bytes, sha256_file, write_atomic, write_json
from h3gate.gates import ItemError, passes
from h3gate.generation import metrics, pipeline, resume
from h3gate.generation.components import release_recipe
from h3gate.generation.contract import GenerationContract
from h3gate.generation.pipeline import (
    build_components,
    COMPONENT_CONFIGS,
    generate,
    load_reference_image,
    make_pipeline,
)
from h3gate.measure import timed
from h3gate.model.identity import Model, tensor_digest
from h3gate.model.presets import RELEASE
from h3gate.verdict import Check, GateResult, Provenance

GATE = "generation"
RUN_SCHEMA = "h3gate.generation-run/2"
ENCODING_SCHEMA = "h3gate.generation-encoding/1"
COMPONENTS_SEED = 0


# Generations ------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """One finished generation of the run store: decoded arrays, artifacts and the first call's input digests."""

    role: str
    workflow: str
    seed: int
    folder: Path
    video: np.ndarray
    audio: np.ndarray
    artifacts: dict  # file name -> {"path", "sha256"}
    notes: list
    first_call_inputs: dict  # input name -> sha256
    reused: bool
    verified_step: int | None = None
    resumed_at: str | None = None  # "k/N": the step it went on from, where an earlier run stopped (None: it did not)
    costs: dict = field(default_factory=dict)  # decodes (saved with the run), transformer calls made now
    coverage: dict = field(default_factory=dict)  # replaced ops' calls over every step (:mod:`h3gate.candidates.coverage`)

    def summary(self) -> dict:
        return {
            "run_folder": str(self.folder),
            "artifacts": self.artifacts,
            "notes": self.notes,
            "reused": self.reused,
            "verified_step": self.verified_step,
            "resumed_at_step": self.resumed_at,
            "costs": self.costs,
        }


def _components_digest(components: dict) -> str:
    digest = hashlib.sha256()
    for name in sorted(components):
        value = components[name]
        if isinstance(value, torch.nn.Module):
            part = tensor_digest(value.state_dict())
        elif hasattr(value, "get_vocab"):
            part = json.dumps(value.get_vocab(), sort_keys=True)
        elif hasattr(value, "to_json_string"):
            part = value.to_json_string()
        elif hasattr(value, "config"):
            part = json.dumps(dict(value.config), sort_keys=True, default=str)
        else:
            part = repr(value)
        digest.update(f"{name}\0{part}\0".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=2)
def _components(source: str, device: str) -> tuple[dict, str]:
    """The pipeline components of a model source (everything but the transformer) with their identity: an embedded
    preset's built (seed 0) on the host, a checkpoint folder's loaded through the libraries' own loaders onto the
    host, the release preset's built on ``device`` without its text encoder (:func:`_text_encoder`), identified by
    their recipe rather than a digest of their weights."""
    if not source.startswith("preset:"):
        from h3gate.model.checkpoint import components_digest, load_components

        return load_components(source), components_digest(source)
    preset = source.split(":")[1]
    if preset == RELEASE:
        recipe = json.dumps(release_recipe(COMPONENTS_SEED, device), sort_keys=True)
        return build_components(RELEASE, COMPONENTS_SEED, device, text_encoder=False), sha256_bytes(recipe.encode())
    if preset not in COMPONENT_CONFIGS:
        raise ValueError(f"the generation gate builds the pipeline components of the presets "
                         f"{', '.join(sorted(COMPONENT_CONFIGS))} and {RELEASE}, or loads a checkpoint folder's; "
                         f"{preset!r} has none")
    components = build_components(preset, COMPONENTS_SEED)
    return components, _components_digest(components)


def _text_encoder(parts: dict, device: str):
    """The text encoder to encode with, and whether it was built for this encoding: the release preset's (47 GiB) is
    built on the device only when an encoding is missing, and dropped after it."""
    if "text_encoder" in parts:
        return parts["text_encoder"], False
    return build_components(RELEASE, COMPONENTS_SEED, device)["text_encoder"], True


def _quiet(blocks) -> None:
    """Turn off diffusers' own progress bars, nested loops included (each run draws its own bar)."""
    for block in getattr(blocks, "sub_blocks", {}).values():
        if hasattr(block, "set_progress_bar_config"):
            block.set_progress_bar_config(disable=True)
        _quiet(block)


def _contract_folder(out_dir, model: Model, contract: GenerationContract) -> Path:
    return Path(out_dir) / GATE / model.name / contract.name


def run_folder(out_dir, model: Model, contract: GenerationContract, role: str, workflow: str, seed: int,
               identity: dict) -> Path:
    """One folder per (identity, workflow, seed): a changed kernel, contract or library starts a new run beside the
    old one, which stays untouched; the identity's digest in the name keeps them apart."""
    digest = sha256_bytes(json.dumps(identity, sort_keys=True).encode())[:12]
    return _contract_folder(out_dir, model, contract) / f"{role}-{digest}" / f"{workflow}-seed{seed}"


def _role(mode: numerics.Mode, candidate: Candidate | None) -> str:
    if candidate is not None:
        return f"candidate-{candidate.name}"
    return "provider" if mode.name == numerics.PROVIDER.name else f"variant-{mode.name}"


def _versions() -> dict:
    import diffusers
    import triton

    return {"torch": torch.__version__, "triton": triton.__version__, "diffusers": diffusers.__version__}


def _identity(role, workflow, seed, model, components_digest, encodings_digest, contract, candidate, mode, device) -> dict:
    switches = {
        key: value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
        for key, value in numerics.snapshot().items()
    }
    return {
        "schema": RUN_SCHEMA,
        "role": role,
        "workflow": workflow,
        "seed": seed,
        "model": {"name": model.name, "identity": model.identity},
        "components_sha256": components_digest,
        "encodings_sha256": encodings_digest,
        "contract": {"name": contract.name, "sha256": contract.digest},
        "candidate": candidate.identity() if candidate is not None else None,
        "numerics": {"mode": mode.name, "switches": switches},
        "device_class": bounds_mod.device_class(device),
        "versions": _versions(),
    }


def _describe(inputs: dict) -> dict:
    return {"timesteps": inputs["timestep"].tolist()}


# Encodings: what the candidate does not touch, made once per contract, workflow and component identity ----------


class EncodingError(RuntimeError):
    """A cached encoding that does not match its record: names the files to delete."""


def _synchronize(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def encodings(model: Model, contract: GenerationContract, workflow: str, components: tuple[dict, str], device: str,
              out_dir) -> tuple[dict, dict]:
    """The request's encodings for ``workflow`` (:data:`h3gate.generation.pipeline.ENCODINGS`: the text encoder's prompt
    encoding, the keyframe's VAE encoding), and what making them cost.

    Cached under ``out_dir/generation/<model>/<contract>/encodings/<workflow>-<identity digest>.safetensors`` with a
    ``.json`` record of its identity and sha256 (both written atomically, the record last) and checked against that
    sha256 on every read. On a miss every workflow of the contract still missing is encoded with one text encoder,
    moved to ``device`` for the calls and back to the host after them (the release preset's built for them and
    then dropped: moved to the meta device, which frees its storage whoever still refers to it), so the
    transformer, both VAEs and the runs have the device to themselves, and a release text encoder (47 GiB) is
    built once, before any run has left blocks in the allocator's cache (on an H200, with the release transformer
    and VAEs resident, nvidia-smi showed 134.8 GiB of 139 in use for the few seconds it encoded both workflows,
    84.7 GiB after). ``prompt_embeds`` is returned on ``device``, the rest on the
    host, where diffusers' encoder blocks leave them."""
    files = {name: _encoding_files(model, contract, name, components[1], device, out_dir) for name in contract.workflows}
    missing = {name: found for name, found in files.items() if not found[1].is_file()}
    made = _encode_missing(contract, missing, components[0], device) if workflow in missing else {}
    path, record, _ = files[workflow]
    expected = read_json(record, "encoding record").get("sha256")
    if not path.is_file() or sha256_file(path) != expected:
        raise EncodingError(f"{path}: missing or its sha256 differs from {record.name} (damaged or partly copied); "
                            f"delete {path.name} and {record.name} to encode again")
    costs = ({"encoded": True, "seconds": made["seconds"][workflow], "with": sorted(made["seconds"]),
              "text_encoder_and_all_encodings": made["all"]} if made else {"encoded": False})
    return _unflatten(safetensors.torch.load_file(path), device), {**costs, "file": str(path), "sha256": expected}


def _encoding_files(model, contract, workflow, components_digest, device, out_dir) -> tuple[Path, Path, dict]:
    """(encodings file, its record, their identity) of one workflow, named by the identity's digest."""
    identity = {
        "schema": ENCODING_SCHEMA,
        "workflow": workflow,
        "contract": {"name": contract.name, "sha256": contract.digest},
        "components_sha256": components_digest,
        "device_class": bounds_mod.device_class(device),
        "versions": _versions(),
    }
    digest = sha256_bytes(json.dumps(identity, sort_keys=True).encode())[:12]
    path = _contract_folder(out_dir, model, contract) / "encodings" / f"{workflow}-{digest}.safetensors"
    return path, path.with_suffix(".json"), identity


def _encode_missing(contract: GenerationContract, missing: dict, parts: dict, device: str) -> dict:
    """Encode each workflow of ``missing`` ({workflow: (file, record, identity)}) with one text encoder, then release
    it; the seconds each took and the costs (:func:`h3gate.generation.pipeline.measured`) of the whole, text encoder included."""
    seconds = {}
    with pipeline.measured(device) as costs:
        text_encoder, built = _text_encoder(parts, device)
        text_encoder.to(device)
        parts["vae"].to(device)
        try:
            for workflow, (path, record, identity) in missing.items():
                start = time.perf_counter()
                encoded = pipeline.encode(
                    pipeline.encoder_pipeline({**parts, "text_encoder": text_encoder}), workflow=workflow,
                    prompt=contract.prompt, num_frames=contract.num_frames, height=contract.height,
                    width=contract.width, image=load_reference_image() if workflow == "fl2va" else None,
                )
                _synchronize(device)
                seconds[workflow] = time.perf_counter() - start
                data = safetensors.torch.save(_flatten(encoded))
                write_atomic(path, data)
                write_json(record, {"identity": identity, "sha256": sha256_bytes(data)})
        finally:
            # released: the device holds the transformer, both VAEs and the runs
            text_encoder.to("meta" if built else "cpu")
            del text_encoder
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    return {"seconds": seconds, "all": costs}


def _flatten(encoded: dict) -> dict[str, torch.Tensor]:
    flat = {name: encoded[name].contiguous().cpu() for name in ("prompt_embeds", "text_token_tags")}
    for index, latents in enumerate(encoded["condition_latents"] or []):
        flat[f"condition_latents.{index}"] = latents.contiguous().cpu()
    return flat


def _unflatten(tensors: dict, device: str) -> dict:
    conditions = sorted((k for k in tensors if k.startswith("condition_latents.")), key=lambda k: int(k.split(".")[1]))
    return {
        "prompt_embeds": tensors["prompt_embeds"].to(device),
        "text_token_tags": tensors["text_token_tags"],
        "condition_latents": [tensors[key] for key in conditions] or None,
    }


def _workflow(contract: GenerationContract, workflow: str | None) -> str:
    """The workflow to generate: the one given, else the contract's only one. Another, or none of a contract that
    generates several, is an :class:`ItemError` naming the option that picks one."""
    if workflow is None and len(contract.workflows) == 1:
        return contract.workflows[0]
    named = " or ".join(f"workflow={name!r}" for name in contract.workflows)
    if workflow is None:
        raise ItemError(f"{contract.path} generates {len(contract.workflows)} workflows, "
                        f"{', '.join(contract.workflows)}: pick the one to generate with {named}")
    if workflow not in contract.workflows:
        raise ItemError(f"workflow {workflow!r} is not one of {contract.path}'s workflows: pick one with {named}")
    return workflow


def run_generation(
    model: Model,
    contract: GenerationContract,
    seed: int,
    device: str,
    out_dir,
    *,
    workflow: str | None = None,
    mode: numerics.Mode = numerics.PROVIDER,
    candidate: Candidate | None = None,
    expected_first_inputs: dict | None = None,
    verify_last_step: bool = False,
    progress=None,
    lock_timeout: float = 3600.0,
    components: tuple[dict, str] | None = None,
) -> Generation:
    """The generation of ``seed`` and ``workflow`` (default: the contract's only one) by the provider (under
    ``mode``) or by ``candidate``: reused from the run store when finished with the same identity, resumed when partly
    saved, generated otherwise.

    ``expected_first_inputs`` (a reference generation's ``first_call_inputs``) stops the run at its first call if
    its inputs differ (:class:`h3gate.generation.resume.StartMismatch`). ``progress`` is the text stream of the step bar.
    ``components`` (pipeline components and their identity) replaces the model source's own.
    """
    if candidate is not None and mode.name != numerics.PROVIDER.name:
        raise ValueError(f"a candidate generates under the provider mode, not {mode.name!r}")
    if mode.fp32_weights:
        raise ValueError("the generation gate compares generations at checkpoint precision; golden is not one of them")
    if seed not in contract.seeds:
        raise ValueError(f"seed {seed} is not one of the contract's seeds {list(contract.seeds)} ({contract.path})")
    workflow = _workflow(contract, workflow)
    role = _role(mode, candidate)
    components = components or _components(model.source, device)
    encoded, encoding_costs = encodings(model, contract, workflow, components, device, out_dir)
    transformer = model.transformer.to(device)
    parts = {name: value for name, value in components[0].items() if name != "text_encoder"}
    for name in ("vae", "audio_vae"):
        parts[name].to(device)
    pipe = make_pipeline(parts, transformer, encoders=False)
    _quiet(pipe._blocks)  # the running blocks: the public ``blocks`` is a copy
    contract.check_pipeline(pipe)
    with numerics.activate(mode):  # the identity records the switches the transformer calls run under
        identity = _identity(role, workflow, seed, model, components[1], encoding_costs["sha256"], contract, candidate,
                             mode, device)
    folder = run_folder(out_dir, model, contract, role, workflow, seed, identity)
    call_seconds: list[float] = []
    call_peaks: list[int] = []  # each call's peak memory (:func:`h3gate.generation.pipeline.measured`)
    call_held: list[bool] = []  # whether the call held a first op call to the op contract (the provider's op beside it)
    call_coverage: list[dict] = []  # per call computed here, its replaced ops' counts
    described: list[dict] = []  # the info of every step saved here
    scoped = numerics.scoped(mode, numerics.runner(mode, transformer.forward))

    def call(**inputs):
        held = op_invariants.calls_held()
        with pipeline.measured(device) as costs, coverage.counting(candidate) as counts:
            outputs = scoped(**inputs)
        call_seconds.append(costs["seconds"])
        call_peaks.append(costs["peak_memory_bytes"])
        call_held.append(op_invariants.calls_held() > held)
        call_coverage.append(counts)
        return outputs

    def describe(inputs):
        """A saved step's info; its ops' counts go with it, so a reused or resumed generation still has them."""
        info = _describe(inputs) | ({"coverage": call_coverage[-1]} if call_coverage[-1] else {})
        described.append(info)
        return info

    with resume.Run(
        folder,
        identity,
        contract.transformer_calls,
        label=f"{role} {workflow} seed {seed}",
        progress=progress,
        lock_timeout=lock_timeout,
        verify_last_step=verify_last_step,
        expected_first_inputs=expected_first_inputs,
    ) as run:
        reused = run.finished is not None
        decodes: dict = {}  # measured in this process; kept out of the run folder, which a resume repeats bitwise
        if not reused or verify_last_step:
            installed = candidate.installed(transformer) if candidate is not None else contextlib.nullcontext()
            with installed, run.intercept(transformer, call, describe), pipeline.decode_costs(pipe) as decodes:
                video, audio = generate(
                    pipe,
                    workflow=workflow,
                    prompt=contract.prompt,
                    seed=seed,
                    num_frames=contract.num_frames,
                    height=contract.height,
                    width=contract.width,
                    num_inference_steps=contract.num_inference_steps,
                    image=load_reference_image() if workflow == "fl2va" else None,
                    encodings=encoded,
                )
        if not reused:
            _require_finite(video, audio, role, CandidateError if candidate is not None else ValueError)
            written, notes = metrics.write_artifacts(folder, video, audio, contract.fps, contract.audio_sample_rate)
            run.finish({name: artifact["sha256"] for name, artifact in written.items()},
                       {"notes": notes, "tiling": _tiling(pipe.vae)})
        video, audio = metrics.read_arrays(folder / metrics.ARRAYS_FILE)
        return Generation(
            role=role,
            workflow=workflow,
            seed=seed,
            folder=folder,
            video=video,
            audio=audio,
            artifacts={name: {"path": str(folder / name), "sha256": sha} for name, sha in run.finished["artifacts"].items()},
            notes=list(run.finished.get("notes", [])),
            first_call_inputs=run.first_call_inputs,
            reused=reused,
            verified_step=run.verified_step,
            resumed_at=run.resumed_at,
            costs={
                "encoding": encoding_costs,
                "decode": decodes,
                "vae_tiling": run.finished.get("tiling"),
                "transformer_call_seconds": call_seconds,
                **_call_peaks(call_peaks, call_held),
            },
            coverage=coverage.total(*(info.get("coverage", {}) for info in
                                      [*(sidecar["info"] for sidecar in run.saved), *described])),
        )


def _call_peaks(peaks: list[int], held: list[bool]) -> dict:
    """The transformer calls' peak memory: the highest of the calls that held no op to the op contract (the
    candidate's own; None where every call of this process did), and of those that did, apart: such a call also
    copies an op's inputs and runs the provider's op beside it (:mod:`h3gate.candidates.op_invariants`), memory the
    candidate does not use: a release block's forward+backward peaks at 13.8 GiB on such a call, 10.1 on later ones.
    On CPU every peak is the process's whole run (:func:`h3gate.generation.pipeline.measured`)."""
    return {
        "transformer_call_peak_memory_bytes": max((p for p, h in zip(peaks, held) if not h), default=None),
        "contract_held_call_peak_memory_bytes": max((p for p, h in zip(peaks, held) if h), default=None),
        "transformer_calls_contract_held": [index for index, h in enumerate(held) if h],
    }


def _tiling(vae) -> dict:
    """The video VAE's tiling as the decode ran it (diffusers' ``enable_tiling`` settings)."""
    return {"use_tiling": vae.use_tiling, "use_slicing": vae.use_slicing,
            "tile_sample_min": [vae.tile_sample_min_height, vae.tile_sample_min_width],
            "tile_sample_min_overlap": [vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width]}


def _require_finite(video: np.ndarray, audio: np.ndarray, role: str, error) -> None:
    for name, array in (("video", video), ("audio", audio)):
        bad = int((~np.isfinite(array)).sum())
        if bad:
            raise error(f"{role} generated {bad} non-finite {name} values of {array.size}; run the model gate to find the op")


# Calibrated bounds ------------------------------------------------------------------------------------


class GenerationBounds(bounds_mod.Bounds):
    """Frozen calibrated bounds of the generation gate: the bounds file format, with this gate's rule."""

    @property
    def non_discriminating(self) -> list[str]:
        """Bounds no generation can violate (:meth:`h3gate.generation.metrics.Metric.discriminates`)."""
        return sorted(metric for metric, bound in self.bounds.items() if not metrics.METRIC[metric].discriminates(bound))

    def to_json(self) -> dict:
        data = super().to_json()
        data["rule"] = {
            "metric": "the variant's generation against the provider's generation of the same seed",
            "bound": metrics.calibration_rule(),
            "margin": self.provenance["calibration_margin"],
        }
        return data


def freeze(
    model: Model,
    contract: GenerationContract,
    device: str,
    thresholds: Path,
    variant_names: list[str] | None = None,
    force_reason: str | None = None,
    out_dir="h3-out",
    progress=None,
) -> GenerationBounds:
    """Generate every workflow and seed with the provider and each variant, freeze the calibrated bounds (the worst
over all of them) and lock them."""
    device_class = bounds_mod.device_class(device)
    path = bounds_mod.bounds_path(thresholds, model.name, device_class, contract.name)
    bounds_mod.refuse_overwrite(path, force_reason)  # before minutes of generating, not after
    names = list(variant_names) if variant_names is not None else [mode.name for mode in numerics.variants(device)]
    if not names:
        raise bounds_mod.BoundsError("calibrating generation bounds needs at least one provider variant")
    modes = [numerics.get(name, device) for name in names]
    timings: dict[str, float] = {}
    runs = [(workflow, seed) for seed in contract.seeds for workflow in contract.workflows]
    measured: dict[str, dict[str, dict]] = {name: {} for name in names}
    digests: dict[str, dict[str, str]] = {source: {} for source in ["provider", *names]}
    for workflow, seed in runs:
        key = f"{workflow}.seed{seed}"
        with timed(timings, "provider"):
            reference = run_generation(model, contract, seed, device, out_dir, workflow=workflow, progress=progress)
        digests["provider"][key] = reference.artifacts[metrics.ARRAYS_FILE]["sha256"]
        for mode in modes:
            with timed(timings, mode.name):
                generated = run_generation(
                    model, contract, seed, device, out_dir, workflow=workflow, mode=mode,
                    expected_first_inputs=reference.first_call_inputs, progress=progress,
                )
            digests[mode.name][key] = generated.artifacts[metrics.ARRAYS_FILE]["sha256"]
            measured[mode.name][key] = metrics.compare(generated.video, generated.audio, reference.video, reference.audio)
    kept: list[str] = []
    dropped: dict[str, str] = {}
    for name in names:
        twin = next((source for source in ["provider", *kept] if digests[source] == digests[name]), None)
        if twin is None:
            kept.append(name)
        else:
            dropped[name] = twin
    if not kept:
        raise bounds_mod.BoundsError(
            f"no variant of {names} changed the generation of any seed (each equals the provider's bitwise): the "
            "calibrated rule would demand bitwise equality; calibrate with variants that change the arithmetic "
            f"(here: {', '.join(mode.name for mode in numerics.variants(device))})"
        )
    table, providers = {}, []
    for metric in metrics.METRICS:
        worst, source = metric.worst((values[metric.name], name) for name in kept for values in measured[name].values())
        if worst == metric.identical:
            raise bounds_mod.BoundsError(f"no variant of {kept} changed {metric.name} on any seed; the calibrated bound "
                                         "would demand bitwise equality")
        table[metric.name] = metric.widen(worst, contract.calibration_margin)
        if source not in providers:
            providers.append(source)
    frozen = GenerationBounds(
        gate=contract.name,
        model_identity=model.identity,
        device_class=device_class,
        bounds=table,
        errors={name: {f"{key}.{m}": values[m] for key, values in measured[name].items() for m in metrics.GATED}
                for name in kept},
        sources=names,
        providers=providers,
        duplicates_dropped=dropped,
        provenance=bounds_mod.provenance(
            {
                "model_source": model.source,
                "contract": contract.to_json(),
                "contract_sha256": contract.digest,
                "calibration_margin": contract.calibration_margin,
                "generations_sha256": digests,
                "timings_s": timings,
            }
        ),
    )
    bounds_mod.save(frozen, path, thresholds, force_reason)
    return frozen


def frozen_bounds(thresholds: Path, model: Model, contract: GenerationContract, device: str) -> GenerationBounds:
    """The frozen calibrated bounds for this model, contract and device, or a :class:`h3gate.bounds.BoundsError`."""
    device_class = bounds_mod.device_class(device)
    path = bounds_mod.bounds_path(thresholds, model.name, device_class, contract.name)
    loaded = bounds_mod.load(path, contract.name, model.identity, device_class)
    _require_measured_as(loaded, contract)
    if set(loaded.bounds) != set(metrics.GATED):
        raise FileFormatError(path, f"bounds must be exactly {list(metrics.GATED)}, found {sorted(loaded.bounds)}")
    return GenerationBounds(**{f.name: getattr(loaded, f.name) for f in fields(loaded)})


def _require_measured_as(frozen: bounds_mod.Bounds, contract: GenerationContract) -> None:
    """Bounds are valid for the generations and calibration they measured: a contract that changed only its gating
    policy keeps them (the provenance records the contract as frozen)."""
    if not contract.measures_as(frozen.provenance.get("contract", {})):
        raise bounds_mod.BoundsError(
            f"{frozen.path} was frozen for another contract than {contract.path} (sha256 {contract.digest[:12]}): "
            "they differ beyond the gating rule and fixed bounds; freeze the generation bounds again"
        )


# The check --------------------------------------------------------------------------------------------


def _evaluate(values: dict, bounds: dict, rule: str, workflow: str, seed: int, qualified: bool) -> list[Check]:
    """One check per gated metric; ``qualified`` names the rule in the check's name (both rules gate)."""
    checks = []
    for metric in metrics.METRICS:
        value, bound = values[metric.name], bounds[metric.name]
        passed = metric.passes(value, bound)
        name = f"{workflow}.{rule}.{metric.name}" if qualified else f"{workflow}.{metric.name}"
        checks.append(Check(name, f"{rule} rule", value, bound, passed,
                            {"workflow": workflow, "seed": seed}, metric.direction))
    return checks


def check(
    model: Model,
    candidate: Candidate,
    contract: GenerationContract,
    frozen: bounds_mod.Bounds,
    device: str,
    seed: int,
    out_dir,
    *,
    verify_last_step: bool = False,
    progress=None,
    model_gate_override: str | None = None,
) -> GateResult:
    """Qualify ``candidate``'s generations of ``seed`` (one per workflow of the contract) against the provider's,
    under frozen bounds. Checks are named ``<workflow>.<check>``; ``context["workflows"]`` and
    ``metrics["workflows"]`` hold each workflow's runs and values."""
    model_gate = passes.require_pass(out_dir, "model", model, candidate.identity(), model_gate_override)
    _require_measured_as(frozen, contract)
    timings: dict[str, float] = {}
    provenance = Provenance.of(frozen, model, candidate, frozen.device_class)
    context = {
        "contract": str(contract.path),
        "contract_sha256": contract.digest,
        "gating_rule": contract.gating_rule,
        "model_gate": model_gate,
        "workflows": {},
    }
    report = {"gating_rule": contract.gating_rule, "workflows": {}}
    checks = []
    for workflow in contract.workflows:
        found, context["workflows"][workflow], values = _check_workflow(
            model, candidate, contract, frozen, device, workflow, seed, out_dir, timings,
            verify_last_step=verify_last_step, progress=progress)
        checks += found
        if values is not None:
            report["workflows"][workflow] = values
    counts = coverage.total(*(ran.get("coverage", {}) for ran in context["workflows"].values()))
    return coverage.judged(GateResult(GATE, {"seed": seed}, checks, context, report, timings, provenance), counts)


def _check_workflow(model, candidate, contract, frozen, device, workflow, seed, out_dir, timings, *, verify_last_step,
                    progress) -> tuple[list[Check], dict, dict | None]:
    """(checks, context, metrics or None when no metric was measured) of one workflow of the seed."""
    with timed(timings, f"{workflow}.provider"):
        reference = run_generation(model, contract, seed, device, out_dir, workflow=workflow, progress=progress)
    context = {"provider": reference.summary()}
    try:
        with timed(timings, f"{workflow}.candidate"):
            generated = run_generation(
                model, contract, seed, device, out_dir, workflow=workflow, candidate=candidate,
                expected_first_inputs=reference.first_call_inputs, verify_last_step=verify_last_step,
                progress=progress,
            )
    except resume.StartMismatch as error:
        context["noise_digests"] = {"provider": error.expected, "candidate": error.found}
        return [Check.failed(f"{workflow}.same_start", "same_start", str(error))], context, None
    except resume.Nondeterministic as error:  # raised after the run checked its first call against the provider's
        context["noise_digests"] = {"provider": reference.first_call_inputs, "candidate": reference.first_call_inputs}
        checks = [
            _same_start_passed(workflow),
            Check.failed(f"{workflow}.determinism", "determinism", str(error), value=error.max_abs, step=error.step),
        ]
        return checks, context, None
    context["candidate_run"] = generated.summary()
    if generated.coverage:
        context["coverage"] = generated.coverage
    context["noise_digests"] = {"provider": reference.first_call_inputs, "candidate": generated.first_call_inputs}
    context["artifacts"] = {"provider": reference.artifacts, "candidate": generated.artifacts}
    mismatch = resume.start_mismatch(reference.first_call_inputs, generated.first_call_inputs)
    if mismatch is not None:  # a reused candidate run made against another provider generation
        return [Check.failed(f"{workflow}.same_start", "same_start", str(mismatch))], context, None
    checks = [_same_start_passed(workflow)]
    if generated.verified_step is not None:
        checks.append(Check(f"{workflow}.determinism", "determinism", 0.0, 0.0, True,
                            {"verified_step": generated.verified_step}))
    with timed(timings, f"{workflow}.metrics"):
        values = metrics.compare(generated.video, generated.audio, reference.video, reference.audio)
    rules = {"fixed": contract.fixed_bounds, "calibrated": frozen.bounds}
    qualified = len(contract.gating_rules) > 1
    evaluated = {rule: _evaluate(values, bounds, rule, workflow, seed, qualified) for rule, bounds in rules.items()}
    checks += [check for rule in contract.gating_rules for check in evaluated[rule]]
    report = {
        "values": {key: value for key, value in values.items() if key != "per_frame"},
        "per_frame": values["per_frame"],
        "rules": {
            rule: {c.name: {"value": c.value, "bound": c.bound, "passed": c.passed, "margin": c.margin} for c in found}
            for rule, found in evaluated.items()
        },
    }
    return checks, context, report


def _same_start_passed(workflow: str) -> Check:
    return Check(f"{workflow}.same_start", "same_start", 0.0, 0.0, True,
                 {"reason": "first call's inputs equal the provider's bitwise"})


# The gate protocol (:mod:`h3gate.gates`) ------------------------------------------------------------------


def contract_of(run) -> GenerationContract:
    """The item's contract: ``thresholds/<model>/<contract>-contract.json``, ``contract=`` of the marker (default
    ``generation``). Read first by every item, so a missing contract or a seed it does not list fails before a model
    is built: the first with the contracts that exist and the command that writes the defaults, the second as an
    :class:`ItemError` naming the seeds to mark."""
    from h3gate.generation import contract as generation_contract

    name = run.options.get("contract", GATE)
    path = Path(run.thresholds) / run.model_name / f"{name}{generation_contract.SUFFIX}"
    if not path.is_file():
        names = sorted(found.name.removesuffix(generation_contract.SUFFIX)
                       for found in path.parent.glob(f"*{generation_contract.SUFFIX}"))
        present = ", ".join(other for other in names if other != "model") or "none"  # model: the model gate's contract
        raise FileFormatError(path, f"no generation contract {name!r} for {run.model_name} (there: {present}); "
                                    "mark the test with one of those (contract=...), or write the default contracts "
                                    f"with `{run.contracts_command()}`")
    contract = generation_contract.load(path)
    seed = run.params.get("seed")
    if seed is not None and seed not in contract.seeds:
        raise ItemError(f"seed {seed} is not among {path}'s seeds {list(contract.seeds)}: mark the test with those "
                        f"(seeds={list(contract.seeds)}) or another contract")
    return contract


def items(run) -> list[dict]:
    return [{"seed": seed} for seed in contract_of(run).seeds]


def bounds_file(run) -> Path:
    return bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, contract_of(run).name)


def load_bounds(run) -> GenerationBounds:
    return frozen_bounds(run.thresholds, run.model, contract_of(run), run.device)


def freeze_item(run) -> GenerationBounds:
    """Every seed of the contract: the calibrated bounds are the worst over all of them."""
    return freeze(run.model, contract_of(run), run.device, run.thresholds, run.variant_names, run.force_reason,
                  run.out, progress=run.stream)


def check_item(run, frozen: GenerationBounds) -> GateResult:
    try:
        return check(run.model, run.candidate, contract_of(run), frozen, run.device, run.params["seed"], run.out,
                     verify_last_step=run.verify_last_step, progress=run.stream,
                     model_gate_override=run.required_override)
    except passes.NotPassed as error:
        return GateResult(GATE, run.params, [Check.failed("model_gate", "not passed", str(error))])
