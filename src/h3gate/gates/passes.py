"""Verdict records of a gate that another gate requires (the generation gate requires the model gate's pass).

Cheap before expensive: hours of generation are not spent on a candidate whose whole-model run failed. Every item
of a required gate records its outcome for the model and candidate identity, also when it crashed or had no bounds,
so an item waiting for it on another xdist worker never waits in vain: ``passed``, ``failed``, ``crashed``,
``missing bounds``, ``did not run``, or ``running`` (written when the gate starts, with the process id, so a waiter
sees a gate whose worker died). Records are JSON files written atomically under
``<out>/gate-passes/<gate>/<digest of model source and candidate identity>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from h3gate.files import FileFormatError, read_json, sha256_bytes, write_json

PASS_SCHEMA = "h3gate.gate-pass/1"
PASSED, FAILED, CRASHED, MISSING_BOUNDS, DID_NOT_RUN, RUNNING = (
    "passed", "failed", "crashed", "missing bounds", "did not run", "running")
OUTCOMES = (PASSED, FAILED, CRASHED, MISSING_BOUNDS, DID_NOT_RUN, RUNNING)


class NotPassed(RuntimeError):
    """A gate was asked to run before the gate it requires passed for the same model and candidate."""


@dataclass(frozen=True)
class ModelRef:
    """A model as a record names it: its source (preset and weight seed, or checkpoint folder), which is known
    before the model is built, and its identity once it is (a :class:`h3gate.model.factory.Model` serves as well)."""

    source: str
    identity: str | None = None


def _canonical(value):
    """``value`` as it reads back from JSON (tuples become lists), so a recorded identity compares equal."""
    return json.loads(json.dumps(value, sort_keys=True))


def _path(out_dir, gate: str, model, candidate_identity: dict) -> Path:
    key = sha256_bytes(json.dumps({"model": model.source, "candidate": candidate_identity}, sort_keys=True).encode())
    return Path(out_dir) / "gate-passes" / gate / f"{key}.json"


def record(
    out_dir, gate: str, model, candidate_identity: dict, outcome: str = PASSED, *, reason: str = "",
    bounds_sha256: str = "", run: str | None = None,
) -> Path:
    """Record ``gate``'s outcome for ``model`` (a Model or :class:`ModelRef`) and this candidate identity; ``reason``
    says why it did not pass; ``run`` names the test run (one id for all xdist workers of one run)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown {gate} gate outcome {outcome!r}; outcomes: {', '.join(OUTCOMES)}")
    candidate_identity = _canonical(candidate_identity)
    path = _path(out_dir, gate, model, candidate_identity)
    write_json(
        path,
        {
            "schema": PASS_SCHEMA,
            "gate": gate,
            "outcome": outcome,
            "passed": outcome == PASSED,
            "reason": reason,
            "model_source": model.source,
            "model_identity": model.identity,
            "candidate": candidate_identity,
            "bounds_sha256": bounds_sha256,
            "run": run,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    return path


def _read(path: Path, gate: str) -> dict | None:
    try:
        return read_json(path, f"{gate} gate record")
    except FileFormatError:
        return None  # not there (yet); written atomically, so never half a record


def _process_ended(entry: dict) -> bool:
    """A ``running`` record of a process of this host that no longer exists (its worker died)."""
    if entry.get("host") != socket.gethostname() or not isinstance(entry.get("pid"), int):
        return False
    try:
        os.kill(entry["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def wait(
    out_dir, gate: str, model, candidate_identity: dict, run: str | None = None, stream=None,
    timeout: float = 7200.0, poll: float = 0.5,
) -> dict | None:
    """``gate``'s record for this model and candidate once it is final (another xdist worker may run the gate):
    with ``run``, only a record of that test run counts. A ``running`` record whose process ended is returned as
    ``crashed``. None when nothing final came within ``timeout`` seconds."""
    path = _path(out_dir, gate, model, _canonical(candidate_identity))
    deadline = time.monotonic() + timeout
    told = False
    while True:
        entry = _read(path, gate)
        if entry is not None and (run is None or entry.get("run") == run):
            if entry.get("outcome") != RUNNING:
                return entry
            if _process_ended(entry):
                return {**entry, "outcome": CRASHED, "passed": False,
                        "reason": f"its process (pid {entry['pid']}) ended without a verdict"}
        if time.monotonic() >= deadline:
            return None
        if not told and stream is not None:
            stream.write(f"waiting for the {gate} gate's verdict ({path.name})\n")
            told = True
        time.sleep(poll)


def require_pass(out_dir, gate: str, model, candidate_identity: dict, override: str | None = None) -> dict:
    """``gate``'s recorded pass for this model (a Model) and candidate, or the override (a reason), or
    :class:`NotPassed` naming the gate's outcome. The returned dict goes into the result's context, so an override
    is always visible in the evidence."""
    candidate_identity = _canonical(candidate_identity)
    path = _path(out_dir, gate, model, candidate_identity)
    entry = _read(path, gate)
    if entry is not None and entry.get("candidate") == candidate_identity:
        outcome = entry.get("outcome", PASSED if entry.get("passed") else FAILED)
        if outcome == PASSED and entry.get("model_identity") == model.identity:
            return {"status": "passed", "record": str(path), "bounds_sha256": entry.get("bounds_sha256")}
        if outcome != PASSED and not override:
            reason = entry.get("reason") or "no reason recorded"
            if outcome == RUNNING:
                reason = "its last run did not finish"
            raise NotPassed(
                f"the {gate} gate did not pass for candidate {candidate_identity.get('name')!r}: {outcome}: {reason} "
                f"({path}); a candidate that does not pass the {gate} gate is not worth hours of the gates that need "
                f"it: fix that first, or give an override reason (--h3-skip-{gate}-gate=REASON), which is recorded in "
                "the results"
            )
    if override:
        return {"status": "overridden", "reason": override}
    raise NotPassed(
        f"this gate runs only after the {gate} gate has passed for the same candidate, and no pass of candidate "
        f"{candidate_identity.get('name')!r} on model {str(model.identity)[:12]} is recorded under {out_dir}: run the "
        f"{gate} gate first (pytest -m gate, same candidate, model and output folder), or give an override reason "
        f"(--h3-skip-{gate}-gate=REASON), which is recorded in the results"
    )
