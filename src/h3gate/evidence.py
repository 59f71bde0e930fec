"""Evidence: the signed record of a gate run, its verification, and the merging of sharded runs.

The record is an in-toto Statement v1 whose predicate is the in-toto test-result predicate v0.1, wrapped in
a DSSE envelope signed with Ed25519. Those are the formats supply-chain tools already read, so a reviewer
can check evidence with any DSSE verifier, not only with this tool. The envelope and the keys are
:mod:`h3gate.signing`'s; the profiles and the verdict computed from the tests are :mod:`h3gate.profiles`'.

Layout of the statement (every list sorted and every test keyed by node id, so a merge of shards equals
the unsharded run's statement, timings aside):

- ``subject``: every artifact, named by its path relative to the evidence file's folder (inside it: no ``..``,
  no control characters), with its sha256;
- ``predicate.result``: ``PASSED`` or ``FAILED`` as the test-result predicate knows them, with the passed, warned
  and failed (crashed included) tests, computed from the tests by :func:`h3gate.profiles.tally`;
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

import io
import json
import math
import os
import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from h3gate.bounds import BoundsError, read_lock, verify_lock
from h3gate.candidates import source_digest
from h3gate.files import (
    MAX_JSON_BYTES,
    FileFormatError,
    dumps,
    loads_limited,
    read_regular,
    sha256_bytes,
    sha256_file,
    sha256_regular,
    signals_deferred,
    write_atomic,
)
from h3gate.profiles import FAILED, INCOMPLETE, OUTCOMES, PASSED, PROFILES, Outcome, Profile, tally, verdict
from h3gate.signing import (
    EVIDENCE_NAME,
    Envelope,
    EvidenceError,
    PrivateKey,
    PublicKey,
    canonical,
    keyid,
    open_envelope,
    sign,
)

if TYPE_CHECKING:
    from h3gate.candidate_lock import CandidateLock

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
SCHEMA = "h3gate.evidence/1"
REDACTION_SCHEMA = "h3gate.redaction/1"
SUMS_NAME = "SHA256SUMS"
REDACTION_NAME = "redaction.json"
PLACEHOLDERS = {"home": "~", "host": "<host>", "user": "<user>"}
ROLES = ("bounds", "contract")  # what a run is measured against: <gate>-bounds.json, <gate>-contract.json
RESULTS = ("PASSED", "WARNED", "FAILED")  # the test-result predicate's values of ``result``
VERDICTS = (PASSED, FAILED, INCOMPLETE)
SHA256 = re.compile(r"[0-9a-f]{64}")


# Redaction ------------------------------------------------------------------------------------------------


class Redactor:
    """Replaces the home folder (as a path prefix), and the host and user names where they are a whole path
    component or the whole value of a ``hostname``/``user``/``home`` field, by placeholders. Matching whole
    components only keeps a short user name from eating parts of tap or gate names."""

    FIELDS = {"hostname": "host", "user": "user", "home": "home"}

    def __init__(self, environment: dict):
        host = environment.get("hostname")
        self.own = {"host": host, "user": environment.get("user"), "home": environment.get("home")}
        self.components = [("host", name) for name in sorted({host, host.split(".")[0]})] if host else []
        if self.own["user"]:
            self.components.append(("user", self.own["user"]))

    def __call__(self, value, pointer: str = "") -> tuple[object, dict[str, list[str]]]:
        """(``value`` redacted, {JSON pointer under ``pointer``: kinds redacted there})."""
        fields: dict[str, list[str]] = {}
        return self._walk(value, pointer, None, fields), fields

    def field(self, key: str | None, value: str) -> str:
        """One string redacted as the value of a field named ``key`` (an XML attribute, or None for text)."""
        return self._walk(value, "", key, {})

    def _walk(self, value, pointer: str, key: str | None, fields: dict):
        if isinstance(value, dict):
            return {k: self._walk(v, f"{pointer}/{_escape(k)}", k, fields) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, f"{pointer}/{i}", None, fields) for i, v in enumerate(value)]
        if not isinstance(value, str):
            return value
        kinds = []
        kind = self.FIELDS.get(key)
        if kind and value and value == self.own[kind]:
            kinds.append(kind)
            value = PLACEHOLDERS[kind]
        home = self.own["home"]
        if home and (value == home or home + "/" in value):
            value = "~" if value == home else value.replace(home + "/", "~/")
            kinds.append("home")
        for kind, name in self.components:
            replaced = re.sub(rf"(?<=/){re.escape(name)}(?=/|$)", PLACEHOLDERS[kind], value)
            if replaced != value:
                value = replaced
                kinds.append(kind)
        if kinds:
            fields[pointer] = sorted(set(kinds))
        return value


def redact_xml(path: Path, environment: dict) -> None:
    """Redact a JUnit XML file in place, as the statement is redacted, before it is hashed as a subject: pytest
    writes the host name and absolute paths into it, and it is uploaded beside the evidence."""
    import xml.etree.ElementTree as ElementTree

    redact = Redactor(environment)
    tree = ElementTree.parse(path)
    for element in tree.iter():
        for name, value in element.attrib.items():
            element.set(name, redact.field(name, value))
        if element.text:
            element.text = redact.field(None, element.text)
        if element.tail:
            element.tail = redact.field(None, element.tail)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    write_atomic(path, buffer.getvalue())


def keep_copy(path: Path, copy: Path) -> Path:
    """``path``'s bytes written to ``copy`` (atomically): a file the evidence digests that its writer may rewrite."""
    write_atomic(copy, path.read_bytes())
    return copy


def _escape(key: str) -> str:
    """A JSON pointer (RFC 6901) reference token."""
    return str(key).replace("~", "~0").replace("/", "~1")


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
    roots = [Path(__file__).parent]
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
    ``candidate``: the candidate's identity(); ``environment``: :func:`h3gate.environment.collect`."""
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
            result, fields = redact(json_safe(result), f"/predicate/h3/tests/{_escape(nodeid)}/result")
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


def redaction_record(statement: dict) -> dict:
    """redaction.json: which fields were redacted and by what placeholders, never their values."""
    return {"schema": REDACTION_SCHEMA, "placeholders": PLACEHOLDERS, "fields": statement["predicate"]["h3"]["redacted"]}


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


# Verifying -----------------------------------------------------------------------------------------------


@dataclass
class Verification:
    """What held up. ``trusted``: the signature verified by a trusted key; without that, no verdict is one a
    reviewer may rely on, whatever ``result`` says. ``profile``: the profile checked and where its requirements
    came from."""

    statement: dict
    result: str
    profile: str
    signature: str
    trusted: bool
    artifacts: int
    lock: str

    def line(self) -> str:
        """The verdict line: what was checked against what, and what the evidence binds (candidate and model
        identity digests, the h3gate that wrote it)."""
        roles = {entry["annotations"]["role"]: entry for entry in self.statement["predicate"]["configuration"]}
        candidate, model = roles["candidate"], roles["model"]
        writer = self.statement["predicate"]["h3"]["tool"]
        return (
            f"{self.result} (profile {self.profile}); candidate {candidate['name'].removeprefix('candidate:')} "
            f"{candidate['digest']['sha256'][:16]}; model {model['name'].removeprefix('model:')} "
            f"{str(model['digest'].get('sha256', ''))[:16]}; h3gate {writer['version']} source "
            f"{writer['source_sha256'][:16]}; signature: {self.signature}; {self.artifacts} artifacts match; "
            f"lock: {self.lock}"
        )


def check_identity(statement: dict, candidate: str | None, model: str | None) -> None:
    """The evidence qualifies the candidate and model the reviewer asked about, or a ``mismatch``."""
    roles = {entry["annotations"]["role"]: entry for entry in statement["predicate"]["configuration"]}
    found = roles["candidate"]["name"].removeprefix("candidate:")
    if candidate is not None and found != candidate:
        raise EvidenceError("mismatch", f"the evidence qualifies candidate {found!r}, not {candidate!r}")
    identity = roles["model"]["digest"].get("sha256")
    if model is not None and identity != model:
        raise EvidenceError(
            "mismatch", f"the evidence qualifies model {roles['model']['name']} {identity}, not identity {model}"
        )


MAX_SUMS_BYTES = 64 << 20  # a million artifacts' lines


def _sidecar(path: Path, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    try:
        return read_regular(path, what, limit)
    except FileFormatError as error:
        raise EvidenceError("digest", f"{error} (`h3gate bundle` writes it beside the evidence)") from None


def check_sidecars(statement: dict, folder: Path, envelope: Path) -> None:
    """``SHA256SUMS`` and ``redaction.json`` in ``folder`` (where the artifacts are) agree with the envelope: sha256sum
    -c and verify never disagree, and the redaction a reader sees is the one that was signed. Both must be there,
    as the tool writes them: a check the help promises is never skipped because a file is gone."""
    redaction, sums = folder / REDACTION_NAME, folder / SUMS_NAME
    try:
        found = loads_limited(_sidecar(redaction, "redaction record"), redaction, "redaction record")
    except FileFormatError as error:
        raise EvidenceError("digest", str(error)) from None
    if found != redaction_record(statement):
        raise EvidenceError("digest", f"{redaction} differs from the redacted fields the statement records")
    expected = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    expected[EVIDENCE_NAME] = sha256_file(envelope)
    expected[REDACTION_NAME] = sha256_file(redaction)
    listed = {}
    text = _sidecar(sums, "SHA256SUMS list", MAX_SUMS_BYTES).decode("utf-8", "replace")
    for number, line in enumerate(text.removesuffix("\n").split("\n"), start=1):  # lines as sha256sum splits them
        match = re.fullmatch(r"([0-9a-f]{64})  (.+)", line)
        if match is None or name_problem(match.group(2)) or match.group(2) in listed:
            raise EvidenceError("digest", f"{sums} line {number} is not '<sha256>  <name inside the folder>', "
                                "each name once")
        listed[match.group(2)] = match.group(1)
    if set(listed) != set(expected):
        extra = sorted(set(listed) ^ set(expected))
        raise EvidenceError("digest", f"{sums} lists other files than the evidence (first difference {extra[0]!r})")
    for name, digest in sorted(listed.items()):
        if expected[name] != digest:
            raise EvidenceError("digest", f"{sums}: {name} has sha256 {digest[:16]} there, {expected[name][:16]} in the evidence")


def check_subjects(statement: dict, root: Path) -> None:
    """Every artifact is a regular file under ``root`` with the digest the statement records."""
    for subject in statement["subject"]:
        try:
            found = sha256_regular(root / subject["name"], "artifact")
        except FileFormatError as error:
            raise EvidenceError("digest", f"artifact {subject['name']}: {error}") from None
        recorded = subject["digest"]["sha256"]
        if found != recorded:
            raise EvidenceError(
                "digest",
                f"artifact {subject['name']} has sha256 {found[:16]} on disk but {recorded[:16]} in the evidence",
            )


def check_lock(statement: dict, thresholds: Path) -> str:
    """The statement's bounds and contracts are those of the thresholds lock, which verifies."""
    try:
        locked = verify_lock(thresholds)
    except (BoundsError, FileFormatError, OSError) as error:
        raise EvidenceError("lock", str(error).replace("\n", " ")) from None
    check_locked(statement, locked, thresholds)
    return f"matches {thresholds / 'LOCK.json'}"


def check_locked(statement: dict, locked: dict[str, str], thresholds: Path) -> None:
    """Each bounds and contract file the statement names has its digest in ``locked`` (the entries of the thresholds
    lock: whether the files match them is the lock's own check)."""
    for entry in statement["predicate"]["configuration"]:
        if entry["annotations"]["role"] not in ROLES:
            continue
        if locked.get(entry["name"]) != entry["digest"].get("sha256"):
            held = locked.get(entry["name"], "no entry")[:16]
            raise EvidenceError(
                "lock",
                f"{entry['annotations']['role']} {entry['name']}: sha256 {str(entry['digest'].get('sha256', ''))[:16]} "
                f"in the evidence, {held} in {Path(thresholds) / 'LOCK.json'}",
            )


def check_verdict(statement: dict, required: Profile | None) -> tuple[str, str]:
    """(verdict, profile label): the recorded verdict fields must follow from the recorded tests and profile; the
    verdict is then recomputed against ``required``, else the built-in profile of the recorded name (a built-in name
    never means what the evidence says it means), else the recorded profile. FAILED and INCOMPLETE raise."""
    h3 = statement["predicate"]["h3"]
    recorded = Profile.from_json(h3["profile"])
    recomputed = tally(h3["tests"], recorded)
    for key in ("result", "passedTests", "warnedTests", "failedTests"):
        if statement["predicate"][key] != recomputed[key]:
            raise EvidenceError("malformed", f"predicate.{key} does not follow from the recorded tests (edited?)")
    for key in ("verdict", "completeness"):
        if h3[key] != recomputed[key]:
            raise EvidenceError("malformed", f"predicate.h3.{key} does not follow from the recorded tests (edited?)")
    required = required or PROFILES.get(recorded.name, recorded)
    label = f"{required.name}, {'built-in' if PROFILES.get(required.name) == required else 'as recorded'}"
    recomputed = tally(h3["tests"], required)
    if recomputed["verdict"] == FAILED:
        failed = [n for n in recomputed["failedTests"] if verdict(h3["tests"][n]) == "failed"]
        raise EvidenceError("failed", f"{len(failed)} gate test(s) failed: {', '.join(failed)}")
    if recomputed["verdict"] == INCOMPLETE:
        problems = recomputed["completeness"]["problems"]
        raise EvidenceError("incomplete", f"incomplete for profile {required.name}: {'; '.join(problems)}")
    return recomputed["verdict"], label


def verify(
    evidence: Path,
    trusted: list[PublicKey] | None = None,
    thresholds: Path | None = None,
    root: Path | None = None,
    required: Profile | None = None,
    candidate: str | None = None,
    model: str | None = None,
    candidate_lock: CandidateLock | None = None,
) -> Verification:
    """Check signature, identity, artifact digests, the thresholds lock and the verdict, in that order; the first
    failure raises an :class:`EvidenceError`. ``trusted``: the public keys whose signature makes the verdict
    trusted (one must have signed); None checks everything else and returns an untrusted verification. The
    verdict is recomputed from the tests (:func:`check_verdict`); ``candidate``, ``model`` (an identity digest)
    and ``candidate_lock`` are what the evidence must qualify."""
    envelope = open_envelope(evidence)
    signer = envelope.check_signature(trusted) if trusted else None
    statement = statement_of(envelope)
    h3 = statement["predicate"]["h3"]
    if signer is not None:
        signature = f"verified (keyid {signer[:16]})"
    elif h3["signer"] is None:
        signature = "UNSIGNED (nobody vouches for it)"
    else:
        signature = f"NOT CHECKED (signed by keyid {h3['signer'][:16]}; pass --key or --keyring to check it)"
    check_identity(statement, candidate, model)
    if candidate_lock is not None:
        candidate_lock.check(statement)
    root = Path(root) if root is not None else envelope.path.parent
    check_subjects(statement, root)
    check_sidecars(statement, root, envelope.path)
    lock = check_lock(statement, Path(thresholds)) if thresholds is not None else "not checked (pass --thresholds)"
    result, label = check_verdict(statement, required)
    return Verification(statement, result, label, signature, signer is not None, len(statement["subject"]), lock)


class AlreadySigned(ValueError):
    """Evidence that carries a signature already: only a run's unsigned evidence is signed."""


def sign_verified(evidence: Path, key: PrivateKey, **checks) -> Path:
    """Sign a run's unsigned evidence in place once it verifies here (everything but a signature, ``checks`` as
    :func:`verify` takes them) and this h3gate wrote it. The key then vouches for a verdict that this h3gate, these
    thresholds and this profile reach, and never reaches the code under test, which ran unsigned."""
    envelope = open_envelope(evidence)
    if envelope.signatures:
        raise AlreadySigned(f"{envelope.path} is signed already (keyid {envelope.signed_by()[0][:16]}): sign only the "
                            "unsigned evidence of a run")
    statement = verify(envelope.path, **checks).statement
    writer, own = statement["predicate"]["h3"]["tool"], tool()
    if (writer["version"], writer["source_sha256"]) != (own["version"], own["source_sha256"]):
        raise EvidenceError(
            "mismatch",
            f"h3gate {writer['version']} source {writer['source_sha256'][:16]} wrote {envelope.path}, not this h3gate "
            f"({own['version']} source {own['source_sha256'][:16]}): the key vouches only for runs this h3gate judged",
        )
    return write_sealed(envelope.path.parent, statement, key)


def bundle(evidence: Path, out_dir: Path) -> list[Path]:
    """Copy what verification needs (the envelope, SHA256SUMS, redaction.json and every subject, under the names
    the statement gives them) into the new folder ``out_dir``: the folder a reviewer downloads verifies as it is,
    and holds nothing else. Returns the files written."""
    import shutil

    envelope = open_envelope(evidence)
    statement = statement_of(envelope)
    out_dir, folder = Path(out_dir), envelope.path.parent
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists: a bundle is written to a new folder, so it holds nothing else")
    copies = {EVIDENCE_NAME: envelope.path}
    copies.update({name: folder / name for name in (SUMS_NAME, REDACTION_NAME)})
    copies.update({s["name"]: folder / s["name"] for s in statement["subject"]})
    missing = sorted(name for name, source in copies.items() if not source.is_file())
    if missing:
        raise EvidenceError("digest", f"{missing[0]} is missing from {folder} (+{len(missing) - 1} more): nothing to bundle")
    written = []
    for name, source in sorted(copies.items()):
        target = out_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        written.append(Path(shutil.copyfile(source, target)))
    return written


# Merging -------------------------------------------------------------------------------------------------


def merge(shards: list[Path], out_dir: Path, sign_key: PrivateKey | None = None) -> Path:
    """Join the evidence of shards into one statement in ``out_dir``, equal to the unsharded run's (timings
    aside). Shards must share model, candidate, bounds, contracts and profile, and run disjoint tests (an item the
    shards' -k or -m deselects is in each of them, deselected); the difference is named otherwise. Subject names are rebased onto ``out_dir``, which must hold every shard's
    artifacts (e.g. the shards' common parent folder). With ``sign_key`` every shard
    must carry a valid signature by that same key (re-signing must not vouch for what nobody signed), and the
    result is signed; without it the result is unsigned."""
    if not shards:
        raise ValueError("merge needs at least one shard")
    out_dir = Path(out_dir).resolve()
    subject: dict[str, tuple[str, Path]] = {}
    tests: dict[str, tuple[dict, Path]] = {}
    environments: dict[str, dict] = {}
    redacted: dict[str, list[str]] = {}
    first = None
    for shard in shards:
        envelope = open_envelope(shard)
        if sign_key is not None:
            envelope.check_signature([sign_key.public_key()])
        statement = statement_of(envelope)
        predicate, h3 = statement["predicate"], statement["predicate"]["h3"]
        if first is None:
            first = (envelope.path, predicate["configuration"], h3["profile"], h3["tool"])
        else:
            if h3["profile"] != first[2]:
                raise EvidenceError(
                    "conflict", f"profile {h3['profile']['name']} in {envelope.path}, {first[2]['name']} in {first[0]}")
            joined = _joined_configuration(first, envelope.path, predicate["configuration"], h3["tool"])
            first = (first[0], joined, *first[2:])
        for entry in statement["subject"]:
            name = Path(os.path.relpath((envelope.path.parent / entry["name"]).resolve(), out_dir)).as_posix()
            if name_problem(name):
                raise FileFormatError(
                    out_dir, f"artifact {entry['name']} of {envelope.path} lies outside the merge folder: merge into "
                    "a folder that holds every shard (their common parent)"
                )
            digest = entry["digest"]["sha256"]
            if name in subject and subject[name][0] != digest:
                raise EvidenceError(
                    "conflict",
                    f"artifact {name}: sha256 {subject[name][0][:16]} in {subject[name][1]}, "
                    f"{digest[:16]} in {envelope.path}",
                )
            subject[name] = (digest, envelope.path)
        for nodeid, test in h3["tests"].items():
            if nodeid in tests and "deselected" not in (test["outcome"], tests[nodeid][0]["outcome"]):
                raise EvidenceError(
                    "conflict",
                    f"test {nodeid} is in both {tests[nodeid][1]} and {envelope.path}: shards must run disjoint items",
                )
            if nodeid not in tests or tests[nodeid][0]["outcome"] == "deselected":  # -k deselects it in every shard
                tests[nodeid] = (test, envelope.path)
        for key, environment in h3["environments"].items():
            if environments.setdefault(key, environment) != environment:
                raise EvidenceError("conflict", f"environment {key} differs between shards (edited?): {envelope.path}")
        redacted.update(_redacted_by_name(h3["redacted"], predicate["configuration"]))
    merged = assemble(
        [{"name": name, "digest": {"sha256": digest}} for name, (digest, _) in subject.items()],
        first[1],
        {nodeid: test for nodeid, (test, _) in tests.items()},
        environments,
        Profile.from_json(first[2]),
        _redacted_by_index(redacted, first[1]),
        first[3],
        utc_now(),
    )
    return write_sealed(out_dir, merged, sign_key)


def _joined_configuration(first: tuple, path: Path, config: list[dict], writer: dict) -> list[dict]:
    """The union of two statements' configurations; one measured against anything else than the other (another model
    or candidate, the same file with another digest) or judged by another h3gate is refused with the first difference
    named. A bounds file only one of them used (its gate items ran there) is no difference."""
    first_path, first_config, _, first_tool = first
    if writer != first_tool:
        raise EvidenceError(
            "conflict", f"h3gate {writer.get('version')} (source {str(writer.get('source_sha256'))[:16]}) wrote {path}, "
            f"{first_tool.get('version')} (source {str(first_tool.get('source_sha256'))[:16]}) wrote {first_path}"
        )
    theirs, ours = {d["name"]: d for d in first_config}, {d["name"]: d for d in config}
    for role in ("model", "candidate"):
        mine, other = (next(n for n, d in side.items() if d["annotations"]["role"] == role) for side in (ours, theirs))
        if mine != other:
            raise EvidenceError("conflict", f"{role} {mine} in {path}, {other} in {first_path}")
    for name in sorted(set(theirs) & set(ours)):
        if theirs[name] != ours[name]:
            role = ours[name]["annotations"]["role"]
            mine, other = ours[name]["digest"].get("sha256", ""), theirs[name]["digest"].get("sha256", "")
            what = (
                f"sha256 {mine[:16]} in {path}, {other[:16]} in {first_path}" if mine != other else "annotations differ"
            )
            raise EvidenceError("conflict", f"{role} {name}: {what}")
    return sorted({**theirs, **ours}.values(), key=lambda d: d["name"])


_CONFIGURATION = re.compile(r"/predicate/configuration/(\d+)(/.*)?")


def _redacted_by_name(redacted: dict, config: list[dict]) -> dict:
    """Redaction pointers with a configuration entry's index replaced by its name (``#name``): indices shift when two
    statements' configurations are joined."""
    named = {}
    for pointer, kinds in redacted.items():
        match = _CONFIGURATION.fullmatch(pointer)
        named[f"/predicate/configuration/#{config[int(match[1])]['name']}{match[2] or ''}" if match else pointer] = kinds
    return named


def _redacted_by_index(redacted: dict, config: list[dict]) -> dict:
    """:func:`_redacted_by_name` undone against the joined configuration (sorted by name, as :func:`assemble` has it)."""
    index = {entry["name"]: i for i, entry in enumerate(sorted(config, key=lambda d: d["name"]))}
    pattern = re.compile(r"/predicate/configuration/#(.+?)(/annotations.*)")
    restored = {}
    for pointer, kinds in redacted.items():
        match = pattern.fullmatch(pointer)
        restored[f"/predicate/configuration/{index[match[1]]}{match[2]}" if match else pointer] = kinds
    return dict(sorted(restored.items()))


# Accumulating the sessions of one output folder -----------------------------------------------------------


def _reached_verdict(test: dict) -> bool:
    """Whether a test's gate reached a verdict (passed, warned, failed, not claimed), rather than leaving a gap."""
    return verdict(test) not in ("skipped", "deselected", "crashed")


def accumulate(previous: Path, statement: dict, sign_key: PrivateKey | None, thresholds: Path) -> dict:
    """``statement`` (a session's, just built) joined to the evidence ``previous`` of the same output folder, which
    earlier sessions wrote: every test of either, the session's where both have one, unless the session reached no
    verdict on it (skipped, deselected, crashed, interrupted) and the earlier one did; subjects, environments and
    configuration joined. Both must qualify the same model and candidate against the same bounds and contracts, judged
    by the same h3gate, and be signed by the same key (or both unsigned: a key must not vouch for what nobody signed);
    the earlier bounds and contracts must still be those of the ``thresholds`` lock; the session's profile is the
    joined one's. Anything else is an :class:`EvidenceError` naming the difference, and nothing is written:
    ``previous`` stays as it was."""
    envelope = open_envelope(previous)
    if sign_key is not None:
        envelope.check_signature([sign_key.public_key()])
    elif envelope.signatures:
        raise EvidenceError("conflict", f"{envelope.path} is signed (keyid {envelope.signed_by()[0][:16]}) and this "
                            "session has no key: its evidence could not join without losing that signature")
    earlier = statement_of(envelope)
    root = envelope.path.parent
    try:
        check_subjects(earlier, root)
    except EvidenceError as error:
        raise EvidenceError("conflict", f"the evidence in {root} no longer matches its files ({error.reason})") from None
    check_locked(earlier, read_lock(thresholds), thresholds)  # the session start verified the files against it
    h3, old = statement["predicate"]["h3"], earlier["predicate"]["h3"]
    first = (envelope.path, earlier["predicate"]["configuration"], old["profile"], old["tool"])
    config = _joined_configuration(first, Path("this session"), statement["predicate"]["configuration"], h3["tool"])
    tests = dict(old["tests"])
    replaced = set()
    for nodeid, test in h3["tests"].items():
        if nodeid in tests and not _reached_verdict(test) and _reached_verdict(tests[nodeid]):
            continue
        tests[nodeid] = test
        replaced.add(nodeid)
    for key, environment in h3["environments"].items():
        if old["environments"].setdefault(key, environment) != environment:
            raise EvidenceError("conflict", f"environment {key} differs from the one {envelope.path} records (edited?)")
    kept = {pointer: kinds for pointer, kinds in _redacted_by_name(old["redacted"], earlier["predicate"]["configuration"]).items()
            if not any(pointer.startswith(f"/predicate/h3/tests/{_escape(nodeid)}/") for nodeid in replaced)}
    ours = _redacted_by_name(h3["redacted"], statement["predicate"]["configuration"])
    subject = {entry["name"]: entry for entry in earlier["subject"]}
    subject.update({entry["name"]: entry for entry in statement["subject"]})
    return assemble(list(subject.values()), config, tests, old["environments"], Profile.from_json(h3["profile"]),
                    _redacted_by_index({**kept, **ours}, config), h3["tool"], h3["created"])


def add_session(out_dir: Path, statement: dict, sign_key: PrivateKey | None, thresholds: Path) -> tuple[Path, dict]:
    """Seal ``statement`` as the evidence of ``out_dir``, joined to the evidence earlier sessions left there
    (:func:`accumulate`); returns the evidence path and the statement sealed."""
    previous = Path(out_dir) / EVIDENCE_NAME
    joined = accumulate(previous, statement, sign_key, thresholds) if previous.exists() else statement
    return write_sealed(out_dir, joined, sign_key), joined
