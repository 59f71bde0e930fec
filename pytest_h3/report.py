"""The session's evidence: the engine's signed statement over what the ledger saw, written at session end."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from h3gate import environment, profiles


def device_facts(device: str) -> dict:
    """The device an item ran on, and the xdist worker: a GPU's name and PCI bus id show each worker had its own."""
    facts = {"device": device, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
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


# The JUnit XML the evidence digests: a copy of this session's, since pytest rewrites --junitxml in every session,
# an interrupted one too, which would leave the earlier evidence naming a file that changed under it.
EVIDENCE_JUNIT = "evidence-junit.xml"


def write_session_evidence(session, results_path: Path, outcomes: dict) -> Path:
    from h3gate import evidence  # loads cryptography (signing): only where evidence is written
    results = session.ledger.results
    contexts = [r.get("context", {}) for r in results.values()]
    model = next((c["model"] for c in contexts if "model" in c), None)
    if model is None:
        model = {"name": session.model.name, "identity": session.model.identity, "source": session.model.source}
    candidate = next((c["candidate"] for c in contexts if "candidate" in c), None) or session.candidate.identity()
    facts = environment.collect()
    extra = [results_path]
    junit = session.config.getoption("xmlpath", None)
    if junit and Path(junit).is_file():
        if Path(session.out).resolve() in Path(junit).resolve().parents:
            evidence.redact_xml(Path(junit), facts)
            extra.append(evidence.keep_copy(Path(junit), Path(session.out) / EVIDENCE_JUNIT))
        else:
            session.summary.append(f"{junit} is not evidence: only files under --h3-out are (--junitxml=OUT/junit.xml)")
    key = session.sign_key
    path, statement = evidence.write_evidence(
        session.out,
        results,
        outcomes,
        profiles.profile(session.config.getoption("--h3-profile")),
        _artifacts(results, extra),
        session.thresholds,
        _files(results, session.thresholds, model["name"]),
        model,
        candidate,
        facts,
        key,
    )
    if key is None:
        session.summary.append("evidence is UNSIGNED: pass --h3-sign-key or set H3GATE_SIGN_KEY to sign it")
    session.summary.append(verdict_line(statement))
    session.summary.append(f"verify it: {verify_command(session, path, statement)}")
    return path


def verify_command(session, path: Path, statement: dict) -> str:
    """The ``h3gate verify`` of the evidence just written, against this session's thresholds and profile: with the
    public key beside a signing key ``h3gate keygen`` made, ``--allow-unsigned`` for unsigned evidence."""
    import shlex

    from h3gate.signing import PRIVATE_KEY_NAME, PUBLIC_KEY_NAME, keyid

    thresholds = Path(os.path.relpath(session.thresholds)) if session.thresholds.is_absolute() else session.thresholds
    parts = ["h3gate", "verify", str(path), f"--thresholds={thresholds}",
             f"--profile={statement['predicate']['h3']['profile']['name']}"]
    key = session.config.getoption("--h3-sign-key")
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
