"""The warnings diffusers raises through torch on every build are silenced exactly: by message, category and module,
in a pytest session and on the command line; the same message from elsewhere still shows."""

from h3gate import quiet
from h3gate.cli import main

EMITS = """
import warnings

from h3gate import quiet


def test_emits():
    for message, category, module in quiet.FOREIGN:
        warnings.warn_explicit(message, category, "torch_file.py", 1, module=module)
        warnings.warn_explicit(message, category, "other_file.py", 2, module="elsewhere")
"""


def test_a_session_shows_the_foreign_warnings_only_from_elsewhere(pytester):
    pytester.makepyfile(test_emits=EMITS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, warnings=len(quiet.FOREIGN))
    assert "other_file.py" in result.stdout.str() and "torch_file.py" not in result.stdout.str()


def test_checkpoint_make_prints_no_warning_of_diffusers(tmp_path, capfd):
    assert main(["checkpoint", "make", "--preset", "tiny", str(tmp_path / "checkpoint")]) == 0
    err = capfd.readouterr().err
    for noise in ("should be kept in float32", "weight_norm", "script_method", "Warning"):
        assert noise not in err, err
