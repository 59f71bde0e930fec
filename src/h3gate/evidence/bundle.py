"""Bundling evidence: the envelope, its sidecar files and every artifact it names copied into a new folder, the upload
a reviewer verifies as downloaded."""

from __future__ import annotations

from pathlib import Path

from h3gate.evidence.redaction import REDACTION_NAME
from h3gate.evidence.signing import EVIDENCE_NAME, EvidenceError, open_envelope
from h3gate.evidence.statement import SUMS_NAME, statement_of


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

