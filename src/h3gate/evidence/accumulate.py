"""Joining the sessions of one output folder: each session's statement added to the evidence earlier sessions left
there, the join :mod:`h3gate.evidence.merge` makes of shards, but a test in both is the newest session's.

One joined statement rather than one per session: a reviewer asks of a folder whether this candidate is qualified on
this model, and a qualification is run in parts (the cheap gates, then the generation; a rerun of a crashed item).
"""

from __future__ import annotations

from pathlib import Path

from h3gate.bounds import read_lock
from h3gate.evidence.merge import joined_configuration, redacted_by_index, redacted_by_name
from h3gate.evidence.profiles import SESSION_WIDE, Profile, verdict
from h3gate.evidence.redaction import pointer_token
from h3gate.evidence.signing import EVIDENCE_NAME, EvidenceError, PrivateKey, open_envelope
from h3gate.evidence.statement import assemble, statement_of, write_sealed
from h3gate.evidence.verify import check_locked, check_subjects


def _reached_verdict(test: dict) -> bool:
    """Whether a test's gate reached a verdict (passed, warned, failed, not claimed), rather than leaving a gap."""
    return verdict(test) not in ("skipped", "deselected", "crashed")


def accumulate(previous: Path, statement: dict, sign_key: PrivateKey | None, thresholds: Path) -> dict:
    """``statement`` (a session's, just built) joined to the evidence ``previous`` of the same output folder: every
    test of either, the session's where both have one, unless the session reached no verdict on it (skipped,
    deselected, crashed, interrupted) and the earlier one did; an earlier session's entry of a worker it lost does not
    carry over (:data:`SESSION_WIDE`); subjects, environments and configuration joined. Both
    must qualify the same model and candidate against the same bounds and contracts, judged by the same h3gate, and be
    signed by the same key (or both unsigned: a key must not vouch for what nobody signed); the earlier bounds and
    contracts must still be those of the ``thresholds`` lock, and the earlier files the session did not write again
    must still have the digests the earlier evidence records; the session's profile is the joined one's. Anything else
    is an :class:`EvidenceError` naming the difference, and nothing is written: ``previous`` stays as it was."""
    envelope = open_envelope(previous)
    if sign_key is not None:
        envelope.check_signature([sign_key.public_key()])
    elif envelope.signatures:
        raise EvidenceError("conflict", f"{envelope.path} is signed (keyid {envelope.signed_by()[0][:16]}) and this "
                            "session has no key: its evidence could not join without losing that signature")
    earlier = statement_of(envelope)
    root = envelope.path.parent
    # the files the session wrote again (an item's artifact rerun on another CPU holds other numbers) are the
    # session's, digested as it wrote them; the earlier ones it left alone must be as the earlier evidence says
    rewritten = {entry["name"] for entry in statement["subject"]}
    try:
        check_subjects({"subject": [entry for entry in earlier["subject"] if entry["name"] not in rewritten]}, root)
    except EvidenceError as error:
        raise EvidenceError("conflict", f"the evidence in {root} no longer matches its files ({error.reason})") from None
    check_locked(earlier, read_lock(thresholds), thresholds)  # the session start verified the files against it
    h3, old = statement["predicate"]["h3"], earlier["predicate"]["h3"]
    first = (envelope.path, earlier["predicate"]["configuration"], old["profile"], old["tool"])
    config = joined_configuration(first, Path("this session"), statement["predicate"]["configuration"], h3["tool"])
    tests = {nodeid: test for nodeid, test in old["tests"].items() if test["gate"] != SESSION_WIDE}
    replaced = set(old["tests"]) - set(tests)
    for nodeid, test in h3["tests"].items():
        if nodeid in tests and not _reached_verdict(test) and _reached_verdict(tests[nodeid]):
            continue
        tests[nodeid] = test
        replaced.add(nodeid)
    environments = dict(old["environments"])
    for key, environment in h3["environments"].items():
        if environments.setdefault(key, environment) != environment:
            raise EvidenceError("conflict", f"environment {key} differs from the one {envelope.path} records (edited?)")
    kept = {pointer: kinds
            for pointer, kinds in redacted_by_name(old["redacted"], earlier["predicate"]["configuration"]).items()
            if not any(pointer.startswith(f"/predicate/h3/tests/{pointer_token(nodeid)}/") for nodeid in replaced)}
    ours = redacted_by_name(h3["redacted"], statement["predicate"]["configuration"])
    subject = {entry["name"]: entry for entry in earlier["subject"]}
    subject.update({entry["name"]: entry for entry in statement["subject"]})
    return assemble(list(subject.values()), config, tests, environments, Profile.from_json(h3["profile"]),
                    redacted_by_index({**kept, **ours}, config), h3["tool"], h3["created"])


def add_session(out_dir: Path, statement: dict, sign_key: PrivateKey | None, thresholds: Path) -> tuple[Path, dict]:
    """Seal ``statement`` as the evidence of ``out_dir``, joined to the evidence earlier sessions left there
    (:func:`accumulate`); returns the evidence path and the statement sealed."""
    previous = Path(out_dir) / EVIDENCE_NAME
    joined = accumulate(previous, statement, sign_key, thresholds) if previous.exists() else statement
    return write_sealed(out_dir, joined, sign_key), joined
