"""The gate suite of a repository: the tests whose items freeze and check the files of its thresholds folder.

Every command the tool prints (``h3gate status``, ``h3gate contracts``, a missing bounds file's fix) names the
suite's own test items, so it runs in the repository it was printed in: ``thresholds/suite.json`` records where the
suite is, relative to the repository root (where the printed commands run). ``h3gate init`` writes a suite file
(:data:`TEMPLATE`) and that record; this repository's suite is the folder ``tests/gates``, one file per gate.

A gate's registry entry names the item that freezes each of its files as ``<file>::<test>`` of a folder suite
(``test_block.py::test_block[block0]``); a one-file suite holds the same test functions. Without a record, a command
selects the gate tests by their marker (``-m gate``), which every gate test carries.

Light on purpose (no torch): the plugin's header and ``h3gate status`` read it.
"""

from __future__ import annotations

import json
from pathlib import Path

RECORD = "suite.json"
SCHEMA = "h3gate.suite/1"
DEFAULT_FILE = "tests/test_h3_gates.py"


def recorded(thresholds: str | Path) -> str | None:
    """The suite recorded for ``thresholds`` (a file or folder, relative to the repository root), or None."""
    from h3gate.files import read_json, require

    path = Path(thresholds) / RECORD
    if not path.is_file():
        return None
    data = read_json(path, "gate suite record")
    return require(path, data, "suite", str, f"gate suite record ({SCHEMA})")


def record_text(suite: str) -> str:
    """The text of ``thresholds/suite.json`` recording ``suite``."""
    from h3gate.files import dumps

    return dumps({"schema": SCHEMA, "suite": Path(suite).as_posix()})


def targets(suite: str | None, item: str) -> list[str]:
    """The pytest arguments that select ``item`` (``test_block.py::test_block[block0]``, or a whole test function
    ``test_model.py::test_model``) in ``suite``: its node id; without a suite, every gate test (``-m gate``)."""
    if suite is None:
        return ["-m", "gate"]
    file, _, test = item.partition("::")
    return [f"{suite}::{test}" if suite.endswith(".py") else f"{(Path(suite) / file).as_posix()}::{test}"]


TEMPLATE = '''"""MiniMax-H3 qualification gates, written by `h3gate init` (pytest-h3's markers and fixtures).

Freeze the bounds first (`h3gate status` lists the files missing and the command that makes each), then check a
candidate: `pytest -m gate {path}`. Each gate is a test function; list parameters become items.
"""

import pytest


@pytest.mark.h3_gate("kernel", ops="all", dtypes="all")
def test_kernel(h3_gate):
    """Every op of the candidate alone, forward and gradients; independent of the model's weights."""
    result = h3_gate.run()
    assert result.passed, result.report()


@pytest.mark.h3_gate("block", blocks="all")
def test_block(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()


@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()


@pytest.mark.h3_gate("generation", seeds={preflight_seeds}, contract="generation-preflight")
def test_generation_preflight(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()


@pytest.mark.h3_gate("generation", seeds={seeds})
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
'''


def text(path: str, seeds: list[int], preflight_seeds: list[int]) -> str:
    """The suite file ``h3gate init`` writes at ``path``, its generation seeds those of the default contracts."""
    return TEMPLATE.format(path=path, seeds=json.dumps(seeds), preflight_seeds=json.dumps(preflight_seeds))
