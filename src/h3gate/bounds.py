"""Bounds: the ensemble rule, frozen bounds files, and the lock that pins every file under ``thresholds/``.

Ensemble rule (per tap): ``bound = 1.5 x max over provider configurations of relative_l2(config, golden) +
floor`` with floors 1e-3 for forward taps and 5e-3 for gradients. Every configuration offered is recorded
(``sources``); one whose whole error table equals an earlier one's exactly adds nothing and is dropped
(``duplicates_dropped``); the configurations that set at least one bound are ``providers``. A bound >= 1
cannot tell a broken tensor from a good one and is reported as non-discriminating.

Bounds are frozen before any candidate is measured and never recomputed by a gate run. The lock
(``thresholds/LOCK.json``) holds the sha256 of every bounds and contract file; a file that does not match
its lock entry, or is not in the lock, is refused, so a quiet edit of a bound cannot pass as frozen.
"""

from __future__ import annotations

import datetime
import math
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

from h3gate.files import FileFormatError, dumps, read_json, require, sha256_file, write_atomic

SCHEMA = "h3gate.bounds/1"
LOCK_NAME = "LOCK.json"
LOCK_SCHEMA = "h3gate.lock/1"
MULTIPLIER = 1.5
FLOORS = {"forward": 1e-3, "gradient": 5e-3}


class BoundsError(Exception):
    """Bounds that cannot be used: missing, tampered, for another model or device. The message says what to do;
    ``path``, where known, is the bounds file whose freeze mends it (which need not be the failing item's own: the
    power gate reads every gate's)."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


def tap_kind(tap: str) -> str:
    return "gradient" if tap.endswith(".grad") or tap.startswith("input_gradients.") else "forward"


def device_class(device) -> str:
    """``cpu`` or ``cuda-<gpu name>``: bounds hold only for the arithmetic of one kind of device."""
    if str(device) == "cpu":
        return "cpu"  # without importing torch: the session header asks before any gate runs
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return device.type


@dataclass
class Bounds:
    gate: str
    model_identity: str
    device_class: str
    bounds: dict[str, float]
    errors: dict[str, dict[str, float]]  # kept source -> tap -> relative_l2 to golden
    sources: list[str]
    providers: list[str]
    duplicates_dropped: dict[str, str]  # dropped source -> the earlier source it equals
    provenance: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def non_discriminating(self) -> list[str]:
        return sorted(tap for tap, bound in self.bounds.items() if bound >= 1.0)

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "gate": self.gate,
            "model_identity": self.model_identity,
            "device_class": self.device_class,
            "rule": {"multiplier": MULTIPLIER, "floors": FLOORS, "metric": "relative_l2 to golden"},
            "bounds": self.bounds,
            "errors": self.errors,
            "sources": self.sources,
            "providers": self.providers,
            "duplicates_dropped": self.duplicates_dropped,
            "non_discriminating": self.non_discriminating,
            "provenance": self.provenance,
        }


def ensemble(errors_by_source: dict[str, dict[str, float]]) -> tuple[dict, dict, list, dict]:
    """(bounds, kept errors, providers, duplicates_dropped) from each configuration's error table."""
    if not errors_by_source:
        raise BoundsError("the ensemble rule needs at least one provider configuration")
    kept: dict[str, dict[str, float]] = {}
    dropped: dict[str, str] = {}
    for source, table in errors_by_source.items():
        twin = next((name for name, other in kept.items() if other == table), None)
        if twin is None:
            kept[source] = table
        else:
            dropped[source] = twin
    taps = list(next(iter(kept.values())))
    for source, table in kept.items():
        if list(table) != taps:
            raise BoundsError(f"configuration {source} recorded other taps than {next(iter(kept))}")
    bounds, providers = {}, []
    for tap in taps:
        worst_source = max(kept, key=lambda source: kept[source][tap])
        worst = kept[worst_source][tap]
        if not math.isfinite(worst):
            raise BoundsError(f"provider configuration {worst_source} has a non-finite error on {tap}")
        bounds[tap] = MULTIPLIER * worst + FLOORS[tap_kind(tap)]
        if worst > 0 and worst_source not in providers:
            providers.append(worst_source)
    return bounds, kept, providers, dropped


def frozen_by_ensemble(gate: str, model, device_class: str, errors: dict[str, dict[str, float]], extra: dict) -> "Bounds":
    """Bounds of ``gate`` by the ensemble rule from each configuration's error table (in the order offered)."""
    table, kept, providers, dropped = ensemble(errors)
    return Bounds(
        gate=gate,
        model_identity=model.identity,
        device_class=device_class,
        bounds=table,
        errors=kept,
        sources=list(errors),
        providers=providers,
        duplicates_dropped=dropped,
        provenance=provenance({"model_source": model.source, **extra}),
    )


def provenance(extra: dict | None = None) -> dict:
    import diffusers
    import torch
    import triton

    return {
        "frozen_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        **(extra or {}),
    }


def bounds_path(thresholds: Path, model_name: str, device: str, gate: str) -> Path:
    return Path(thresholds) / model_name / device / f"{gate}-bounds.json"


def load(path: Path, gate: str, model_identity: str, device: str) -> Bounds:
    """Frozen bounds for this gate, model identity and device class, or a :class:`BoundsError` saying why not."""
    path = Path(path)
    if not path.is_file():
        raise BoundsError(f"no frozen {gate} bounds at {path}", path)
    data = read_json(path, "bounds file")
    if data.get("schema") != SCHEMA:
        raise FileFormatError(path, f"schema is {data.get('schema')!r}, expected {SCHEMA!r}")
    for key, expected in (("gate", gate), ("model_identity", model_identity), ("device_class", device)):
        found = require(path, data, key, str, "bounds file")
        if found != expected:
            raise BoundsError(f"{path} holds bounds for {key} {found!r}, this run needs {expected!r}", path)
    table = require(path, data, "bounds", dict, "bounds file")
    for tap, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise FileFormatError(path, f"bound of {tap} must be a positive finite number, found {value!r}; "
                                  "freeze the bounds again (pytest -m gate --h3-freeze)")
    return Bounds(
        gate=gate,
        model_identity=model_identity,
        device_class=device,
        bounds={tap: float(value) for tap, value in table.items()},
        errors=require(path, data, "errors", dict, "bounds file"),
        sources=require(path, data, "sources", list, "bounds file"),
        providers=require(path, data, "providers", list, "bounds file"),
        duplicates_dropped=require(path, data, "duplicates_dropped", dict, "bounds file"),
        provenance=require(path, data, "provenance", dict, "bounds file"),
        path=path,
    )


# The lock ---------------------------------------------------------------------------------------------


def _lock_path(thresholds: Path) -> Path:
    return Path(thresholds) / LOCK_NAME


LOCKED_PATTERNS = ("*.json", "*-capture.safetensors")
"""What the lock pins: bounds and contracts, and the block gate's captures frozen beside their bounds."""


def _locked_files(thresholds: Path) -> list[Path]:
    """Every file the lock must pin: all but the lock itself and the record of the gate suite (which names the tests
    that freeze these files, and measures nothing)."""
    from h3gate.suite import RECORD

    found = {p for pattern in LOCKED_PATTERNS for p in Path(thresholds).rglob(pattern)}
    return sorted(p for p in found if p.name != LOCK_NAME and p != Path(thresholds) / RECORD)


def _may_be_absent(relative: str) -> bool:
    """A capture may live outside version control (0.8 GB a block at release size): the gate item that needs it
    names it when it is missing, with the command that makes it; any other locked file must be present."""
    return relative.endswith("-capture.safetensors")


def read_lock(thresholds: Path) -> dict[str, str]:
    path = _lock_path(thresholds)
    if not path.is_file():
        return {}
    data = read_json(path, "thresholds lock")
    if data.get("schema") != LOCK_SCHEMA:
        raise FileFormatError(path, f"schema is {data.get('schema')!r}, expected {LOCK_SCHEMA!r}")
    files = require(path, data, "files", dict, "thresholds lock")
    if not all(isinstance(v, str) for v in files.values()):
        raise FileFormatError(path, "every lock entry must be a sha256 hex string")
    return files


def verify_lock(thresholds: Path) -> dict[str, str]:
    """The lock's entries, after checking every file under ``thresholds`` against them."""
    thresholds = Path(thresholds)
    lock = read_lock(thresholds)
    problems = []
    present = set()
    for path in _locked_files(thresholds):
        relative = path.relative_to(thresholds).as_posix()
        present.add(relative)
        if relative not in lock:
            how = f"lock it with `h3gate lock {path}`" if path.name.endswith("-contract.json") else "freeze it with --h3-freeze"
            problems.append(f"{path} is not in {LOCK_NAME}: {how} instead of adding it by hand")
        elif sha256_file(path) != lock[relative]:
            problems.append(
                f"{path} does not match its digest in {_lock_path(thresholds)} (edited after it was frozen): restore it "
                "from version control, or re-freeze with --h3-freeze --h3-freeze-force=REASON"
            )
    for relative in sorted(set(lock) - present):
        if _may_be_absent(relative):
            continue
        problems.append(f"{thresholds / relative} is in {LOCK_NAME} but missing: restore it from version control")
    if problems:
        raise BoundsError("thresholds lock check failed:\n  " + "\n  ".join(problems))
    return lock


def lock_files(thresholds: Path, paths: list[Path]) -> None:
    """Record the digests of ``paths`` (files under ``thresholds``) in the lock, atomically."""
    thresholds = Path(thresholds)
    with FileLock(str(_lock_path(thresholds)) + ".flock"):
        files = read_lock(thresholds)
        for path in paths:
            files[Path(path).relative_to(thresholds).as_posix()] = sha256_file(path)
        write_atomic(_lock_path(thresholds), dumps({"schema": LOCK_SCHEMA, "files": dict(sorted(files.items()))}))


def refuse_overwrite(path: Path, force_reason: str | None) -> None:
    if Path(path).exists() and not force_reason:
        raise BoundsError(
            f"{path} exists: frozen bounds are not overwritten. If they must be re-frozen, pass "
            "--h3-freeze-force='<reason>' (the reason is recorded in the file)"
        )


def save(bounds: Bounds, path: Path, thresholds: Path, force_reason: str | None = None, companions=()) -> Path:
    """Write a bounds file and lock it with the ``companions`` frozen beside it (a capture); an existing file is
    replaced only with a recorded reason."""
    path = Path(path)
    refuse_overwrite(path, force_reason)
    if path.exists():
        bounds.provenance["forced"] = force_reason
    write_atomic(path, dumps(bounds.to_json()))
    lock_files(thresholds, [path, *companions])
    bounds.path = path
    return path
