"""The session's evidence: the engine's signed statement over what the ledger saw, written at session end."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from h3gate.evidence import environment, profiles
from pytest_h3.options import OUT, SIGN_KEY


def device_facts(device: str, worker: str) -> dict:
    """The device an item ran on, and the xdist worker: a GPU's name and PCI bus id show each worker had its own."""
    facts = {"device": device, "worker": worker}
    if not device.startswith("cuda"):
        return facts
    gpu = environment.gpus()[torch.device(device).index or 0]
    return {**facts, "name": gpu["name"], "pci_bus_id": gpu["pci_bus_id"], "uuid": gpu["uuid"],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def _paths(value) -> set[Path]:
    """Every file path named under a result's ``artifacts``: strings, or ``{"path": ...}`` at any depth."""
    if isinstance(value, str):
        return {Path(value)}
    if isinstance(value, dict):
        if isinstance(value.get("path"), str):
            return {Path(value["path"])}
        return set().union(*map(_paths, value.values())) if value else set()
    return set()


def _named_artifacts(value) -> set[Path]:
    """The files under every ``artifacts`` key at any depth of a result's context: the generation gate keeps each
    workflow's under ``workflows``, and evidence that missed them would let its videos change unseen."""
    if isinstance(value, dict):
        return set().union(set(), *(_paths(v) if k == "artifacts" else _named_artifacts(v) for k, v in value.items()))
    if isinstance(value, list):
        return set().union(set(), *map(_named_artifacts, value))
    return set()


def _artifacts(results: dict, extra: list[Path]) -> list[Path]:
    paths = set(extra)
    for result in results.values():
        paths |= _named_artifacts(result.get("context", {}))
    return sorted(path for path in paths if path.is_file())


def _files(results: dict, thresholds: Path, model_name: str) -> list[Path]:
    """Bounds files the results used and the model's contracts."""
    files = {Path(r["context"]["bounds_file"]) for r in results.values() if r.get("context", {}).get("bounds_file")}
    files |= set((thresholds / model_name).glob("*-contract.json"))
    return sorted(path for path in files if path.is_file())


# Each session's own files the evidence digests, kept under sessions/<UTC time>-<run id>/ of --h3-out: results.json and
# pytest's JUnit XML are rewritten by every session (pytest rewrites --junitxml even in an interrupted one), and the
# evidence of the folder, which joins every session's tests, must keep naming files that do not change under it.
SESSIONS = "sessions"


def session_record(session, results_path: Path, facts: dict) -> list[Path]:
    """This session's results and JUnit XML (redacted as the statement is), copied under ``sessions/<id>/`` of
    --h3-out: the files its tests' evidence digests."""
    from h3gate.evidence import redaction, statement

    started = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")  # sessions sort by time, to the microsecond
    folder = Path(session.out) / SESSIONS / f"{started}-{session.run_id[:8]}"
    kept = [statement.keep_copy(results_path, folder / "results.json")]
    junit = session.config.getoption("xmlpath", None)
    if junit and Path(junit).is_file():
        if Path(session.out).resolve() in Path(junit).resolve().parents:
            redaction.redact_xml(Path(junit), facts)
            kept.append(statement.keep_copy(Path(junit), folder / "junit.xml"))
        else:
            session.summary.append(f"{junit} is not evidence: only files under {OUT} are (--junitxml=OUT/junit.xml)")
    return kept


def write_session_evidence(session, results_path: Path, outcomes: dict) -> Path:
    """The session's statement, joined to the evidence earlier sessions left in --h3-out
    (:func:`h3gate.evidence.accumulate.accumulate`) and sealed there."""
    from h3gate.evidence import accumulate, statement  # loads cryptography (signing): only where evidence is written

    results = session.ledger.results
    contexts = [r.get("context", {}) for r in results.values()]
    model = next((c["model"] for c in contexts if "model" in c), None)
    if model is None:
        model = {"name": session.model.name, "identity": session.model.identity, "source": session.model.source}
    candidate = next((c["candidate"] for c in contexts if "candidate" in c), None) or session.candidate.identity()
    facts = environment.collect()
    built = statement.build_statement(
        results,
        outcomes,
        profiles.profile(session.settings.profile),
        _artifacts(results, session_record(session, results_path, facts)),
        session.out,
        session.thresholds,
        _files(results, session.thresholds, model["name"]),
        model,
        candidate,
        facts,
    )
    key = session.sign_key
    path, joined = accumulate.add_session(session.out, built, key, session.thresholds)
    if key is None:
        session.summary.append(f"evidence is UNSIGNED: pass {SIGN_KEY} or set H3GATE_SIGN_KEY to sign it")
    ours = built["predicate"]["h3"]["tests"]
    kept = [nodeid for nodeid, test in joined["predicate"]["h3"]["tests"].items() if ours.get(nodeid) != test]
    if kept:
        session.summary.append(f"evidence keeps {len(kept)} gate item{'s' if len(kept) > 1 else ''} of earlier "
                               f"sessions in {session.out} (a session adds to the evidence of its {OUT})")
    session.summary.append(verdict_line(joined))
    session.summary.append(f"verify it: {verify_command(session, path, joined)}")
    return path


def check_joinable(session) -> None:
    """At session start, before any gate runs: refuse an --h3-out whose evidence this session's could not join at its
    end (:func:`h3gate.evidence.accumulate.accumulate`), for what can be told now: another signing key (or none),
    another h3gate, candidate or model, bounds or contracts frozen again since. The folder's evidence is never
    replaced by a session's that cannot join it."""
    from h3gate.bounds import read_lock
    from h3gate.evidence.signing import EVIDENCE_NAME, EvidenceError, keyid, open_envelope
    from h3gate.evidence.statement import statement_of, tool
    from h3gate.evidence.verify import check_locked

    path = Path(session.out) / EVIDENCE_NAME
    if not path.exists():
        return
    try:
        envelope = open_envelope(path)
        statement = statement_of(envelope)
    except EvidenceError as error:
        raise pytest.UsageError(f"{OUT}={session.out}: {path} is not evidence a session can join ({error.reason}): "
                                f"move it away, or give another {OUT}") from None
    h3 = statement["predicate"]["h3"]
    roles = {entry["annotations"]["role"]: entry["name"] for entry in statement["predicate"]["configuration"]}
    key, writer, own = session.sign_key, h3["tool"], tool()
    candidate = f"candidate:{session.candidate.identity()['name']}"
    problem = None
    if key is None and envelope.signatures:
        problem = f"it is signed (keyid {envelope.signed_by()[0][:16]}) and this session has no key: pass that key " \
                  f"with {SIGN_KEY}"
    elif key is not None and keyid(key.public_key()) not in envelope.signed_by():
        signer = f"signed by keyid {envelope.signed_by()[0][:16]}" if envelope.signatures else "unsigned"
        problem = f"it is {signer}, and this session's key (keyid {keyid(key.public_key())[:16]}) must not vouch for " \
                  "what it did not sign"
    elif (writer["version"], writer["source_sha256"]) != (own["version"], own["source_sha256"]):
        problem = f"h3gate {writer['version']} source {writer['source_sha256'][:16]} wrote it, this is h3gate " \
                  f"{own['version']} source {own['source_sha256'][:16]}"
    elif roles["candidate"] != candidate:
        problem = f"it qualifies {roles['candidate']}, this session {candidate}"
    elif roles["model"] != f"model:{session.model_name}":
        problem = f"it qualifies {roles['model']}, this session model:{session.model_name}"
    else:
        try:
            check_locked(statement, read_lock(session.thresholds), session.thresholds)
        except EvidenceError as error:  # bounds or contracts frozen again since: its items measured against others
            problem = f"its items were measured against other bounds or contracts: {error.reason}"
    if problem:
        raise pytest.UsageError(f"{OUT}={session.out} holds evidence this session's could not join ({problem}): "
                                f"give another {OUT}, or move {path} away to start anew")


def verify_command(session, path: Path, statement: dict) -> str:
    """The ``h3gate verify`` of the evidence just written, against this session's thresholds and profile: with the
    public key beside a signing key ``h3gate keygen`` made, ``--allow-unsigned`` for unsigned evidence."""
    import shlex

    from h3gate.evidence.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, keyid

    thresholds = session.thresholds  # relative where it lies under the working folder, as a user names it
    if thresholds.is_absolute() and thresholds.is_relative_to(Path.cwd()):
        thresholds = thresholds.relative_to(Path.cwd())
    parts = ["h3gate", "verify", str(path), f"--thresholds={thresholds}",
             f"--profile={statement['predicate']['h3']['profile']['name']}"]
    key = session.settings.sign_key
    public = Path(key).with_name(PUBLIC_KEY_NAME) if key and Path(key).name == PRIVATE_KEY_NAME else None
    if session.sign_key is None:
        return shlex.join([*parts, "--allow-unsigned"])
    if public is not None and public.is_file():
        return shlex.join([*parts, f"--key={public}"])
    return f"{shlex.join(parts)} --key=PUBLIC.pem, PUBLIC.pem holding the public key of keyid " \
        f"{keyid(session.sign_key.public_key())[:16]}"


def verdict_line(statement: dict) -> str:
    """The evidence's verdict as ``h3gate verify`` will recompute it, with every gap of an INCOMPLETE one: green
    pytest items do not make complete evidence when the profile needs gates that did not run."""
    h3 = statement["predicate"]["h3"]
    line = f"evidence verdict: {h3['verdict']} for profile {h3['profile']['name']}"
    problems = h3["completeness"]["problems"]
    return line + (f" ({'; '.join(problems)})" if problems else "")
