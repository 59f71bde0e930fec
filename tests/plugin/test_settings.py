"""Every setting is checked before the first item runs: one line naming the option and the fix, exit code 4.

And a session that runs no gate pays nothing for the plugin: importing it imports neither torch nor the gates."""

import json
import os
import subprocess
import sys

import pytest

from h3gate.evidence.signing import keygen

PASSING = """
def test_plain():
    assert 1 + 1 == 2
"""
GATE = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    raise AssertionError("a gate item ran although the settings were bad")
"""


@pytest.fixture
def project(pytester):
    pytester.makepyfile(test_plain=PASSING, test_gate=GATE)
    (pytester.path / "thresholds").mkdir()
    return pytester


def _refused(project, *args, env=None):
    for name, value in (env or {}).items():
        project._monkeypatch.setenv(name, value)
    result = project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert "1 passed" not in result.stdout.str() and "a gate item ran" not in result.stdout.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    errors = [line for line in result.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.stderr.str()
    assert "test session starts" not in result.stdout.str(), "the refusal must come first, before pytest's header"
    assert [line for line in result.stderr.lines if line.strip()] == errors, result.stderr.str()
    return errors[0]


def test_an_unknown_profile(project):
    result = project.runpytest("--h3-profile=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--h3-profile: invalid choice: 'bogus'*"])


def test_a_signing_key_that_is_missing_or_not_a_private_ed25519_pem(project, tmp_path):
    assert "--h3-sign-key=" in _refused(project, f"--h3-sign-key={tmp_path / 'absent.pem'}")
    assert "cannot read the signing key" in _refused(project, f"--h3-sign-key={tmp_path / 'absent.pem'}")
    _, public = keygen(tmp_path / "keys")
    line = _refused(project, f"--h3-sign-key={public}")
    assert f"--h3-sign-key={public}" in line and "not an unencrypted PEM private key" in line


def test_the_signing_key_variable_holding_a_path(project, tmp_path):
    private, _ = keygen(tmp_path / "keys")
    line = _refused(project, env={"H3GATE_SIGN_KEY": str(private)})
    assert line.startswith("ERROR: H3GATE_SIGN_KEY: ") and "not a path" in line


def test_an_output_folder_that_is_a_file(project):
    (project.path / "out").write_text("")
    assert "--h3-out=out is a file, not a folder" in _refused(project, "--h3-out=out")


def test_a_model_folder_that_is_no_checkpoint(project, tmp_path):
    (tmp_path / "empty").mkdir()
    line = _refused(project, f"--h3-model={tmp_path / 'empty'}")
    assert f"--h3-model={tmp_path / 'empty'} is a folder but not a MiniMax-H3 checkpoint" in line
    assert not (project.path / "h3-out").exists(), "nothing is written for a session refused at its start"


@pytest.mark.parametrize("config, says", [
    ({"_class_name": "AutoencoderKL", "in_channels": 3}, "describes a 'AutoencoderKL', not a MiniMaxH3Transformer3DModel"),
    ({"_class_name": "MiniMaxH3Transformer3DModel"}, "num_layers is None, not a count of blocks"),
    ([1, 2], "expected a JSON object (transformer config)"),
])
def test_a_model_folder_whose_config_is_not_a_minimax_h3_transformer(project, tmp_path, config, says):
    """The block gate's items are one per block: a config without MiniMax-H3's fields must be refused at the start,
    not fail collection with a KeyError."""
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps(config))
    line = _refused(project, f"--h3-model={tmp_path / 'vae'}", "-m", "gate")
    assert line.startswith(f"ERROR: --h3-model={tmp_path / 'vae'}") and says in line


def test_a_candidate_option_that_does_not_build_is_refused_first(project):
    line = _refused(project, "--h3-candidate=h3_triton:provider_groups=bogus", "-m", "gate")
    assert "unknown op group(s) ['bogus']" in line


def test_a_candidate_is_told_at_the_start_of_a_model_it_declares_it_cannot_run(project, tmp_path):
    """h3_triton's attention declares head_dim 32, 64 and 128: a checkpoint of head_dim 16 (diffusers' own test
    configuration of MiniMax-H3 has one) is one line before any gate runs, not a failure after a freeze."""
    from h3gate.model.presets import TRANSFORMER_CONFIGS

    folder = tmp_path / "narrow"
    folder.mkdir()
    config = {**TRANSFORMER_CONFIGS["tiny"], "attention_head_dim": 16, "_class_name": "MiniMaxH3Transformer3DModel"}
    (folder / "config.json").write_text(json.dumps(config))
    result = project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", f"--h3-model={folder}", "-m", "gate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines([f"ERROR: --h3-candidate=h3_triton cannot run --h3-model={folder}: candidate h3_triton "
                                 "supports head_dim 32, 64, 128, and the model's attention has head_dim 16; qualify "
                                 "it on a model it supports"])
    assert "a gate item ran" not in result.stdout.str() and not (project.path / "h3-out").exists()


def test_a_thresholds_folder_that_does_not_exist(project, tmp_path):
    assert f"--h3-thresholds={tmp_path / 'none'} is not a folder" in _refused(
        project, f"--h3-thresholds={tmp_path / 'none'}")


@pytest.mark.parametrize("spec, says", [
    ("bogus", "no candidate 'bogus' is installed"),
    ("h3_triton:bogus=1", "candidate 'h3_triton' takes no option(s) ['bogus']"),
    ("h3_triton:provider_groups", "its options: provider_groups"),
])
def test_a_candidate_that_cannot_be_built(project, spec, says):
    assert says in _refused(project, f"--h3-candidate={spec}")


def test_a_bad_shard(project):
    assert "--h3-shard='3/2'" in _refused(project, "--h3-shard=3/2")


@pytest.mark.parametrize("examples", ["0", "-1"])
def test_kernel_examples_below_one(project, examples):
    assert _refused(project, f"--h3-kernel-examples={examples}") == \
        f"ERROR: --h3-kernel-examples={examples}: give at least 1 (default: 8)"


@pytest.mark.parametrize("spec, names", [
    ("sdpa-mathh", "'sdpa-mathh'"), ("golden", "'golden'"), ("sdpa-math,provider", "'provider'"),
    ("sdpa-math,", "''"),
])
def test_variants_that_are_no_provider_variant_of_the_device(project, spec, names):
    line = _refused(project, "--h3-freeze", f"--h3-variants={spec}")
    assert line.startswith(f"ERROR: --h3-variants={spec}: {names} not among the provider variants on cpu; give a "
                           "comma-separated list of sdpa-math, sdpa-flash, threads-1"), line


def test_good_settings_run_the_session(project, tmp_path):
    private, _ = keygen(tmp_path / "keys")
    result = project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", f"--h3-sign-key={private}",
                               "--h3-profile=release", "-k", "plain")
    assert result.ret == 0, result.stdout.str()


def test_importing_the_plugin_imports_neither_torch_nor_the_gates():
    code = ("import sys, pytest_h3.plugin; heavy = [m for m in ('torch', 'diffusers', 'triton', 'cryptography', "
            "'hypothesis', 'h3gate.gates.model') "
            "if m in sys.modules]; assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TRITON_INTERPRET": "1"})


def test_a_session_without_gates_never_imports_torch(pytester):
    pytester.makepyfile(test_plain=PASSING, conftest="""
import sys

def pytest_sessionfinish(session):
    heavy = [m for m in ("torch", "diffusers", "triton", "cryptography") if m in sys.modules]
    assert not heavy, heavy
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*1 passed*"])


def test_every_option_is_named_in_one_place():
    """Outside ``pytest_h3/options.py`` the plugin's code names no ``--h3-`` option in a string of its own (its
    docstrings and comments may)."""
    import ast
    from pathlib import Path

    import pytest_h3

    named = {}
    for path in sorted(Path(pytest_h3.__file__).parent.glob("*.py")):
        if path.name == "options.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                      and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        found = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant)
                 and isinstance(node.value, str) and "--h3-" in node.value and id(node) not in docstrings]
        if found:
            named[path.name] = found
    assert named == {}
