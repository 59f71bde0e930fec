"""The candidate lock: the candidate a reviewer expects, bound beyond its name.

A name binds little: an edited ``h3_triton``, or one with op groups run as the provider's, is still called
``h3_triton``. The lock pins the candidate's whole identity (source digest, options, triton version, interpreter,
tiling: what its ``identity()`` records) and the h3gate (version and source digest) that must have written the
evidence. ``h3gate identity --candidate SPEC --lock FILE`` writes it where the gates run, and ``h3gate verify
--expect-candidate-lock FILE`` refuses evidence of any other candidate or tool as a mismatch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from h3gate.evidence.signing import EvidenceError, canonical
from h3gate.files import FileFormatError, read_json, write_json

SCHEMA = "h3gate.candidate-lock/1"


@dataclass(frozen=True)
class CandidateLock:
    path: Path
    identity: dict
    tool: dict

    def check(self, statement: dict) -> None:
        """The evidence's candidate identity and writer are the locked ones, or a ``mismatch`` naming what differs."""
        from h3gate.evidence.statement import candidate_digest

        entry = next(e for e in statement["predicate"]["configuration"] if e["annotations"]["role"] == "candidate")
        found = entry["annotations"]["identity"]
        if found != self.identity:
            fields = sorted(k for k in {*found, *self.identity} if found.get(k) != self.identity.get(k))
            raise EvidenceError(
                "mismatch",
                f"the evidence qualifies candidate {found['name']} {candidate_digest(found)[:16]}, not the one "
                f"{self.path} locks ({self.identity['name']} {candidate_digest(self.identity)[:16]}): "
                f"{', '.join(map(str, fields))} differ",
            )
        writer = statement["predicate"]["h3"]["tool"]
        if (writer.get("version"), writer.get("source_sha256")) != (self.tool["version"], self.tool["source_sha256"]):
            raise EvidenceError(
                "mismatch",
                f"h3gate {writer.get('version')} source {str(writer.get('source_sha256'))[:16]} wrote the evidence; "
                f"{self.path} expects h3gate {self.tool['version']} source {self.tool['source_sha256'][:16]}",
            )


def write(path: Path, identity: dict) -> CandidateLock:
    """The lock of the candidate ``identity``, written by this h3gate (whose version and source digest it pins)."""
    from h3gate.evidence.statement import tool

    identity = json.loads(canonical(identity))
    writer = tool()
    write_json(path, {"schema": SCHEMA, "candidate": identity, "tool": writer})
    return CandidateLock(Path(path), identity, writer)


def read(path: Path) -> CandidateLock:
    """A lock :func:`write` wrote; anything else is a :class:`FileFormatError` naming the file."""
    data = read_json(path, "candidate lock")
    identity, writer = data.get("candidate"), data.get("tool")
    if (
        data.get("schema") != SCHEMA
        or not (isinstance(identity, dict) and isinstance(identity.get("name"), str))
        or not (isinstance(writer, dict) and isinstance(writer.get("source_sha256"), str) and "version" in writer)
    ):
        raise FileFormatError(path, f"not a candidate lock ({SCHEMA}); write one with "
                              "`h3gate identity --candidate SPEC --lock FILE`")
    return CandidateLock(Path(path), identity, writer)
