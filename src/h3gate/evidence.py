"""Evidence: the signed record of a gate run, its verification, and the merging of sharded runs.

The record is an in-toto Statement v1 whose predicate is the in-toto test-result predicate v0.1, wrapped in
a DSSE envelope signed with Ed25519. Those are the formats supply-chain tools already read, so a reviewer
can check evidence with any DSSE verifier, not only with this tool. Ed25519 comes from ``cryptography``:
the maintained OpenSSL binding, shipped as wheels everywhere, and it reads the PEM keys ``keygen`` writes.

Layout of the statement (every list sorted and every test keyed by node id, so a merge of shards equals
the unsharded run's statement, timings aside):

- ``subject``: every artifact, named by its path relative to the evidence file's folder, with its sha256;
- ``predicate.result``: ``PASSED``, ``FAILED`` or ``INCOMPLETE``. The test-result predicate knows PASSED,
  WARNED and FAILED; INCOMPLETE is this tool's own value for a run that lacks a verdict on a gate its
  completeness profile requires (skipped, deselected, crashed). Such a run must never read as PASSED, and
  WARNED would say it passed with remarks. Passes with non-discriminating bounds are listed in
  ``warnedTests`` and still give PASSED;
- ``predicate.configuration``: resource descriptors of the bounds and contract files (named as in the
  thresholds lock), the model identity and the candidate identity;
- ``predicate.h3``: every test's pytest outcome, gate, params and full GateResult JSON; the completeness
  profile and its outcome; the environments the shards ran in; the signer's keyid (null: unsigned); the
  JSON pointers of redacted fields.

Non-finite numbers are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, because the
payload must be JSON that every verifier parses. Home folders, host and user names are redacted inside the
statement before signing; ``redaction.json`` lists the redacted fields, never their values.

The signing key comes from a PEM file path, or else from ``H3GATE_SIGN_KEY``, which holds the PEM *text*
(CI secret stores hand out contents, not files); a path in the variable is refused, not guessed at.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from h3gate.bounds import BoundsError, verify_lock
from h3gate.files import FileFormatError, dumps, read_json, sha256_bytes, sha256_file, write_atomic

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
SCHEMA = "h3gate.evidence/1"
REDACTION_SCHEMA = "h3gate.redaction/1"
EVIDENCE_NAME = "evidence.json"
SUMS_NAME = "SHA256SUMS"
REDACTION_NAME = "redaction.json"
PRIVATE_KEY_NAME = "h3gate-signing-key.pem"
PUBLIC_KEY_NAME = "h3gate-signing-key.pub.pem"
KEY_ENV = "H3GATE_SIGN_KEY"
PASSED, FAILED, INCOMPLETE = "PASSED", "FAILED", "INCOMPLETE"
OUTCOMES = ("passed", "failed", "skipped", "deselected", "error")
PLACEHOLDERS = {"home": "~", "host": "<host>", "user": "<user>"}
ROLES = ("bounds", "contract")  # what a run is measured against: <gate>-bounds.json, <gate>-contract.json


class EvidenceError(Exception):
    """Evidence that does not hold up. ``kind`` says which check refused it (the CLI maps it to an exit code):
    malformed, signature, unsigned, digest, lock, incomplete, failed, conflict."""

    def __init__(self, kind: str, reason: str):
        self.kind = kind
        self.reason = reason
        super().__init__(reason)


class SigningKeyError(ValueError):
    """A signing or verification key that cannot be used; the message names its source and the fix."""


# Completeness profiles ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """A gate the profile requires; a test matches when its gate is ``gate`` and its params include ``params``."""

    gate: str
    params: dict = field(default_factory=dict)

    def matches(self, gate: str, params: dict) -> bool:
        return gate == self.gate and all(params.get(key) == value for key, value in self.params.items())

    def label(self) -> str:
        params = ",".join(f"{key}={value}" for key, value in sorted(self.params.items()))
        return self.gate + (f"[{params}]" if params else "")

    def to_json(self) -> dict:
        return {"gate": self.gate, "params": self.params}


@dataclass(frozen=True)
class Profile:
    name: str
    requirements: tuple[Requirement, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "required": [r.to_json() for r in self.requirements]}

    @classmethod
    def from_json(cls, data: dict) -> "Profile":
        return cls(data["name"], tuple(Requirement(r["gate"], r["params"]) for r in data["required"]))


# ``ci`` is what the tiny gate suite under tests/gates runs; it grows with that suite (a test checks they agree).
PROFILES = {
    "release": Profile(
        "release",
        (
            Requirement("kernel"),
            Requirement("block"),
            Requirement("model"),
            *(Requirement("generation", {"seed": seed}) for seed in (42, 43, 44)),
        ),
    ),
    "ci": Profile(
        "ci",
        (
            Requirement("kernel"),
            Requirement("block"),
            Requirement("model"),
            *(Requirement("generation", {"seed": seed}) for seed in (42, 43, 44)),
            Requirement("power"),
        ),
    ),
}


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown completeness profile {name!r}; profiles: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]


@dataclass(frozen=True)
class Outcome:
    """What pytest made of one gate item: ``outcome`` is one of OUTCOMES (``error``: the item errored or its
    worker died), ``gate`` and ``params`` come from the item's marker, so a skipped item still names its gate."""

    outcome: str
    gate: str
    params: dict = field(default_factory=dict)


def verdict(test: dict) -> str:
    """passed, warned or failed when the gate reached a verdict; else skipped, deselected or crashed. A pytest
    failure counts as failed even where the gate's checks passed: the test asserted more than the gate."""
    outcome, result = test["outcome"], test["result"]
    if outcome in ("skipped", "deselected"):
        return outcome
    if outcome == "error" or result is None:
        return "crashed"
    if outcome == "failed" or not result["passed"]:
        return "failed"
    if result["context"].get("non_discriminating"):
        return "warned"
    return "passed"


def completeness(tests: dict[str, dict], required: Profile) -> dict:
    """Whether every required gate reached a verdict. A crashed item of any gate leaves the run incomplete:
    its verdict is unknown. A skipped or deselected item matters only where the profile requires its gate."""
    verdicts = {nodeid: verdict(test) for nodeid, test in tests.items()}
    problems = [
        f"{nodeid}: crashed without a gate verdict" for nodeid in sorted(tests) if verdicts[nodeid] == "crashed"
    ]
    for requirement in required.requirements:
        matching = sorted(n for n, t in tests.items() if requirement.matches(t["gate"], t["params"]))
        if not matching:
            problems.append(f"{requirement.label()}: no test item of this gate ran (not collected or not recorded)")
        for nodeid in matching:
            if verdicts[nodeid] in ("skipped", "deselected"):
                problems.append(f"{requirement.label()}: {nodeid} was {verdicts[nodeid]}")
    return {"complete": not problems, "problems": problems}


def tally(tests: dict[str, dict], required: Profile) -> dict:
    """The predicate's verdict fields, computed from the tests (never taken from anywhere else). A failed test
    outranks a missing verdict: FAILED is a finding about the candidate, INCOMPLETE only a gap in the run."""
    lists = {"passed": [], "warned": [], "failed": []}
    for nodeid in sorted(tests):
        found = verdict(tests[nodeid])
        if found in lists:
            lists[found].append(nodeid)
    outcome = completeness(tests, required)
    result = FAILED if lists["failed"] else PASSED if outcome["complete"] else INCOMPLETE
    return {
        "result": result,
        "passedTests": lists["passed"],
        "warnedTests": lists["warned"],
        "failedTests": lists["failed"],
        "completeness": outcome,
    }


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


def subjects(artifacts: list[Path], root: Path) -> list[dict]:
    """Every artifact with its sha256, named by its POSIX path relative to ``root`` (``..`` allowed)."""
    root = Path(root).resolve()
    named = {}
    for artifact in artifacts:
        path = Path(artifact).resolve()
        if not path.is_file():
            raise FileFormatError(path, "artifact to record in the evidence is missing or not a file")
        named[Path(os.path.relpath(path, root)).as_posix()] = sha256_file(path)
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
            "digest": {"sha256": sha256_bytes(canonical(candidate))},
            "annotations": {"role": "candidate", "identity": candidate},
        }
    )
    return sorted(descriptors, key=lambda d: d["name"])


def environment_key(environment: dict) -> str:
    return sha256_bytes(canonical(environment))[:16]


def assemble(
    subject: list[dict], config: list[dict], tests: dict, environments: dict, required: Profile, redacted: dict
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
        config.append({**descriptor, "annotations": annotations})
        redacted.update(fields)
    return assemble(subjects(artifacts, root), config, tests, {key: environment}, required, redacted)


# DSSE ------------------------------------------------------------------------------------------------------


def canonical(value) -> bytes:
    """The statement's bytes: compact JSON, sorted keys, UTF-8, no NaN (see json_safe)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding: "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def keyid(public_key: Ed25519PublicKey) -> str:
    """sha256 hex of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_bytes(raw)


def seal(statement: dict, key: Ed25519PrivateKey | None) -> dict:
    """The DSSE envelope of ``statement``, its signer recorded inside it; no key: no signatures, signer null."""
    statement = {**statement, "predicate": {**statement["predicate"], "h3": dict(statement["predicate"]["h3"])}}
    statement["predicate"]["h3"]["signer"] = None if key is None else keyid(key.public_key())
    payload = canonical(statement)
    signatures = []
    if key is not None:
        signature = key.sign(pae(PAYLOAD_TYPE, payload))
        signatures.append({"keyid": keyid(key.public_key()), "sig": base64.b64encode(signature).decode()})
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(), "signatures": signatures}


def _b64decode(text, what: str) -> bytes:
    """DSSE allows standard or URL-safe base64."""
    if not isinstance(text, str):
        raise EvidenceError("malformed", f"{what} is not a base64 string")
    try:
        return base64.b64decode(text.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError) as error:
        raise EvidenceError("malformed", f"{what} is not valid base64 ({error})") from None


@dataclass
class Envelope:
    path: Path
    payload: bytes
    signatures: list[dict]

    def statement(self) -> dict:
        try:
            statement = json.loads(self.payload)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise EvidenceError("malformed", f"{self.path}: the payload is not JSON ({error})") from None
        check_statement(statement, self.path)
        signer = statement["predicate"]["h3"]["signer"]
        signed_by = sorted(s["keyid"] for s in self.signatures)
        if (signer is None) != (not signed_by) or (signer is not None and signer not in signed_by):
            raise EvidenceError(
                "malformed",
                f"{self.path}: the statement names signer {signer} but the envelope is signed by "
                f"{signed_by or 'nobody'} "
                "(signatures added or stripped after sealing)",
            )
        return statement

    def check_signature(self, public_key: Ed25519PublicKey) -> str:
        """The keyid whose signature verifies, or an EvidenceError (unsigned / signature)."""
        wanted = keyid(public_key)
        if not self.signatures:
            raise EvidenceError("unsigned", f"{self.path} is unsigned, but a key was given: the run was not signed")
        matching = [s for s in self.signatures if s["keyid"] == wanted]
        if not matching:
            others = ", ".join(s["keyid"][:16] for s in self.signatures)
            raise EvidenceError("signature", f"{self.path} has no signature by key {wanted[:16]} (signed by {others})")
        try:
            public_key.verify(_b64decode(matching[0]["sig"], "signature"), pae(PAYLOAD_TYPE, self.payload))
        except InvalidSignature:
            raise EvidenceError(
                "signature",
                f"{self.path}: signature by key {wanted[:16]} does not verify: the statement was changed after signing",
            ) from None
        return wanted


def open_envelope(path: Path) -> Envelope:
    """The DSSE envelope at ``path`` (a file, or a folder holding evidence.json), structure checked."""
    path = Path(path)
    if path.is_dir():
        path = path / EVIDENCE_NAME
    try:
        data = read_json(path, "DSSE evidence envelope")
    except FileFormatError as error:
        raise EvidenceError("malformed", str(error)) from None
    if data.get("payloadType") != PAYLOAD_TYPE:
        raise EvidenceError(
            "malformed", f"{path}: payloadType is {data.get('payloadType')!r}, expected {PAYLOAD_TYPE!r}"
        )
    signatures = data.get("signatures")
    if not isinstance(signatures, list) or not all(
        isinstance(s, dict) and isinstance(s.get("keyid"), str) and isinstance(s.get("sig"), str) for s in signatures
    ):
        raise EvidenceError("malformed", f"{path}: signatures must be a list of {{keyid, sig}} strings")
    return Envelope(path, _b64decode(data.get("payload"), f"{path}: payload"), signatures)


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
            and isinstance(entry.get("name"), str)
            and not Path(entry["name"]).is_absolute()
            and isinstance(entry.get("digest"), dict)
            and re.fullmatch(r"[0-9a-f]{64}", str(entry["digest"].get("sha256"))) is not None,
            f"subject entry {entry!r} lacks a relative name or a sha256 digest",
        )
    predicate = statement.get("predicate")
    need(isinstance(predicate, dict), "predicate is not an object")
    for key in ("passedTests", "warnedTests", "failedTests", "configuration"):
        need(isinstance(predicate.get(key), list), f"predicate.{key} is not a list")
    for entry in predicate["configuration"]:
        need(
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("digest"), dict)
            and isinstance(entry.get("annotations"), dict)
            and "role" in entry["annotations"],
            f"configuration entry {entry!r} lacks name, digest or role",
        )
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
    for nodeid, test in h3["tests"].items():
        need(
            isinstance(test, dict)
            and test.get("outcome") in OUTCOMES
            and isinstance(test.get("gate"), str)
            and isinstance(test.get("params"), dict)
            and (test.get("result") is None or isinstance(test["result"], dict)),
            f"test {nodeid} lacks a valid outcome, gate, params or result",
        )
        if test["result"] is not None:
            need(
                isinstance(test["result"].get("passed"), bool) and isinstance(test["result"].get("context"), dict),
                f"result of {nodeid} lacks passed or context",
            )
    try:
        Profile.from_json(h3["profile"])
    except (KeyError, TypeError) as error:
        raise EvidenceError("malformed", f"{path}: predicate.h3.profile is not a profile ({error})") from None


# Keys ------------------------------------------------------------------------------------------------------


def keygen(out_dir: Path) -> tuple[Path, Path]:
    """A new Ed25519 key pair: private PEM (mode 0600, from its first byte on disk) and public PEM."""
    out_dir = Path(out_dir)
    private_path, public_path = out_dir / PRIVATE_KEY_NAME, out_dir / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} exists: a signing key is never overwritten; choose another folder")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_atomic(private_path, private_pem)  # a mkstemp file: 0600 before any byte is written
    os.chmod(private_path, 0o600)
    write_atomic(public_path, public_pem)
    os.chmod(public_path, 0o644)
    return private_path, public_path


def _private_from_pem(pem: bytes, source: str) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as error:
        raise SigningKeyError(
            f"{source}: not an unencrypted PEM private key ({error}); create one with `h3gate keygen DIR`"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(
            f"{source}: a {type(key).__name__}, but evidence is signed with Ed25519; "
            "create one with `h3gate keygen DIR`"
        )
    return key


def load_private_key(path: str | os.PathLike | None = None) -> Ed25519PrivateKey | None:
    """The signing key from the PEM file ``path``; without one, from ``H3GATE_SIGN_KEY`` (PEM text); else None."""
    if path is not None:
        path = Path(path)
        try:
            return _private_from_pem(path.read_bytes(), str(path))
        except OSError as error:
            raise SigningKeyError(f"{path}: cannot read the signing key ({error})") from None
    text = os.environ.get(KEY_ENV)
    if not text:
        return None
    if "-----BEGIN" not in text:
        raise SigningKeyError(
            f"{KEY_ENV} must hold the PEM text of an Ed25519 private key, not a path; pass a key file as a path instead"
        )
    return _private_from_pem(text.encode(), KEY_ENV)


def load_public_key(path: str | os.PathLike) -> Ed25519PublicKey:
    path = Path(path)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as error:
        raise SigningKeyError(f"{path}: cannot read the public key ({error})") from None
    except (ValueError, UnsupportedAlgorithm) as error:
        raise SigningKeyError(
            f"{path}: not a PEM public key ({error}); `h3gate keygen` writes {PUBLIC_KEY_NAME}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path}: a {type(key).__name__}, but evidence is signed with Ed25519")
    return key


# Writing -------------------------------------------------------------------------------------------------


def write_sealed(out_dir: Path, statement: dict, sign_key: Ed25519PrivateKey | None) -> Path:
    """evidence.json (the envelope), redaction.json and SHA256SUMS (of the subjects and those two) in ``out_dir``."""
    out_dir = Path(out_dir)
    evidence = out_dir / EVIDENCE_NAME
    redaction = {
        "schema": REDACTION_SCHEMA,
        "placeholders": PLACEHOLDERS,
        "fields": statement["predicate"]["h3"]["redacted"],
    }
    write_atomic(out_dir / REDACTION_NAME, dumps(redaction))
    write_atomic(evidence, dumps(seal(statement, sign_key)))
    sums = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    for name in (EVIDENCE_NAME, REDACTION_NAME):
        sums[name] = sha256_file(out_dir / name)
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
    sign_key: Ed25519PrivateKey | None = None,
) -> Path:
    """The session-end call: build, redact, seal (signed when ``sign_key`` is given) and write the evidence.
    Subjects are named relative to ``out_dir``, where evidence.json goes. Returns the evidence.json path."""
    statement = build_statement(
        results, outcomes, required, artifacts, out_dir, thresholds, files, model, candidate, environment
    )
    return write_sealed(out_dir, statement, sign_key)


# Verifying -----------------------------------------------------------------------------------------------


@dataclass
class Verification:
    statement: dict
    result: str
    profile: str
    signature: str
    artifacts: int
    lock: str

    def line(self) -> str:
        return (
            f"{self.result} (profile {self.profile}); signature: {self.signature}; "
            f"{self.artifacts} artifacts match; lock: {self.lock}"
        )


def verify(
    evidence: Path,
    public_key: Ed25519PublicKey | None = None,
    thresholds: Path | None = None,
    root: Path | None = None,
    required: Profile | None = None,
) -> Verification:
    """Check signature, artifact digests, the thresholds lock and the verdict, in that order; the first
    failure raises an :class:`EvidenceError`. The verdict is recomputed from the tests (against ``required``
    when given, else the statement's own profile) and must equal the recorded one. Unsigned evidence passes
    only without ``public_key`` and is reported as unsigned."""
    envelope = open_envelope(evidence)
    signer = envelope.check_signature(public_key) if public_key is not None else None
    statement = envelope.statement()
    h3 = statement["predicate"]["h3"]
    if signer is not None:
        signature = f"verified (keyid {signer[:16]})"
    elif h3["signer"] is None:
        signature = "unsigned"
    else:
        signature = f"NOT CHECKED (signed by keyid {h3['signer'][:16]}; pass --key to check it)"

    root = Path(root) if root is not None else envelope.path.parent
    for subject in statement["subject"]:
        path = root / subject["name"]
        if not path.is_file():
            raise EvidenceError("digest", f"artifact {subject['name']} is missing (looked for {path})")
        found, recorded = sha256_file(path), subject["digest"]["sha256"]
        if found != recorded:
            raise EvidenceError(
                "digest",
                f"artifact {subject['name']} has sha256 {found[:16]} on disk but {recorded[:16]} in the evidence",
            )

    lock = "not checked (pass --thresholds)"
    if thresholds is not None:
        try:
            locked = verify_lock(Path(thresholds))
        except (BoundsError, FileFormatError) as error:
            raise EvidenceError("lock", str(error).replace("\n", " ")) from None
        for entry in statement["predicate"]["configuration"]:
            if entry["annotations"]["role"] not in ROLES:
                continue
            if locked.get(entry["name"]) != entry["digest"].get("sha256"):
                held = locked.get(entry["name"], "no entry")[:16]
                raise EvidenceError(
                    "lock",
                    f"{entry['annotations']['role']} {entry['name']}: "
                    f"sha256 {entry['digest'].get('sha256', '')[:16]} in the "
                    f"evidence, {held} in {Path(thresholds) / 'LOCK.json'}",
                )
        lock = f"matches {Path(thresholds) / 'LOCK.json'}"

    recorded_profile = Profile.from_json(h3["profile"])
    recomputed = tally(h3["tests"], recorded_profile)
    for key in ("result", "passedTests", "warnedTests", "failedTests"):
        if statement["predicate"][key] != recomputed[key]:
            raise EvidenceError("malformed", f"predicate.{key} does not follow from the recorded tests (edited?)")
    if h3["completeness"] != recomputed["completeness"]:
        raise EvidenceError("malformed", "predicate.h3.completeness does not follow from the recorded tests (edited?)")
    if required is not None:
        recomputed = tally(h3["tests"], required)
    required = required or recorded_profile
    if recomputed["result"] == FAILED:
        failed = recomputed["failedTests"]
        more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
        raise EvidenceError("failed", f"{len(failed)} gate test(s) failed, first {failed[0]}{more}")
    if recomputed["result"] == INCOMPLETE:
        problems = recomputed["completeness"]["problems"]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise EvidenceError("incomplete", f"incomplete for profile {required.name}: {problems[0]}{more}")
    return Verification(statement, recomputed["result"], required.name, signature, len(statement["subject"]), lock)


# Merging -------------------------------------------------------------------------------------------------


def merge(shards: list[Path], out_dir: Path, sign_key: Ed25519PrivateKey | None = None) -> Path:
    """Join the evidence of shards into one statement in ``out_dir``, equal to the unsharded run's (timings
    aside). Shards must share model, candidate, bounds, contracts and profile, and run disjoint tests; the
    difference is named otherwise. Subject names are rebased onto ``out_dir``. With ``sign_key`` every shard
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
            envelope.check_signature(sign_key.public_key())
        statement = envelope.statement()
        predicate, h3 = statement["predicate"], statement["predicate"]["h3"]
        if first is None:
            first = (envelope.path, predicate["configuration"], h3["profile"])
        else:
            first = (first[0], _joined_configuration(first, envelope.path, predicate["configuration"], h3["profile"]), first[2])
        for entry in statement["subject"]:
            name = Path(os.path.relpath((envelope.path.parent / entry["name"]).resolve(), out_dir)).as_posix()
            digest = entry["digest"]["sha256"]
            if name in subject and subject[name][0] != digest:
                raise EvidenceError(
                    "conflict",
                    f"artifact {name}: sha256 {subject[name][0][:16]} in {subject[name][1]}, "
                    f"{digest[:16]} in {envelope.path}",
                )
            subject[name] = (digest, envelope.path)
        for nodeid, test in h3["tests"].items():
            if nodeid in tests:
                raise EvidenceError(
                    "conflict",
                    f"test {nodeid} is in both {tests[nodeid][1]} and {envelope.path}: shards must run disjoint items",
                )
            tests[nodeid] = (test, envelope.path)
        for key, environment in h3["environments"].items():
            if environments.setdefault(key, environment) != environment:
                raise EvidenceError("conflict", f"environment {key} differs between shards (edited?): {envelope.path}")
        redacted.update(h3["redacted"])
    merged = assemble(
        [{"name": name, "digest": {"sha256": digest}} for name, (digest, _) in subject.items()],
        first[1],
        {nodeid: test for nodeid, (test, _) in tests.items()},
        environments,
        Profile.from_json(first[2]),
        redacted,
    )
    return write_sealed(out_dir, merged, sign_key)


def _joined_configuration(first: tuple, path: Path, config: list[dict], profile_json: dict) -> list[dict]:
    """The union of two shards' configurations; a shard measured against anything else than the others (another
    profile, or the same file with another digest) is refused with the first difference named. A bounds file
    only one shard used (its gate items ran there) is no difference."""
    first_path, first_config, first_profile = first
    if profile_json != first_profile:
        raise EvidenceError(
            "conflict", f"profile {profile_json['name']} in {path}, {first_profile['name']} in {first_path}"
        )
    theirs, ours = {d["name"]: d for d in first_config}, {d["name"]: d for d in config}
    for name in sorted(set(theirs) & set(ours)):
        if theirs[name] != ours[name]:
            role = ours[name]["annotations"]["role"]
            mine, other = ours[name]["digest"].get("sha256", ""), theirs[name]["digest"].get("sha256", "")
            what = (
                f"sha256 {mine[:16]} in {path}, {other[:16]} in {first_path}" if mine != other else "annotations differ"
            )
            raise EvidenceError("conflict", f"{role} {name}: {what}")
    return sorted({**theirs, **ours}.values(), key=lambda d: d["name"])
