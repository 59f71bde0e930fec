"""Merging the evidence of shards (xdist, Slurm array tasks) into one statement, equal to the unsharded run's (timings
aside); shards of different identities are refused with the first difference named."""

from __future__ import annotations

import os
import re
from pathlib import Path

from h3gate.evidence.profiles import Profile
from h3gate.evidence.signing import EvidenceError, PrivateKey, open_envelope
from h3gate.evidence.statement import assemble, name_problem, statement_of, utc_now, write_sealed
from h3gate.files import FileFormatError


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
            joined = joined_configuration(first, envelope.path, predicate["configuration"], h3["tool"])
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
        redacted.update(redacted_by_name(h3["redacted"], predicate["configuration"]))
    merged = assemble(
        [{"name": name, "digest": {"sha256": digest}} for name, (digest, _) in subject.items()],
        first[1],
        {nodeid: test for nodeid, (test, _) in tests.items()},
        environments,
        Profile.from_json(first[2]),
        redacted_by_index(redacted, first[1]),
        first[3],
        utc_now(),
    )
    return write_sealed(out_dir, merged, sign_key)


def joined_configuration(first: tuple, path: Path, config: list[dict], writer: dict) -> list[dict]:
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
_NAMED = re.compile(r"/predicate/configuration/#(.+?)(/annotations.*)")


def redacted_by_name(redacted: dict, config: list[dict]) -> dict:
    """Redaction pointers with a configuration entry's index replaced by its name (``#name``): indices shift when two
    statements' configurations are joined."""
    named = {}
    for pointer, kinds in redacted.items():
        match = _CONFIGURATION.fullmatch(pointer)
        named[f"/predicate/configuration/#{config[int(match[1])]['name']}{match[2] or ''}" if match else pointer] = kinds
    return named


def redacted_by_index(redacted: dict, config: list[dict]) -> dict:
    """:func:`redacted_by_name` undone against the joined configuration (sorted by name, as ``assemble`` has it)."""
    index = {entry["name"]: i for i, entry in enumerate(sorted(config, key=lambda d: d["name"]))}
    restored = {}
    for pointer, kinds in redacted.items():
        match = _NAMED.fullmatch(pointer)
        restored[f"/predicate/configuration/{index[match[1]]}{match[2]}" if match else pointer] = kinds
    return dict(sorted(restored.items()))
