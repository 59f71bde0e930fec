"""``h3gate init``: a repository set up for the gates in one command, and every command the tool then prints naming
that repository's own files."""

import json

import pytest

from h3gate import repository, suite
from h3gate.bounds import verify_lock
from h3gate.cli import main
from h3gate.files import UMASK


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_init_writes_the_suite_pytest_ini_and_the_thresholds_folder(repo, capsys):
    assert main(["init"]) == 0
    out = capsys.readouterr().out
    written = repo / suite.DEFAULT_FILE
    assert '@pytest.mark.h3_gate("model")' in written.read_text() and "def test_block(h3_gate)" in written.read_text()
    compile(written.read_text(), str(written), "exec")
    assert "junit_family = xunit1" in (repo / "pytest.ini").read_text()
    assert suite.recorded(repo / "thresholds") == suite.DEFAULT_FILE
    assert verify_lock(repo / "thresholds") == {}, "an empty lock; the suite record is not a locked file"
    assert (repo / "thresholds" / ".gitignore").read_text() == "*.flock\n"
    assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~UMASK), "readable as any new file, not mkstemp's 0600"
    assert "next, a checkpoint folder to qualify" in out and "  h3gate checkpoint make --preset tiny checkpoint" in out
    assert "tests/gates" not in out and "<" not in out


def test_init_refuses_to_overwrite_before_writing_anything(repo, capsys):
    (repo / "tests").mkdir()
    (repo / suite.DEFAULT_FILE).write_text("# ours\n")
    assert main(["init"]) == 2
    assert capsys.readouterr().err.strip() == ("h3gate init: tests/test_h3_gates.py exists: init overwrites nothing; "
                                               "pass --force to replace it with what init writes")
    assert not (repo / "pytest.ini").exists() and not (repo / "thresholds").exists(), "nothing written"
    assert main(["init", "--force"]) == 0
    assert "h3_gate" in (repo / suite.DEFAULT_FILE).read_text()


def test_an_existing_pytest_configuration_is_never_edited(repo, capsys):
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\naddopts = "-q"\n')
    assert main(["init", "--suite", "qual/test_gates.py"]) == 0
    out = capsys.readouterr().out
    assert not (repo / "pytest.ini").exists()
    assert "note: pytest is configured by pyproject.toml here, so no pytest.ini was written; add junit_family = xunit1" \
        in out
    assert suite.recorded(repo / "thresholds") == "qual/test_gates.py"
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\njunit_family = "xunit1"\n')
    assert repository.junit_family(repo / "pyproject.toml") == "xunit1"


def test_a_suite_pytest_would_not_collect_is_refused(repo, capsys):
    assert main(["init", "--suite", "tests/gates.py"]) == 2
    assert "give a path inside the repository named test_*.py" in capsys.readouterr().err


def test_init_with_a_model_writes_its_contracts_and_prints_commands_naming_the_suite(repo, capsys):
    assert main(["init", "--model=tiny", "--device=cpu"]) == 0
    out = capsys.readouterr().out
    assert all((repo / "thresholds" / "tiny" / name).is_file()
               for name in ("model-contract.json", "generation-contract.json", "generation-preflight-contract.json"))
    assert set(verify_lock(repo / "thresholds")) == {"tiny/model-contract.json", "tiny/generation-contract.json",
                                                     "tiny/generation-preflight-contract.json"}
    assert "  pytest tests/test_h3_gates.py::test_model --h3-freeze --h3-model=tiny --h3-device=cpu\n" in out
    assert ("  pytest tests/test_h3_gates.py::test_block tests/test_h3_gates.py::test_model "
            "tests/test_h3_gates.py::test_generation_preflight tests/test_h3_gates.py::test_generation "
            "--h3-model=tiny --h3-device=cpu --h3-profile=checkpoint\n") in out
    assert "tests/gates" not in out
    assert main(["init", "--model=tiny"]) == 2
    assert "tests/test_h3_gates.py exists" in capsys.readouterr().err
    assert main(["init", "--model=tiny", "--force"]) == 0, "replaces the suite and the contracts"
    contract = json.loads((repo / "thresholds" / "tiny" / "model-contract.json").read_text())
    assert contract["latent_height"] == 2
