"""``h3gate status``: every frozen file a model's gates need, present and locked, missing (with the command that
makes it) or stale; its one-line summary in the pytest header; a gate item without bounds fails at once."""

import json
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from h3gate import status as status_mod
from h3gate import suite as suite_mod
from h3gate.bounds import lock_files
from h3gate.cli import main
from h3gate.model import spec as model_spec
from h3gate.model.checkpoint import load_checkpoint

from conftest import ROOT, THRESHOLDS

CONTRACTS = ("model-contract.json", "generation-contract.json", "generation-preflight-contract.json")
TINY_FILES = [  # in the registry's order of gates
    "tiny/cpu/block0-bounds.json",
    "tiny/cpu/block0-capture.safetensors",
    "tiny/cpu/block1-bounds.json",
    "tiny/cpu/block1-capture.safetensors",
    "tiny/model-contract.json",
    "tiny/cpu/model-bounds.json",
    "tiny/generation-preflight-contract.json",
    "tiny/cpu/generation-preflight-bounds.json",
    "tiny/generation-contract.json",
    "tiny/cpu/generation-bounds.json",
]


def locked_contracts(thresholds, model="tiny", contracts=CONTRACTS, suite="tests/gates"):
    """A thresholds folder holding the committed tiny contracts, locked with the project's own helper, and the record
    of its gate suite (this repository's, unless told)."""
    (thresholds / model).mkdir(parents=True)
    if suite is not None:
        (thresholds / suite_mod.RECORD).write_text(suite_mod.record_text(suite))
    for name in contracts:
        shutil.copy(THRESHOLDS / "tiny" / name, thresholds / model / name)
    lock_files(thresholds, [thresholds / model / name for name in contracts])
    return thresholds


def frozen(thresholds, *relatives):
    """Stand-ins for frozen files (the status reads presence and digests, not contents), locked."""
    paths = []
    for relative in relatives:
        path = thresholds / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"safetensors bytes" if path.suffix == ".safetensors" else json.dumps({"file": relative}).encode())
        paths.append(path)
    lock_files(thresholds, paths)


def states(report):
    return {row.file: row.state for row in report.rows}


def test_every_file_of_every_gate_is_listed_once(tmp_path):
    report = status_mod.status(locked_contracts(tmp_path / "th"), "tiny", "cpu")
    assert [row.file for row in report.rows] == TINY_FILES
    assert [row.gate for row in report.rows] == ["block"] * 4 + ["model"] * 2 + ["generation"] * 4
    small = status_mod.status(tmp_path / "th", "small", "cpu")
    assert sum(row.file.endswith("-capture.safetensors") for row in small.rows) == 4  # num_layers of small


def test_present_missing_and_stale_rows(tmp_path):
    thresholds = locked_contracts(tmp_path / "th")
    frozen(thresholds, "tiny/cpu/model-bounds.json", "tiny/cpu/block0-bounds.json", "tiny/cpu/block0-capture.safetensors")
    (thresholds / "tiny/cpu/block0-bounds.json").write_text('{"edited": true}')  # after it was frozen
    (thresholds / "tiny/cpu/generation-bounds.json").write_text("{}")  # never locked
    report = status_mod.status(thresholds, "tiny", "cpu")
    assert states(report) == {
        "tiny/model-contract.json": "present and locked",
        "tiny/cpu/model-bounds.json": "present and locked",
        "tiny/cpu/block0-bounds.json": "stale",
        "tiny/cpu/block0-capture.safetensors": "present and locked",
        "tiny/cpu/block1-bounds.json": "missing",
        "tiny/cpu/block1-capture.safetensors": "missing",
        "tiny/generation-contract.json": "present and locked",
        "tiny/cpu/generation-bounds.json": "stale",
        "tiny/generation-preflight-contract.json": "present and locked",
        "tiny/cpu/generation-preflight-bounds.json": "missing",
    }
    rows = {row.file: row for row in report.rows}
    block1 = f"pytest 'tests/gates/test_block.py::test_block[block1]' --h3-freeze --h3-model=tiny --h3-device=cpu --h3-thresholds={thresholds}"
    assert rows["tiny/cpu/block1-bounds.json"].command == block1
    assert rows["tiny/cpu/block1-capture.safetensors"].command == block1  # frozen with its block's bounds
    assert "differs from its LOCK.json entry" in rows["tiny/cpu/block0-bounds.json"].detail
    assert rows["tiny/cpu/block0-bounds.json"].command.endswith(" --h3-freeze-force=REASON")
    assert rows["tiny/cpu/generation-bounds.json"].detail == "not in LOCK.json"
    assert rows["tiny/cpu/generation-preflight-bounds.json"].command == (
        "pytest tests/gates/test_generation.py::test_generation_preflight --h3-freeze --h3-model=tiny --h3-device=cpu "
        f"--h3-thresholds={thresholds}")
    assert rows["tiny/model-contract.json"].command == ""
    assert not report.ok and report.line() == "tiny/cpu: 5 present and locked, 3 missing, 2 stale"
    table = report.table()
    assert "block1-capture.safetensors" in table and f"make it: {block1}" in table


def test_a_capture_missing_beside_its_bounds_is_made_again(tmp_path):
    thresholds = locked_contracts(tmp_path / "th")
    frozen(thresholds, "tiny/cpu/block0-bounds.json")
    (row,) = [r for r in status_mod.status(thresholds, "tiny", "cpu").rows if r.file.endswith("block0-capture.safetensors")]
    assert (row.state, row.command) == ("missing", f"h3gate capture {thresholds}/tiny/cpu/block0-capture.safetensors")


def test_the_default_thresholds_folder_is_not_repeated_in_commands(tmp_path, monkeypatch):
    locked_contracts(tmp_path / "thresholds")
    monkeypatch.chdir(tmp_path)
    rows = {row.file: row for row in status_mod.status(model="tiny", device="cpu").rows}
    assert rows["tiny/cpu/model-bounds.json"].command == (
        "pytest tests/gates/test_model.py::test_model --h3-freeze --h3-model=tiny --h3-device=cpu")
    assert rows["tiny/cpu/generation-bounds.json"].command == (
        "pytest tests/gates/test_generation.py::test_generation --h3-freeze --h3-model=tiny --h3-device=cpu")


def test_commands_name_the_tests_of_the_repositorys_own_suite(tmp_path):
    """A suite file of the repository's own (h3gate init's): each freeze command names its test; without a recorded
    suite, every gate test of the repository (-m gate), never a path of another repository."""
    rows = {row.file: row for row in status_mod.status(
        locked_contracts(tmp_path / "own", suite="qual/test_h3_gates.py"), "tiny", "cpu").rows}
    assert rows["tiny/cpu/block1-bounds.json"].command.startswith(
        "pytest 'qual/test_h3_gates.py::test_block[block1]' --h3-freeze --h3-model=tiny --h3-device=cpu")
    assert rows["tiny/cpu/model-bounds.json"].command.startswith("pytest qual/test_h3_gates.py::test_model --h3-freeze")
    none = {row.file: row for row in status_mod.status(locked_contracts(tmp_path / "none", suite=None), "tiny", "cpu").rows}
    assert none["tiny/cpu/block1-bounds.json"].command.startswith("pytest -m gate --h3-freeze --h3-model=tiny")
    assert not any("tests/gates" in row.command for row in none.values())


def test_the_cli_exit_code_says_whether_everything_is_present_and_locked(tmp_path, capsys):
    thresholds = locked_contracts(tmp_path / "th")
    assert main(["status", "--model", "tiny", "--device", "cpu", "--thresholds", str(thresholds)]) == 1
    out = capsys.readouterr().out
    assert "tiny/cpu/model-bounds.json" in out and out.rstrip().endswith("tiny/cpu: 3 present and locked, 7 missing, 0 stale")
    assert main(["status", "--model", "tiny", "--device", "cpu", "--thresholds", str(tmp_path / "empty")]) == 1
    assert f"make it: h3gate contracts --model=tiny --thresholds={tmp_path / 'empty'}" in capsys.readouterr().out, \
        "a missing contract is written by h3gate contracts, not locked before it exists"
    frozen(thresholds, *(f for f in TINY_FILES if "/cpu/" in f))
    assert main(["status", "--h3-model", "tiny", "--device", "cpu", "--thresholds", str(thresholds)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("tiny/cpu: 10 present and locked, 0 missing, 0 stale")
    (thresholds / "tiny/model-contract.json").write_text("{}")
    assert main(["status", "--device", "cpu", "--thresholds", str(thresholds)]) == 1
    assert "h3gate lock" in capsys.readouterr().out
    assert main(["status", "--model", str(tmp_path / "nowhere"), "--device", "cpu", "--thresholds", str(thresholds)]) == 2
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "1  a file is missing or stale" in capsys.readouterr().out


def test_the_installed_command(tmp_path):
    thresholds = locked_contracts(tmp_path / "th")
    frozen(thresholds, *(f for f in TINY_FILES if "/cpu/" in f))
    command = [sys.executable, "-m", "h3gate.cli", "status", "--h3-model", "tiny", "--device", "cpu", "--thresholds", str(thresholds)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tiny/cpu: 10 present and locked, 0 missing, 0 stale" in done.stdout
    (thresholds / "tiny/cpu/block1-capture.safetensors").unlink()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 1 and "tiny/cpu: 9 present and locked, 1 missing, 0 stale" in done.stdout


def test_model_names_and_sources_without_building_the_model(tiny, tmp_path):
    assert (model_spec.model_name("tiny"), model_spec.model_source("tiny")) == (tiny.name, tiny.source)
    tiny.transformer.save_pretrained(tmp_path / "ckpt" / "transformer")
    name = model_spec.model_name(str(tmp_path / "ckpt"))  # the folder's name and 12 hex of its transformer
    assert re.fullmatch(r"ckpt-[0-9a-f]{12}", name) and load_checkpoint(tmp_path / "ckpt").name == name
    (tmp_path / "other" / "transformer").mkdir(parents=True)
    config = {"_class_name": "MiniMaxH3Transformer3DModel", "num_layers": 3}
    (tmp_path / "other" / "transformer" / "config.json").write_text(json.dumps(config))
    assert model_spec.num_layers(str(tmp_path / "other")) == 3


# The plugin ----------------------------------------------------------------------------------------------

GATES = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()

@pytest.mark.h3_gate("block", blocks=[1])
def test_block(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()

@pytest.mark.h3_gate("generation", seeds=[42])
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
"""

# Building the model during an item fails it with this text: a missing-bounds failure must come before any of it.
NO_MODEL = """
import pytest

@pytest.fixture(autouse=True)
def no_model_building(monkeypatch):
    import h3gate.model.factory

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(h3gate.model.factory, "build_preset", refuse)
"""


@pytest.fixture
def project(pytester):
    locked_contracts(pytester.path / "thresholds")
    pytester.makepyfile(test_gates=GATES)
    pytester.makeconftest(NO_MODEL)
    return pytester


def test_the_session_header_summarises_the_status(project):
    result = project.runpytest("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", "--collect-only")
    result.stdout.fnmatch_lines(["h3 thresholds: tiny/cpu: 3 present and locked, 7 missing, 0 stale (h3gate status *"])
    frozen(project.path / "thresholds", *(f for f in TINY_FILES if "/cpu/" in f))
    result = project.runpytest("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", "--collect-only")
    result.stdout.fnmatch_lines(["h3 thresholds: tiny/cpu: 10 present and locked, 0 missing, 0 stale"])


def test_missing_bounds_fail_at_once_with_the_freeze_command(project):
    records = project.inline_run("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", "-m", "gate")
    calls = [report for report in records.getreports("pytest_runtest_logreport") if report.when == "call"]
    assert [report.outcome for report in calls] == ["failed"] * 3
    expected = {"test_gates.py::test_model": ("model", "model"), "test_gates.py::test_block[block1]": ("block1", "block"),
                "test_gates.py::test_generation[seed42]": ("generation", "generation")}
    assert sorted(report.nodeid for report in calls) == sorted(expected)
    for report in calls:
        stem, gate = expected[report.nodeid]
        assert report.duration < 5.0, f"{report.nodeid} took {report.duration:.1f} s to find its bounds missing"
        text = report.longreprtext
        assert "the model was built" not in text
        assert f"no frozen {gate} bounds at {project.path}/thresholds/tiny/cpu/{stem}-bounds.json" in text
        assert f"freeze them with: pytest {shlex.quote(report.nodeid)} --h3-freeze --h3-model=tiny --h3-device=cpu" in text


def test_the_session_header_counts_the_files_its_profiles_gates_read(pytester):
    """make gate's edge run (profile model-block) needs edge's model and block files only: nothing is missing."""
    from conftest import THRESHOLDS

    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    for profile, line in (("model-block", "edge/cpu: 4 present and locked, 0 missing, 0 stale"),
                          ("ci", "edge/cpu: 4 present and locked, 4 missing, 0 stale")):
        run = pytester.runpytest("-p", "no:cacheprovider", "--h3-model=edge", "--h3-device=cpu",
                                 f"--h3-thresholds={THRESHOLDS}", f"--h3-profile={profile}")
        run.stdout.fnmatch_lines([f"h3 thresholds: {line}*"])


# The device classes of the committed thresholds folder, and the profile each model's README command runs there.
SHIPPED = sorted((path.parent.name, path.name) for path in THRESHOLDS.glob("*/*") if path.is_dir())
README_PROFILE = {"edge": "model-block"}


@pytest.mark.parametrize("model, device_class", SHIPPED, ids=[f"{m}-{d}" for m, d in SHIPPED])
def test_every_shipped_device_class_holds_every_file_its_gates_read(model, device_class):
    """A GPU we ship bounds for runs `pytest -m gate` out of the box: none of its files missing or stale."""
    from h3gate.evidence.profiles import profile

    gates = {requirement.gate for requirement in profile(README_PROFILE.get(model, "ci")).requirements}
    report = status_mod.status(THRESHOLDS, model, device="cpu", device_class=device_class, gates=gates)
    assert report.ok, report.table()
