"""What every ``h3gate`` command shares: printing what evidence holds safely, refusing in one line with an exit code,
checking an output folder and a ``--device``."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path


def printable(text: str) -> str:
    """``text`` on one line with every control or format character escaped: what evidence holds is printed,
    and an escape sequence in it must not repaint the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(text))


def refuse(command: str, code: int, reason: str) -> int:
    print(printable(f"h3gate {command}: {reason}"), file=sys.stderr)
    return code


def free_folder(path: Path) -> str | None:
    """Why ``path`` cannot be an output folder (it is a file, or sits under one), or None."""
    blocking = next((p for p in (path, *path.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        return f"{blocking} is a file, not a folder: give a folder"
    return None


def device_problem(device: str | None) -> str | None:
    """Why ``--device`` names no device the gates run on, or None; torch would accept others (mps, meta) and fail
    later, or refuse a typo with a traceback."""
    import re

    if device is None or re.fullmatch(r"cpu|cuda(:\d+)?", device):
        return None
    return f"--device {device}: not a device; use cpu, cuda or cuda:N"


class Refused(Exception):
    """A command's refusal: its exit code and the one line that says why (:func:`h3gate.cli.main` prints it)."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code, self.reason = code, reason


@contextlib.contextmanager
def refusing(*errors: type[BaseException], code: int = 2):
    """Any of ``errors`` raised in the body refuses the command with its message."""
    try:
        yield
    except errors as error:
        raise Refused(code, str(error)) from None


def device(option: str | None, model: str | None = None) -> str:
    """``--device`` checked (:func:`device_problem`) and resolved: as given, else cuda when a GPU is visible, else cpu
    (cuda for the release model, which is built on one); a CUDA device where none is visible is refused in one line."""
    problem = device_problem(option)
    if problem:
        raise Refused(2, problem)
    from h3gate.status import default_device

    resolved = option or default_device(model)
    if resolved.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            built = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU build"
            raise Refused(2, f"--device {resolved}: no CUDA device is visible here (torch {torch.__version__}, {built}): "
                             "run it on a GPU machine, or give --device cpu")
    return resolved


def candidate(spec: str):
    """The candidate ``spec`` names, built; an unknown one or a bad option refuses the command before any work."""
    from h3gate.candidates import load

    with refusing(ValueError):
        return load(spec)


def write_json(path, report: dict) -> None:
    """A command's JSON report (``-o``), written atomically."""
    from h3gate.files import dumps, write_atomic

    write_atomic(path, dumps(report))
