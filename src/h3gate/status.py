"""What a model's gates need frozen under ``thresholds/`` on one device class, and the state of each file.

Each file is ``present and locked`` (its sha256 is its entry in ``LOCK.json``), ``missing`` (with the command
that makes it), or ``stale`` (its sha256 differs from its lock entry, or it has none). Every file is listed once,
under the gate that owns it:

- model: ``<model>/model-contract.json`` (the block gate reads it too), ``<model>/<device>/model-bounds.json``;
- block: per block N, ``block<N>-bounds.json`` and the block's captured inputs ``block<N>-capture.safetensors``
  frozen beside them;
- generation: ``generation-contract.json`` and ``generation-bounds.json``, ``generation-preflight-contract.json``
  and ``generation-preflight-bounds.json`` (the preflight item's, which the power gate uses too).

The kernel gate needs no frozen file; the power gate needs the model, block and preflight files.

Light on purpose: torch is imported only to name a device class (:func:`h3gate.bounds.device_class`), so
``h3gate status`` and the pytest header cost nothing where it is already loaded.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

from h3gate.presets import LAYERS_VARIABLE, RELEASE, RELEASE_CONFIG, TRANSFORMER_CONFIGS, release_layers, release_name

PRESENT = "present and locked"
MISSING = "missing"
STALE = "stale"
STATES = (PRESENT, MISSING, STALE)

# The gate suite's items (``pytest -m gate tests/gates``) that freeze each kind of bounds.
FREEZING_ITEMS = {
    "model": "tests/gates/test_model.py::test_model",
    "block": "tests/gates/test_block.py::test_block[block{block}]",
    "generation": "tests/gates/test_generation.py::test_generation",
    "generation-preflight": "tests/gates/test_generation.py::test_generation_preflight",
}
GENERATION_CONTRACTS = ("generation", "generation-preflight")
DEFAULT_THRESHOLDS = "thresholds"


# The model, named without building it -----------------------------------------------------------------


def transformer_folder(root: Path) -> Path | None:
    """The folder holding a checkpoint's transformer config: ``transformer/`` of a pipeline folder, or the folder
    itself when it holds a transformer only; None when there is neither."""
    for folder in (root / "transformer", root):
        if (folder / "config.json").is_file():
            return folder
    return None


TRANSFORMER_CLASS = "MiniMaxH3Transformer3DModel"  # the ``_class_name`` diffusers writes into its config


def not_a_checkpoint(folder: Path) -> str | None:
    """Why a folder is no MiniMax-H3 checkpoint at first sight (no transformer config, or the config of another
    diffusers model, whose fields the gates would miss), or None; its weights are checked when the model loads."""
    from h3gate.files import FileFormatError, read_json

    found = transformer_folder(folder)
    if found is None:
        return (f"{folder} is a folder but not a MiniMax-H3 checkpoint: it holds neither transformer/config.json nor "
                "config.json; pass a checkpoint folder (h3gate checkpoint make writes one)")
    config = found / "config.json"
    try:
        fields = read_json(config, "transformer config")
    except FileFormatError as error:
        return f"{error}: the checkpoint is damaged; copy it again"
    if fields.get("_class_name") != TRANSFORMER_CLASS:
        return (f"{folder} is a folder but not a MiniMax-H3 checkpoint: {config} describes a "
                f"{fields.get('_class_name')!r}, not a {TRANSFORMER_CLASS}; pass a MiniMax-H3 checkpoint folder")
    layers = fields.get("num_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        return f"{config}: num_layers is {layers!r}, not a count of blocks: the checkpoint is damaged; copy it again"
    return None


def _checkpoint_config(spec: str) -> dict:
    folder = transformer_folder(Path(spec))
    problem = not_a_checkpoint(Path(spec)) if Path(spec).is_dir() else None
    if problem:
        raise ValueError(problem)
    if folder is None:
        raise ValueError(f"unknown model {spec!r}: use one of {', '.join(TRANSFORMER_CONFIGS)} or a checkpoint folder")
    path = folder / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a readable transformer config ({error})") from error


def model_name(spec: str) -> str:
    """The name a model's thresholds folder has: the preset's name (``release-layers<N>`` for the release model's
    leading ``$H3GATE_LAYERS`` blocks), or for a checkpoint folder its name and the first
    12 hex digits of a digest of its transformer (config and weight files), so two checkpoints of one name (two
    fine-tunes both called ``minimax-h3``) keep their thresholds apart. Weight digests are cached by path, size and
    mtime (:func:`h3gate.files.file_digests`): a checkpoint is hashed once."""
    if spec in TRANSFORMER_CONFIGS:
        return spec
    if spec == RELEASE:
        return release_name(release_layers())
    from h3gate.files import file_digests

    root = Path(spec).resolve()
    config = _checkpoint_config(str(root))
    folder = transformer_folder(root)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{folder} has a transformer config.json but no *.safetensors weight files")
    parts = [json.dumps(config, sort_keys=True)] + [f"{path.name}:{digest}"
                                                    for path, digest in zip(weights, file_digests(weights, sys.stderr))]
    return f"{root.name}-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:12]}"


def model_source(spec: str, seed: int = 0) -> str:
    """What :func:`h3gate.model.load_model` records as the model's ``source``, without loading it."""
    if spec == RELEASE:
        layers = release_layers()
        return f"preset:{spec}:seed={seed}" + ("" if layers == RELEASE_CONFIG["num_layers"] else f":layers={layers}")
    return f"preset:{spec}:seed={seed}" if spec in TRANSFORMER_CONFIGS else str(Path(spec).resolve())


def transformer_config(spec: str) -> dict:
    """The transformer config of a model without building it: a preset's, or a checkpoint's config.json."""
    if spec == RELEASE:
        return {**RELEASE_CONFIG, "num_layers": release_layers()}
    return TRANSFORMER_CONFIGS.get(spec) or _checkpoint_config(spec)


def num_layers(spec: str) -> int:
    config = transformer_config(spec)
    if not isinstance(config.get("num_layers"), int):
        raise ValueError(f"the transformer config of {spec!r} has no integer num_layers")
    return config["num_layers"]


# Commands ---------------------------------------------------------------------------------------------


def freeze_command(target: str, model: str, device: str, thresholds: str | Path | None = None, force: bool = False) -> str:
    """The exact command that freezes the bounds of the gate items ``target`` (a test file or node id) selects."""
    parts = ["pytest", target, "--h3-freeze", f"--h3-model={model}", f"--h3-device={device}"]
    if model == RELEASE and release_layers() != RELEASE_CONFIG["num_layers"]:  # the partial model of this shell
        parts.insert(0, f"{LAYERS_VARIABLE}={release_layers()}")
    if thresholds:
        parts.append(f"--h3-thresholds={thresholds}")
    if force:
        parts.append("--h3-freeze-force=REASON")
    return " ".join(shlex.quote(str(part)) for part in parts)


def lock_command(path: Path, thresholds: str | Path | None) -> str:
    parts = ["h3gate", "lock", str(path)]
    if thresholds:
        parts.append(f"--thresholds={thresholds}")
    return " ".join(shlex.quote(part) for part in parts)


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


def _expected(model: str, device_class: str, layers: int) -> list[tuple[str, str, str]]:
    """(gate, file relative to the thresholds folder, what kind of file) of every frozen file the gates read."""
    here = f"{model}/{device_class}"
    files = [("model", f"{model}/model-contract.json", "contract"), ("model", f"{here}/model-bounds.json", "bounds")]
    for block in range(layers):
        files.append(("block", f"{here}/block{block}-bounds.json", "bounds"))
        files.append(("block", f"{here}/block{block}-capture.safetensors", "capture"))
    for contract in GENERATION_CONTRACTS:
        files.append(("generation", f"{model}/{contract}-contract.json", "contract"))
        files.append(("generation", f"{here}/{contract}-bounds.json", "bounds"))
    return files


def _command(gate: str, relative: str, kind: str, state: str, model: str, device: str, shown: str | None,
             present: set[str]) -> str:
    """What makes one file present and locked: lock a contract; freeze bounds (and a block's capture with them)."""
    if kind == "contract":
        command = lock_command(Path(shown or DEFAULT_THRESHOLDS) / relative, shown)
        return command + ("  (after writing the contract)" if state == MISSING else "  (if the edit is meant; else restore it)")
    bounds = relative.replace("-capture.safetensors", "-bounds.json")
    if kind == "capture" and bounds in present:
        # Frozen with its block's bounds; made again only if bitwise the frozen one (else copied from where it was).
        parts = ["h3gate", "capture", str(Path(shown or DEFAULT_THRESHOLDS) / relative)]
        if model not in TRANSFORMER_CONFIGS:
            parts.append(f"--model={model}")
        return " ".join(shlex.quote(part) for part in parts)
    stem = Path(bounds).name.removesuffix("-bounds.json")
    item = FREEZING_ITEMS["block" if gate == "block" else stem].format(block=stem.removeprefix("block"))
    # Bounds that exist are re-frozen only with a recorded reason.
    return freeze_command(item, model, device, shown, force=state == STALE)


def status(thresholds: str | Path = DEFAULT_THRESHOLDS, model: str = "tiny", device: str | None = None,
           device_class: str | None = None, digest=None, gates: Collection[str] | None = None) -> Status:
    """The state of every file ``model``'s gates (or those of ``gates`` only) read on ``device`` (default: cuda
    when visible, else cpu).

    ``thresholds`` appears in the commands as given (relative stays relative); ``device_class`` overrides the
    one of ``device`` (a folder frozen on another machine's GPU); ``digest`` (default: sha256 of the file) lets a
    caller that asks often use cached digests of large files (release-size captures are 0.8 GB a block)."""
    from h3gate.bounds import read_lock
    from h3gate.files import FileFormatError, sha256_file

    digest = digest or sha256_file

    device = device or default_device(model)
    device_class = device_class or device_class_of(device)
    shown = None if str(thresholds) == DEFAULT_THRESHOLDS else str(thresholds)
    root = Path(thresholds)
    name = model_name(model)
    try:
        lock, unreadable = read_lock(root), ""
    except FileFormatError as error:
        lock, unreadable = {}, str(error)
    expected = [row for row in _expected(name, device_class, num_layers(model)) if gates is None or row[0] in gates]
    present = {relative for _, relative, _ in expected if (root / relative).is_file()}
    rows = []
    for gate, relative, kind in expected:
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
            gate, relative, kind, state, model, device_option(device_class), shown, present)
        rows.append(Row(gate, relative, state, command, detail))
    return Status(name, device_class, root, rows)
