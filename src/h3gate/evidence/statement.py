"""The evidence statement: the signed record of a gate run, built, sealed and written.

The record is an in-toto Statement v1 whose predicate is the in-toto test-result predicate v0.1, wrapped in
a DSSE envelope signed with Ed25519. Those are the formats supply-chain tools already read, so a reviewer
can check evidence with any DSSE verifier, not only with this tool. The envelope and the keys are
:mod:`h3gate.evidence.signing`'s; the profiles and the verdict computed from the tests are
:mod:`h3gate.evidence.profiles`'; redaction is :mod:`h3gate.evidence.redaction`'s, checking it
:mod:`h3gate.evidence.verify`'s.

Layout of the statement (every list sorted and every test keyed by node id, so a merge of shards equals
the unsharded run's statement, timings aside):

- ``subject``: every artifact, named by its path relative to the evidence file's folder (inside it: no ``..``,
  no control characters), with its sha256;
- ``predicate.result``: ``PASSED`` or ``FAILED`` as the test-result predicate knows them, with the passed, warned
  and failed (crashed included) tests, computed from the tests by :func:`h3gate.evidence.profiles.tally`;
- ``predicate.configuration``: resource descriptors of the bounds and contract files (named as in the
  thresholds lock), the model identity and the candidate identity;
- ``predicate.h3``: the run's own verdict (PASSED, FAILED or INCOMPLETE) and the completeness profile and its
  outcome; every test's pytest outcome, gate, params and full GateResult JSON; the environments the shards ran
  in; the signer's keyid (null: unsigned); the JSON pointers of redacted fields; the h3gate version and source
  digest that wrote it, and when (UTC).

What is evidence: every file a verdict depends on is pinned by digest. Results, JUnit and gate outputs are
subjects; bounds and contracts are configuration entries that must match the thresholds lock, and the lock
pins the block captures beside them (whose digest their bounds also record). Step files and gate pass records
are the run's working state: the outputs they lead to, and the verdicts they gate, are in the statement.
``SHA256SUMS`` and ``redaction.json`` repeat what the envelope holds, for ``sha256sum -c`` and for readers of the
redaction; verification refuses them where they disagree with it.

Non-finite numbers are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, because the
payload must be JSON that every verifier parses. Home folders, host and user names are redacted inside the
statement before signing; ``redaction.json`` lists the redacted fields, never their values.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

from h3gate.candidates import source_digest
from h3gate.evidence.profiles import FAILED, INCOMPLETE, OUTCOMES, PASSED, Outcome, Profile, tally
from h3gate.evidence.redaction import REDACTION_NAME, Redactor, pointer_token, redaction_record
from h3gate.evidence.signing import (
    EVIDENCE_NAME,
    Envelope,
    EvidenceError,
    PrivateKey,
    canonical,
    keyid,
    sign,
)
from h3gate.files import (
    FileFormatError,
    dumps,
    loads_limited,
    sha256_bytes,
    sha256_file,
    signals_deferred,
    write_atomic,
)

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
SCHEMA = "h3gate.evidence/1"
SUMS_NAME = "SHA256SUMS"
ROLES = ("bounds", "contract")  # what a run is measured against: <gate>-bounds.json, <gate>-contract.json
RESULTS = ("PASSED", "WARNED", "FAILED")  # the test-result predicate's values of ``result``
VERDICTS = (PASSED, FAILED, INCOMPLETE)
SHA256 = re.compile(r"[0-9a-f]{64}")


def keep_copy(path: Path, copy: Path) -> Path:
    """``path``'s bytes written to ``copy`` (atomically): a file the evidence digests that its writer may rewrite."""
    write_atomic(copy, path.read_bytes())
    return copy



def json_safe(value):
    """``value`` with non-finite floats as the strings JSON parsers accept (NaN, Infinity, -Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# Building the statement -----------------------------------------------------------------------------------


MAX_COMPONENT_BYTES, MAX_NAME_BYTES = 255, 4000  # what Linux file systems and PATH_MAX (4096) allow, with room


def name_problem(name) -> str | None:
    """Why ``name`` cannot name a subject, or None. A name must stay inside the evidence folder (no absolute
    path, no ``..``), so verifying never hashes a file elsewhere; it must hold no control, format or line
    separator character, so printing it cannot repaint a terminal and SHA256SUMS holds it on one line; and it must
    be a path the file system can open, so checking it is a digest and never an OS error."""
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    bad = next((c for c in name if unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp")), None)
    if bad is not None:
        return f"holds the control character U+{ord(bad):04X}"
    if name.startswith("/") or "\\" in name or re.match(r"[A-Za-z]:", name):
        return "is not a relative POSIX path"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' component: it must name a file inside the evidence folder"
    longest = max(len(part.encode()) for part in parts)
    if longest > MAX_COMPONENT_BYTES or len(name.encode()) > MAX_NAME_BYTES:
        return (f"is too long for a file system ({len(name.encode())} bytes, a component of {longest}; at most "
                f"{MAX_NAME_BYTES} and {MAX_COMPONENT_BYTES})")
    return None


def subjects(artifacts: list[Path], root: Path) -> list[dict]:
    """Every artifact with its sha256, named by its POSIX path relative to ``root``, inside it."""
    root = Path(root).resolve()
    named = {}
    for artifact in artifacts:
        path = Path(artifact).resolve()
        if not path.is_file():
            raise FileFormatError(path, "artifact to record in the evidence is missing or not a file")
        name = Path(os.path.relpath(path, root)).as_posix()
        problem = name_problem(name)
        if problem:
            raise FileFormatError(path, f"cannot be a subject of evidence written to {root}: its name {name!r} "
                                  f"{problem}; write artifacts under the evidence folder")
        named[name] = sha256_file(path)
    return [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(named.items())]


def configuration(thresholds: Path, files: list[Path], model: dict, candidate: dict) -> list[dict]:
    """Resource descriptors of what the run was measured against: bounds and contract files (named as in
    the thresholds lock), the model identity, and the candidate (digest of its canonical identity JSON,
    which holds its source digest where it has one)."""
    thresholds = Path(thresholds).resolve()
    descriptors = []
    for file in files:
        path = Path(file).resolve()
        if thresholds not in path.parents:
            raise FileFormatError(path, f"bounds or contract file is not under the thresholds folder {thresholds}")
        role = next((role for role in ROLES if path.name.endswith(f"-{role}.json")), None)
        if role is None:
            raise FileFormatError(path, "neither a bounds file (*-bounds.json) nor a contract (*-contract.json)")
        descriptors.append(
            {
                "name": path.relative_to(thresholds).as_posix(),
                "digest": {"sha256": sha256_file(path)},
                "annotations": {"role": role},
            }
        )
    for key in ("name", "identity", "source"):
        if not isinstance(model.get(key), str):
            raise ValueError(f"model identity needs a string {key!r} (name, identity, source), got {model!r}")
    if not re.fullmatch(r"[0-9a-f]{64}", model["identity"]):
        raise ValueError(f"model identity {model['identity']!r} is not a sha256 hex digest")
    if not isinstance(candidate.get("name"), str):
        raise ValueError(f"candidate identity needs a string 'name', got {candidate!r}")
    descriptors.append(
        {
            "name": f"model:{model['name']}",
            "digest": {"sha256": model["identity"]},
            "annotations": {"role": "model", "source": model["source"]},
        }
    )
    descriptors.append(
        {
            "name": f"candidate:{candidate['name']}",
            "digest": {"sha256": candidate_digest(candidate)},
            "annotations": {"role": "candidate", "identity": candidate},
        }
    )
    return sorted(descriptors, key=lambda d: d["name"])


def candidate_digest(identity: dict) -> str:
    """The candidate's identity digest: sha256 of its canonical identity JSON."""
    return sha256_bytes(canonical(identity))


def environment_key(environment: dict) -> str:
    return sha256_bytes(canonical(environment))[:16]


def tool() -> dict:
    """The h3gate that writes the evidence: its version, and a digest of its source (engine and plugin), which
    tells a reviewer whether the tool that judged was an edited one even where the version number is the same."""
    try:
        installed = version("pytest-h3")
    except PackageNotFoundError:
        installed = None
    roots = [Path(__file__).parent.parent]  # the whole h3gate package
    plugin = find_spec("pytest_h3")
    if plugin is not None and plugin.origin:
        roots.append(Path(plugin.origin).parent)
    return {"name": "h3gate", "version": installed, "source_sha256": source_digest(*roots)}


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def assemble(
    subject: list[dict],
    config: list[dict],
    tests: dict,
    environments: dict,
    required: Profile,
    redacted: dict,
    writer: dict,
    created: str,
) -> dict:
    """The canonical statement from its parts; the verdict fields are computed here and only here."""
    verdicts = tally(tests, required)
    return {
        "_type": STATEMENT_TYPE,
        "subject": sorted(subject, key=lambda s: s["name"]),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "result": verdicts["result"],
            "passedTests": verdicts["passedTests"],
            "warnedTests": verdicts["warnedTests"],
            "failedTests": verdicts["failedTests"],
            "configuration": sorted(config, key=lambda d: d["name"]),
            "h3": {
                "schema": SCHEMA,
                "signer": None,
                "tool": writer,
                "created": created,
                "verdict": verdicts["verdict"],
                "profile": required.to_json(),
                "completeness": verdicts["completeness"],
                "tests": dict(sorted(tests.items())),
                "environments": dict(sorted(environments.items())),
                "redacted": dict(sorted(redacted.items())),
            },
        },
    }


def build_statement(
    results: dict[str, dict],
    outcomes: dict[str, Outcome],
    required: Profile,
    artifacts: list[Path],
    root: Path,
    thresholds: Path,
    files: list[Path],
    model: dict,
    candidate: dict,
    environment: dict,
) -> dict:
    """The statement of one run. ``results``: node id -> GateResult JSON of the items that reached the gate;
    ``outcomes``: node id -> :class:`Outcome` of every gate item (run, skipped, deselected or crashed);
    ``files``: the bounds and contract files used, under ``thresholds``; ``model``: {name, identity, source};
    ``candidate``: the candidate's identity(); ``environment``: :func:`h3gate.evidence.environment.collect`."""
    orphans = sorted(set(results) - set(outcomes))
    if orphans:
        raise ValueError(f"{orphans[0]} has a gate result but no outcome: pass the outcome of every gate item")
    redact = Redactor(environment)
    environment, fields = redact(json_safe(environment))
    key = environment_key(environment)
    redacted = {f"/predicate/h3/environments/{key}{pointer}": kinds for pointer, kinds in fields.items()}
    tests = {}
    for nodeid, outcome in outcomes.items():
        if outcome.outcome not in OUTCOMES:
            raise ValueError(f"{nodeid}: outcome {outcome.outcome!r} is not one of {', '.join(OUTCOMES)}")
        result = results.get(nodeid)
        if result is not None:
            if (result["gate"], result["params"]) != (outcome.gate, outcome.params):
                raise ValueError(
                    f"{nodeid}: result of gate {result['gate']} {result['params']} "
                    f"but outcome of gate {outcome.gate} {outcome.params}"
                )
            result, fields = redact(json_safe(result), f"/predicate/h3/tests/{pointer_token(nodeid)}/result")
            redacted.update(fields)
        tests[nodeid] = {
            "outcome": outcome.outcome,
            "gate": outcome.gate,
            "params": json_safe(outcome.params),
            "result": result,
            "environment": key,
        }
    config = []
    for index, descriptor in enumerate(configuration(thresholds, files, model, candidate)):
        annotations, fields = redact(descriptor["annotations"], f"/predicate/configuration/{index}/annotations")
        if annotations["role"] == "candidate":  # the digest is of the identity as recorded, so anyone can recompute it
            descriptor = {**descriptor, "digest": {"sha256": candidate_digest(annotations["identity"])}}
        config.append({**descriptor, "annotations": annotations})
        redacted.update(fields)
    return assemble(
        subjects(artifacts, root), config, tests, {key: environment}, required, redacted, tool(), utc_now()
    )


# DSSE ------------------------------------------------------------------------------------------------------


def seal(statement: dict, key: PrivateKey | None) -> dict:
    """The DSSE envelope of ``statement``, its signer recorded inside it (so a signature cannot be added or
    stripped unnoticed); no key: no signatures, signer null."""
    statement = {**statement, "predicate": {**statement["predicate"], "h3": dict(statement["predicate"]["h3"])}}
    statement["predicate"]["h3"]["signer"] = None if key is None else keyid(key.public_key())
    return sign(canonical(statement), key)


def statement_of(envelope: Envelope) -> dict:
    """The statement an envelope carries, its fields checked and its recorded signer matching the envelope's."""
    try:
        statement = loads_limited(envelope.payload, f"{envelope.path}: payload", "in-toto statement")
    except FileFormatError as error:
        raise EvidenceError("malformed", str(error)) from None
    check_statement(statement, envelope.path)
    signer = statement["predicate"]["h3"]["signer"]
    signed_by = envelope.signed_by()
    if (signer is None) != (not signed_by) or (signer is not None and signer not in signed_by):
        raise EvidenceError(
            "malformed",
            f"{envelope.path}: the statement names signer {signer} but the envelope is signed by "
            f"{signed_by or 'nobody'} "
            "(signatures added or stripped after sealing)",
        )
    return statement


def check_statement(statement, path: Path) -> None:
    """Types and fields of a statement this tool wrote; a missing field is malformed evidence, named."""

    def need(ok: bool, what: str):
        if not ok:
            raise EvidenceError("malformed", f"{path}: {what}")

    need(isinstance(statement, dict), "the statement is not a JSON object")
    need(statement.get("_type") == STATEMENT_TYPE, f"_type is not {STATEMENT_TYPE}")
    need(statement.get("predicateType") == PREDICATE_TYPE, f"predicateType is not {PREDICATE_TYPE}")
    subject = statement.get("subject")
    need(isinstance(subject, list), "subject is not a list")
    for entry in subject:
        need(
            isinstance(entry, dict)
            and isinstance(entry.get("digest"), dict)
            and SHA256.fullmatch(str(entry["digest"].get("sha256"))) is not None,
            f"subject entry {entry!r} lacks a name or a sha256 digest",
        )
        problem = name_problem(entry.get("name"))
        need(problem is None, f"subject name {entry.get('name')!r} {problem}")
    need(len({entry["name"] for entry in subject}) == len(subject), "a subject name is listed twice")
    predicate = statement.get("predicate")
    need(isinstance(predicate, dict), "predicate is not an object")
    need(predicate.get("result") in RESULTS, f"predicate.result is not one of {', '.join(RESULTS)}")
    for key in ("passedTests", "warnedTests", "failedTests", "configuration"):
        need(isinstance(predicate.get(key), list), f"predicate.{key} is not a list")
    for entry in predicate["configuration"]:
        need(
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("digest"), dict)
            and isinstance(entry.get("annotations"), dict)
            and isinstance(entry["annotations"].get("role"), str),
            f"configuration entry {entry!r} lacks name, digest or role",
        )
    for role in ("model", "candidate"):
        count = sum(entry["annotations"]["role"] == role for entry in predicate["configuration"])
        need(count == 1, f"predicate.configuration names {count} entries of role {role}, not one")
    candidate = next(e for e in predicate["configuration"] if e["annotations"]["role"] == "candidate")
    identity = candidate["annotations"].get("identity")
    need(isinstance(identity, dict) and isinstance(identity.get("name"), str),
         "the candidate entry records no identity with a name")
    need(candidate["name"] == f"candidate:{identity['name']}",
         f"the candidate entry is named {candidate['name']!r} but its identity names {identity['name']!r}")
    try:
        digest = candidate_digest(identity)
    except ValueError:  # NaN or the like, which canonical JSON refuses
        digest = None
    need(candidate["digest"].get("sha256") == digest, "the candidate's digest is not the sha256 of its recorded identity")
    h3 = predicate.get("h3")
    need(isinstance(h3, dict) and h3.get("schema") == SCHEMA, f"predicate.h3 is missing or not schema {SCHEMA}")
    for key, kind in (
        ("tests", dict),
        ("environments", dict),
        ("redacted", dict),
        ("profile", dict),
        ("completeness", dict),
    ):
        need(isinstance(h3.get(key), kind), f"predicate.h3.{key} is not a {kind.__name__}")
    need("signer" in h3 and (h3["signer"] is None or isinstance(h3["signer"], str)), "predicate.h3.signer is missing")
    need(h3.get("verdict") in VERDICTS, f"predicate.h3.verdict is not one of {', '.join(VERDICTS)}")
    writer = h3.get("tool")
    need(
        isinstance(writer, dict) and isinstance(writer.get("source_sha256"), str) and "version" in writer,
        "predicate.h3.tool lacks the h3gate version and source digest",
    )
    need(
        isinstance(h3.get("created"), str) and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h3["created"]),
        "predicate.h3.created is not a UTC timestamp (YYYY-MM-DDTHH:MM:SSZ)",
    )
    for nodeid, test in h3["tests"].items():
        need(
            isinstance(test, dict)
            and test.get("outcome") in OUTCOMES
            and isinstance(test.get("gate"), str)
            and isinstance(test.get("params"), dict)
            and "result" in test
            and (test["result"] is None or isinstance(test["result"], dict)),
            f"test {nodeid} lacks a valid outcome, gate, params or result",
        )
        if test["result"] is not None:
            need(
                isinstance(test["result"].get("passed"), bool) and isinstance(test["result"].get("context"), dict),
                f"result of {nodeid} lacks passed or context",
            )
    try:
        Profile.from_json(h3["profile"])
    except ValueError as error:
        raise EvidenceError("malformed", f"{path}: predicate.h3.profile is not a profile ({error})") from None


# Writing -------------------------------------------------------------------------------------------------

def write_sealed(out_dir: Path, statement: dict, sign_key: PrivateKey | None) -> Path:
    """evidence.json (the envelope), redaction.json and SHA256SUMS (of the subjects and those two) in ``out_dir``."""
    out_dir = Path(out_dir)
    evidence = out_dir / EVIDENCE_NAME
    envelope, redaction = dumps(seal(statement, sign_key)), dumps(redaction_record(statement))
    sums = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    sums.update({EVIDENCE_NAME: sha256_bytes(envelope.encode()), REDACTION_NAME: sha256_bytes(redaction.encode())})
    with signals_deferred():  # the three agree, or the earlier three stay
        write_atomic(out_dir / REDACTION_NAME, redaction)
        write_atomic(evidence, envelope)
        write_atomic(out_dir / SUMS_NAME, "".join(f"{digest}  {name}\n" for name, digest in sorted(sums.items())))
    return evidence


def write_evidence(
    out_dir: Path,
    results: dict[str, dict],
    outcomes: dict[str, Outcome],
    required: Profile,
    artifacts: list[Path],
    thresholds: Path,
    files: list[Path],
    model: dict,
    candidate: dict,
    environment: dict,
    sign_key: PrivateKey | None = None,
) -> tuple[Path, dict]:
    """The session-end call: build, redact, seal (signed when ``sign_key`` is given) and write the evidence.
    Subjects are named relative to ``out_dir``, where evidence.json goes. Returns the evidence.json path and the
    statement it seals (whose verdict the session reports)."""
    statement = build_statement(
        results, outcomes, required, artifacts, out_dir, thresholds, files, model, candidate, environment
    )
    return write_sealed(out_dir, statement, sign_key), statement

