"""The commands the tool prints for a person to run, built in one place: a command that freezes bounds (or checks a
candidate) with pytest, writes a model's contracts, locks an edited contract. Strings only: a leaf, which the gates,
``h3gate status`` and the plugin all call.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from h3gate.model.presets import LAYERS_VARIABLE, RELEASE, RELEASE_CONFIG, release_layers


def pytest_command(targets: list[str], flags: list[str], model: str, device: str, thresholds, last=()) -> str:
    """``pytest`` with ``targets`` and ``flags``, the model, device and thresholds folder (when not the default), then
    ``last``; the partial release model of this shell named by its variable."""
    parts = ["pytest", *targets, *flags, f"--h3-model={model}", f"--h3-device={device}"]
    if model == RELEASE and release_layers() != RELEASE_CONFIG["num_layers"]:  # the partial model of this shell
        parts.insert(0, f"{LAYERS_VARIABLE}={release_layers()}")
    if thresholds:
        parts.append(f"--h3-thresholds={thresholds}")
    return " ".join(shlex.quote(str(part)) for part in [*parts, *last])


def freeze_command(targets: list[str], model: str, device: str, thresholds: str | Path | None = None,
                   force: bool = False) -> str:
    """The exact command that freezes the bounds of the gate items ``targets`` (pytest arguments: node ids, or
    :func:`h3gate.suite.targets`) select."""
    return pytest_command(targets, ["--h3-freeze"], model, device, thresholds,
                          ["--h3-freeze-force=REASON"] if force else [])


def contracts_command(model: str, thresholds: str | Path | None = None) -> str:
    """The command that writes and locks a model's default contracts."""
    parts = ["h3gate", "contracts", f"--model={model}"] + ([f"--thresholds={thresholds}"] if thresholds else [])
    return " ".join(shlex.quote(str(part)) for part in parts)


def lock_command(path: Path, thresholds: str | Path | None) -> str:
    """The command that locks an edited contract."""
    parts = ["h3gate", "lock", str(path)]
    if thresholds:
        parts.append(f"--thresholds={thresholds}")
    return " ".join(shlex.quote(part) for part in parts)
