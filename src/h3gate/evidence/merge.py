"""Merging the evidence of shards (xdist, Slurm array tasks) into one statement, equal to the unsharded run's (timings
aside); shards of different identities are refused with the first difference named."""

from __future__ import annotations

import os
from pathlib import Path

from h3gate.evidence.profiles import Profile
from h3gate.evidence.signing import EvidenceError, PrivateKey, open_envelope
from h3gate.evidence.statement import assemble, name_problem, statement_of, utc_now, write_sealed
from h3gate.files import FileFormatError


def merge(shards: list[Path], out_dir: Path, sign_key: PrivateKey | None = None) -> Path:
    """Join the evidence of shards into one statement in ``out_dir``, equal to the unsharded run's (timings
    aside). Shards must share model, candidate, bounds, contracts and profile, and run disjoint tests; the
    difference is named otherwise. Subject names are rebased onto ``out_dir``, which must hold every shard's
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
            joined = _joined_configuration(first, envelope.path, predicate["configuration"], h3["profile"], h3["tool"])
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
        first[3],
        utc_now(),
    )
    return write_sealed(out_dir, merged, sign_key)


def _joined_configuration(first: tuple, path: Path, config: list[dict], profile_json: dict, writer: dict) -> list[dict]:
    """The union of two shards' configurations; a shard measured against anything else than the others (another
    profile, model or candidate, the same file with another digest) or judged by another h3gate is refused with
    the first difference named. A bounds file only one shard used (its gate items ran there) is no difference."""
    first_path, first_config, first_profile, first_tool = first
    if profile_json != first_profile:
        raise EvidenceError(
            "conflict", f"profile {profile_json['name']} in {path}, {first_profile['name']} in {first_path}"
        )
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

