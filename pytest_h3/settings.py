"""Every pytest-h3 setting checked when the session starts, before any item runs: a typo in a setting must not cost
a whole run of gates and leave no evidence. Each failure is one line naming the option and the fix, raised as
pytest's usage error (exit code 4). The checks import nothing heavy: torch only to count the GPUs of a GPU run
under xdist that leaves CUDA_VISIBLE_DEVICES unset or to list the provider variants of a freezing session that names
some (which imports the engine anyway), and cryptography only to read a signing key that was given.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h3gate.evidence.profiles import PROFILES as _PROFILES

PROFILES = tuple(_PROFILES)  # h3gate.evidence.profiles imports nothing heavy


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


def validate(config):
    """Check the session's settings; returns the signing key (or None: the evidence will be unsigned)."""
    out = Path(config.getoption("--h3-out"))
    problem = _writable_folder(out)
    if problem:
        raise pytest.UsageError(f"--h3-out={out} {problem}: give a folder the results and evidence can be written to")
    thresholds = config.getoption("--h3-thresholds")
    if thresholds is not None and not Path(thresholds).is_dir():
        raise pytest.UsageError(f"--h3-thresholds={thresholds} is not a folder: give the folder holding LOCK.json "
                                "(default: <rootdir>/thresholds)")
    _check_model(config.getoption("--h3-model"))
    _check_candidate(config.getoption("--h3-candidate"))
    from pytest_h3.distribution import check_workers, parse_shard

    shard = config.getoption("--h3-shard")
    if shard:
        parse_shard(shard)
    check_workers(config.getoption("--h3-device"), config.getoption("--h3-workers-per-gpu"),
                  getattr(config.option, "numprocesses", None))
    examples = config.getoption("--h3-kernel-examples")
    if examples < 1:
        raise pytest.UsageError(f"--h3-kernel-examples={examples}: give at least 1 (default: 8)")
    variants = config.getoption("--h3-variants")
    if variants:
        _check_variants(variants, config.getoption("--h3-device"))
    return _signing_key(config.getoption("--h3-sign-key"))


def _check_model(spec: str) -> None:
    """An embedded model's name or a folder holding a transformer config; its weights are checked when the model
    loads (a folder without even a config would otherwise fail the first item, leaving empty results behind)."""
    from h3gate.model.presets import PRESETS, RELEASE
    from h3gate.model.spec import not_a_checkpoint

    if spec in (*PRESETS, RELEASE):
        return
    if not Path(spec).is_dir():
        raise pytest.UsageError(f"--h3-model={spec} is neither an embedded model ({', '.join((*PRESETS, RELEASE))}) "
                                "nor a checkpoint folder: give one of those, or the folder's path")
    problem = not_a_checkpoint(Path(spec))
    if problem:
        raise pytest.UsageError(f"--h3-model={problem}")


def _check_candidate(spec: str) -> None:
    """The candidate's name must be installed. A candidate given with options is built here, so a bad option is the
    run's first and only line (raised later, pytest would print its header and collection first); a bare name is
    built before the first gate, and a session without gates never imports its kernels."""
    from h3gate.candidates import CandidateError, available, load, parse_spec

    try:
        name, options = parse_spec(spec)
    except CandidateError as error:
        raise pytest.UsageError(f"--h3-candidate={spec}: {error}") from None
    names = available()
    if name not in names:
        raise pytest.UsageError(f"--h3-candidate={spec}: no candidate {name!r} is installed; installed: "
                                f"{', '.join(sorted(names))} (`h3gate candidates` lists them)")
    if options:
        try:
            load(spec)
        except CandidateError as error:
            raise pytest.UsageError(f"--h3-candidate={spec}: {error}") from None


def _check_variants(spec: str, device_option: str) -> None:
    """Each name must be a provider variant of the device the gates run on: otherwise every freeze item fails on it.
    Golden and the provider are no variants: calibrating from them would measure no spread of legitimate arithmetic."""
    from h3gate import numerics
    from pytest_h3.session import H3Session

    device = H3Session.resolve_device(device_option)
    valid = [mode.name for mode in numerics.variants(device)]
    unknown = [name for name in spec.split(",") if name not in valid]
    if unknown:
        raise pytest.UsageError(f"--h3-variants={spec}: {', '.join(map(repr, unknown))} not among the provider "
                                f"variants on {numerics.device_type(device)}; give a comma-separated list of "
                                f"{', '.join(valid)} (`h3gate variants` lists them)")


def _signing_key(path):
    if path is None and not os.environ.get("H3GATE_SIGN_KEY"):  # h3gate.evidence.signing.KEY_ENV, read without cryptography
        return None
    from h3gate.evidence.signing import KEY_ENV, SigningKeyError, load_private_key

    try:
        return load_private_key(path)
    except SigningKeyError as error:
        option = f"--h3-sign-key={path}" if path is not None else KEY_ENV
        raise pytest.UsageError(f"{option}: {error}") from None
