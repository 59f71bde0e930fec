"""Verifying evidence: signature, identity, artifact digests, the sidecar files, the thresholds lock and the verdict,
recomputed from the recorded tests; and signing a run's unsigned evidence once it verifies here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from h3gate.bounds import BoundsError, verify_lock
from h3gate.evidence.profiles import FAILED, INCOMPLETE, PROFILES, Profile, tally, verdict
from h3gate.evidence.redaction import REDACTION_NAME, redaction_record
from h3gate.evidence.signing import EVIDENCE_NAME, EvidenceError, PrivateKey, PublicKey, open_envelope
from h3gate.evidence.statement import ROLES, SUMS_NAME, name_problem, statement_of, tool, write_sealed
from h3gate.files import MAX_JSON_BYTES, FileFormatError, loads_limited, read_regular, sha256_file, sha256_regular

if TYPE_CHECKING:
    from h3gate.evidence.candidate_lock import CandidateLock


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
