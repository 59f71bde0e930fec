"""The session's settings: every pytest-h3 option read once, at configure time, into one :class:`Settings`, and checked
once (by the controller; its xdist workers inherit good settings) before any item runs: a typo in a setting must not
cost a whole run of gates and leave no evidence. Each failure is one line naming the option and the fix, raised as
pytest's usage error (exit code 4). The checks import nothing heavy: torch only to count the GPUs of a GPU run
under xdist that leaves CUDA_VISIBLE_DEVICES unset or to list the provider variants of a freezing session that names
some (which imports the engine anyway), and cryptography only to read a signing key that was given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_h3 import distribution
from pytest_h3.options import (
    CANDIDATE,
    DEVICE,
    FREEZE,
    FREEZE_FORCE,
    KERNEL_EXAMPLES,
    MODEL,
    MODEL_SEED,
    OUT,
    PROFILE,
    SHARD,
    SIGN_KEY,
    SKIP_MODEL_GATE,
    THRESHOLDS,
    VARIANTS,
    VERIFY_LAST_STEP,
    WORKERS_PER_GPU,
)


@dataclass(frozen=True)
class Settings:
    """The options as given (a spec, not yet a built model or candidate), plus the thresholds folder they name."""

    model: str
    model_seed: int
    candidate: str
    device: str  # the option: cpu, cuda, cuda:N or auto (the session resolves it on first use)
    out: Path
    thresholds_option: str | None  # as given: the commands the plugin prints repeat it so
    thresholds: Path  # the folder: the option's, else <rootdir>/thresholds
    freeze: bool
    freeze_force: str | None
    variants: str | None  # comma-separated provider variants, as given
    verify_last_step: bool
    skip_model_gate: str | None
    kernel_examples: int
    sign_key: str | None  # a PEM file's path
    profile: str
    workers_per_gpu: int
    shard: str | None

    @classmethod
    def read(cls, config) -> Settings:
        option = config.getoption
        thresholds = option(THRESHOLDS)
        return cls(
            model=option(MODEL),
            model_seed=option(MODEL_SEED),
            candidate=option(CANDIDATE),
            device=option(DEVICE),
            out=Path(option(OUT)),
            thresholds_option=thresholds,
            thresholds=Path(thresholds) if thresholds else Path(config.rootpath) / "thresholds",
            freeze=bool(option(FREEZE)),
            freeze_force=option(FREEZE_FORCE),
            variants=option(VARIANTS),
            verify_last_step=option(VERIFY_LAST_STEP),
            skip_model_gate=option(SKIP_MODEL_GATE),
            kernel_examples=option(KERNEL_EXAMPLES),
            sign_key=option(SIGN_KEY),
            profile=option(PROFILE),
            workers_per_gpu=option(WORKERS_PER_GPU),
            shard=option(SHARD),
        )

    @property
    def variant_names(self) -> list[str] | None:
        return self.variants.split(",") if self.variants else None


def _writable_folder(path: Path) -> str | None:
    """Why ``path`` cannot be the output folder, or None: it must be a folder, or creatable in a writable one."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a folder"
        return None if os.access(path, os.W_OK | os.X_OK) else "is not writable"
    parent = next((p for p in path.absolute().parents if p.exists()), None)
    if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be created ({parent} is not a writable folder)"
    return None


def validate(settings: Settings, workers) -> object:
    """Check the session's settings (``workers``: xdist's ``-n``); returns the signing key (or None: the evidence will
    be unsigned)."""
    problem = _writable_folder(settings.out)
    if problem:
        raise pytest.UsageError(f"{OUT}={settings.out} {problem}: give a folder the results and evidence can be "
                                "written to")
    if settings.thresholds_option is not None and not Path(settings.thresholds_option).is_dir():
        raise pytest.UsageError(f"{THRESHOLDS}={settings.thresholds_option} is not a folder: give the folder holding "
                                "LOCK.json (default: <rootdir>/thresholds)")
    _check_model(settings.model)
    _check_candidate(settings.candidate)
    if settings.shard:
        distribution.parse_shard(settings.shard)
    distribution.check_workers(settings.device, settings.workers_per_gpu, workers)
    if settings.kernel_examples < 1:
        raise pytest.UsageError(f"{KERNEL_EXAMPLES}={settings.kernel_examples}: give at least 1 (default: 8)")
    if settings.variants:
        _check_variants(settings.variants, settings.device)
    return _signing_key(settings.sign_key)


def _check_model(spec: str) -> None:
    """An embedded model's name or a folder holding a transformer config; its weights are checked when the model
    loads (a folder without even a config would otherwise fail the first item, leaving empty results behind)."""
    from h3gate.model.presets import PRESETS, RELEASE
    from h3gate.model.spec import not_a_checkpoint

    if spec in (*PRESETS, RELEASE):
        return
    if not Path(spec).is_dir():
        raise pytest.UsageError(f"{MODEL}={spec} is neither an embedded model ({', '.join((*PRESETS, RELEASE))}) "
                                "nor a checkpoint folder: give one of those, or the folder's path")
    problem = not_a_checkpoint(Path(spec))
    if problem:
        raise pytest.UsageError(f"{MODEL}={problem}")


def _check_candidate(spec: str) -> None:
    """The candidate's name must be installed. A candidate given with options is built here, so a bad option is the
    run's first and only line (raised later, pytest would print its header and collection first); a bare name is
    built before the first gate, and a session without gates never imports its kernels."""
    from h3gate.candidates import CandidateError, available, load, parse_spec

    try:
        name, options = parse_spec(spec)
    except CandidateError as error:
        raise pytest.UsageError(f"{CANDIDATE}={spec}: {error}") from None
    names = available()
    if name not in names:
        raise pytest.UsageError(f"{CANDIDATE}={spec}: no candidate {name!r} is installed; installed: "
                                f"{', '.join(sorted(names))} (`h3gate candidates` lists them)")
    if options:
        try:
            load(spec)
        except CandidateError as error:
            raise pytest.UsageError(f"{CANDIDATE}={spec}: {error}") from None


def _check_variants(spec: str, device_option: str) -> None:
    """Each name must be a provider variant of the device the gates run on: otherwise every freeze item fails on it.
    Golden and the provider are no variants: calibrating from them would measure no spread of legitimate arithmetic."""
    from h3gate import numerics

    device = distribution.resolve_device(device_option)
    valid = [mode.name for mode in numerics.variants(device)]
    unknown = [name for name in spec.split(",") if name not in valid]
    if unknown:
        raise pytest.UsageError(f"{VARIANTS}={spec}: {', '.join(map(repr, unknown))} not among the provider "
                                f"variants on {numerics.device_type(device)}; give a comma-separated list of "
                                f"{', '.join(valid)} (`h3gate variants` lists them)")


def _signing_key(path):
    if path is None and not os.environ.get("H3GATE_SIGN_KEY"):  # h3gate.evidence.signing.KEY_ENV, read without cryptography
        return None
    from h3gate.evidence.signing import KEY_ENV, SigningKeyError, load_private_key

    try:
        return load_private_key(path)
    except SigningKeyError as error:
        option = f"{SIGN_KEY}={path}" if path is not None else KEY_ENV
        raise pytest.UsageError(f"{option}: {error}") from None
