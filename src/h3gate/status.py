"""What a model's gates need frozen under ``thresholds/`` on one device class, and the state of each file.

Each file is ``present and locked`` (its sha256 is its entry in ``LOCK.json``), ``missing`` (with the command
that makes it), or ``stale`` (its sha256 differs from its lock entry, or it has none). Every file is listed once,
under the gate whose registry entry declares it (:class:`h3gate.gates.Frozen`): the model's contract and bounds, each
block's bounds and captured inputs, the generation and preflight contracts and bounds. The kernel gate needs no
frozen file; the power gate needs the model, block and preflight files.

Light on purpose: torch is imported only to name a device class (:func:`h3gate.bounds.device_class`), so
``h3gate status`` and the pytest header cost nothing where it is already loaded.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from h3gate.commands import contracts_command, freeze_command, lock_command, pytest_command
from h3gate.model.presets import RELEASE, TRANSFORMER_CONFIGS
from h3gate.model.spec import model_name, num_layers

PRESENT = "present and locked"
MISSING = "missing"
STALE = "stale"
STATES = (PRESENT, MISSING, STALE)

DEFAULT_THRESHOLDS = "thresholds"


# Commands ---------------------------------------------------------------------------------------------


# The profile whose gates read the frozen files: what a folder with all of them present can be checked for.
CHECKED_PROFILE = "checkpoint"


def check_command(suite: str | None, model: str, device: str, thresholds: str | Path | None = None) -> str:
    """The command that checks a candidate with every gate test of ``suite`` that reads frozen files (block, model,
    generation), for the completeness profile of those gates (:data:`CHECKED_PROFILE`; the kernel gate, which
    reads none, is another run's)."""
    from h3gate.gates import REGISTRY
    from h3gate.evidence.profiles import profile
    from h3gate.suite import targets

    gates = {requirement.gate for requirement in profile(CHECKED_PROFILE).requirements}
    items = [frozen.item.partition("[")[0] for gate in REGISTRY.values() if gate.name in gates
             for frozen in gate.frozen if frozen.item]
    selected = [target for item in dict.fromkeys(items) for target in targets(suite, item)]
    return pytest_command(list(dict.fromkeys(selected)), [], model, device, thresholds,
                           [f"--h3-profile={CHECKED_PROFILE}"])


def device_option(device_class: str) -> str:
    """The ``--h3-device`` of a device class: ``cpu``, or ``cuda`` for every GPU kind."""
    return "cpu" if device_class == "cpu" else "cuda"


def default_device(model: str | None = None) -> str:
    """cuda when a GPU is visible, else cpu; always cuda for the release model, which is built on one."""
    if model == RELEASE:
        return "cuda"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_class_of(device: str) -> str:
    if device == "cpu":
        return "cpu"
    if not device.startswith("cuda"):
        raise ValueError(f"device {device!r} is not cpu, cuda or cuda:N")
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA device is visible here, so its device class is unknown")
    from h3gate.bounds import device_class

    return device_class(device)


# Status -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    gate: str
    file: str  # relative to the thresholds folder, as in LOCK.json
    state: str  # PRESENT, MISSING or STALE
    command: str = ""  # what makes the file present and locked ("" when it is)
    detail: str = ""  # why it is stale


@dataclass
class Status:
    model: str
    device_class: str
    thresholds: Path
    rows: list[Row]

    def count(self, state: str) -> int:
        return sum(row.state == state for row in self.rows)

    @property
    def ok(self) -> bool:
        return all(row.state == PRESENT for row in self.rows)

    def line(self) -> str:
        """One line: ``tiny/cpu: 9 present and locked, 0 missing, 0 stale``."""
        counts = ", ".join(f"{self.count(state)} {state}" for state in STATES)
        return f"{self.model}/{self.device_class}: {counts}"

    def table(self) -> str:
        """The rows as an aligned text table, each file's command (or why it is stale) under it."""
        width_gate = max([len("gate")] + [len(row.gate) for row in self.rows])
        width_file = max([len("file")] + [len(row.file) for row in self.rows])
        lines = [f"thresholds {self.thresholds} for {self.model} on {self.device_class}",
                 f"{'gate':{width_gate}}  {'file':{width_file}}  state"]
        for row in self.rows:
            lines.append(f"{row.gate:{width_gate}}  {row.file:{width_file}}  {row.state}")
            if row.detail:
                lines.append(f"{'':{width_gate}}    {row.detail}")
            if row.command:
                lines.append(f"{'':{width_gate}}    {'fix' if row.state == STALE else 'make it'}: {row.command}")
        lines.append(self.line())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"model": self.model, "device_class": self.device_class, "thresholds": str(self.thresholds),
                "rows": [asdict(row) for row in self.rows], "ok": self.ok}


def _expected(model: str, device_class: str, layers: int) -> list[tuple[str, str, str, str]]:
    """(gate, file relative to the thresholds folder, kind, the item that freezes it) of every frozen file the
    registered gates read (:class:`h3gate.gates.Frozen`), a block's files together."""
    from h3gate.gates import REGISTRY

    rows = []
    for gate in REGISTRY.values():
        files = [(block, path, frozen.kind, item) for frozen in gate.frozen
                 for block, (path, item) in enumerate(frozen.files(model, device_class, layers))]
        rows += [(gate.name, path, kind, item) for _, path, kind, item in sorted(files, key=lambda f: f[0])]
    return rows


def freezing_item(relative: str, model: str, device_class: str, layers: int) -> str | None:
    """The gate-suite item (``<file>::<test>``) whose freeze writes the file ``relative`` (to the thresholds folder),
    or None where no registered gate declares it."""
    return next((item for _, path, kind, item in _expected(model, device_class, layers)
                 if path == relative and kind != "contract"), None)


def _command(relative: str, kind: str, item: str, state: str, model: str, device: str, shown: str | None,
             present: set[str], suite: str | None) -> str:
    """What makes one file present and locked: lock a contract; freeze bounds (and a block's capture with them)."""
    from h3gate.suite import targets

    if kind == "contract" and state == MISSING:  # the defaults for the model, written and locked
        return contracts_command(model, shown)
    if kind == "contract":
        return lock_command(Path(shown or DEFAULT_THRESHOLDS) / relative, shown) + "  (if the edit is meant; else restore it)"
    bounds = relative.replace("-capture.safetensors", "-bounds.json")
    if kind == "capture" and bounds in present:
        # Frozen with its block's bounds; made again only if bitwise the frozen one (else copied from where it was).
        parts = ["h3gate", "capture", str(Path(shown or DEFAULT_THRESHOLDS) / relative)]
        if model not in TRANSFORMER_CONFIGS:
            parts.append(f"--model={model}")
        return " ".join(shlex.quote(part) for part in parts)
    # Bounds that exist are re-frozen only with a recorded reason.
    return freeze_command(targets(suite, item), model, device, shown, force=state == STALE)


def status(thresholds: str | Path = DEFAULT_THRESHOLDS, model: str = "tiny", device: str | None = None,
           device_class: str | None = None, digest=None, gates: Collection[str] | None = None,
           shown: str | None = ...) -> Status:
    """The state of every file ``model``'s gates (or those of ``gates`` only) read on ``device`` (default: cuda
    when visible, else cpu).

    ``thresholds`` appears in the commands as given (relative stays relative), or as ``shown`` says (None: the
    default folder, named by no option; a pytest session reads an absolute path); ``device_class`` overrides the
    one of ``device`` (a folder frozen on another machine's GPU); ``digest`` (default: sha256 of the file) lets a
    caller that asks often use cached digests of large files (release-size captures are 0.8 GB a block)."""
    from h3gate.bounds import read_lock
    from h3gate.files import FileFormatError, sha256_file
    from h3gate.suite import recorded

    digest = digest or sha256_file

    device = device or default_device(model)
    device_class = device_class or device_class_of(device)
    if shown is ...:
        shown = None if str(thresholds) == DEFAULT_THRESHOLDS else str(thresholds)
    root = Path(thresholds)
    name = model_name(model)
    try:
        lock, unreadable = read_lock(root), ""
    except FileFormatError as error:
        lock, unreadable = {}, str(error)
    expected = [row for row in _expected(name, device_class, num_layers(model)) if gates is None or row[0] in gates]
    present = {relative for _, relative, _, _ in expected if (root / relative).is_file()}
    suite = recorded(root)
    rows = []
    for gate, relative, kind, item in expected:
        detail = ""
        if relative not in present:
            state = MISSING
        elif unreadable:
            state, detail = STALE, f"the lock is unreadable: {unreadable}"
        elif relative not in lock:
            state, detail = STALE, "not in LOCK.json"
        elif digest(root / relative) != lock[relative]:
            state, detail = STALE, "sha256 differs from its LOCK.json entry (edited after it was frozen)"
        else:
            state = PRESENT
        command = "" if state == PRESENT else _command(
            relative, kind, item, state, model, device_option(device_class), shown, present, suite)
        rows.append(Row(gate, relative, state, command, detail))
    return Status(name, device_class, root, rows)
