"""The pytest plugin, through pytest's own pytester: markers, parametrization, refusals, freeze then check."""

import json
import shutil
from pathlib import Path

import pytest

from conftest import THRESHOLDS
from h3gate import repository

GATE_TEST = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
"""


# Written as test_team_generation.py: pytester runs it in this process, where tests/gates/test_generation.py may
# already be imported under its module name.
GENERATION_TEST = """
import pytest

@pytest.mark.h3_gate("generation", seeds=[{seeds}], contract="{contract}")
def test_generation(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
"""
PREFLIGHT = ("tiny/generation-preflight-contract.json", "tiny/cpu/generation-preflight-bounds.json")


@pytest.fixture
def project(pytester):
    """A fresh project with the tiny model's contract (locked) and no bounds yet."""
    _add_frozen(pytester, "tiny/model-contract.json")
    pytester.makepyfile(test_gate=GATE_TEST)
    return pytester


def _add_frozen(project, *names):
    """Copy these files of the repository's thresholds folder into the project's, and lock them."""
    from h3gate.bounds import lock_files

    thresholds = project.path / "thresholds"
    for name in names:
        (thresholds / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(THRESHOLDS / name, thresholds / name)
    lock_files(thresholds, [thresholds / name for name in names])


def _run(project, *args):
    return project.runpytest("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", *args)


def _failed_in_one_line(result, test: str, message: str) -> None:
    """The item failed with ``message`` right under its header: no traceback, no repeated chained errors."""
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    assert not [line for line in result.stdout.lines if line.startswith("E ")], output
    header = test.translate({ord("["): "[[]", ord("]"): "[]]"})  # fnmatch's brackets, taken literally
    result.stdout.fnmatch_lines([f"*_ {header} _*", message], consecutive=True)


def test_markers_are_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*gate: a qualification gate*", "*h3_gate(kind, **params)*"])


def test_list_params_become_items_and_gate_marker_is_added(project):
    project.makepyfile(
        test_seeds="""
import pytest

@pytest.mark.h3_gate("generation", seeds=[42, 43])
def test_seeded(h3_gate):
    pass
"""
    )
    result = _run(project, "--collect-only", "-q", "--strict-markers", "-m", "gate", "test_seeds.py")
    result.stdout.fnmatch_lines(["test_seeds.py::test_seeded[seed42]", "test_seeds.py::test_seeded[seed43]"])


def test_kernel_ops_and_dtypes_become_one_item_each(project):
    project.makepyfile(
        test_ops="""
import pytest

@pytest.mark.h3_gate("kernel", ops=["swiglu", "attention"], dtypes=["bfloat16", "float32"])
def test_kernel(h3_gate):
    pass
"""
    )
    result = _run(project, "--collect-only", "-q", "-m", "gate", "test_ops.py")
    result.stdout.fnmatch_lines([f"test_ops.py::test_kernel[{op}-{dtype}]" for op in ("swiglu", "attention")
                                 for dtype in ("bfloat16", "float32")])


@pytest.mark.parametrize(
    "kind, params, message",
    [
        ("generation", "seeds=[]", "seeds must be a non-empty list"),
        ("model", "seeds=[42], blocks=[0]", "the model gate takes no list parameter, not blocks, seeds"),
        ("block", "dtypes=['float32']", "the block gate takes blocks, not dtypes"),
        ("generation", "seeds=[42, 42]", "seeds lists [[]42[]] more than once"),
        ("generation", "seeds=['42']", "seeds must be a list of int"),
        ("block", "blocks=[0, 2]", "blocks [[]2[]] are not among the block gate's on this model: 0, 1"),
        ("block", "blocks=[-1]", "blocks [[]-1[]] are not among the block gate's"),
        ("kernel", "ops=['swiglu'], dtypes=['float16']", "dtypes [[]'float16'[]] are not among the kernel gate's on "
         "this model: bfloat16, float32"),
    ],
)
def test_bad_params_are_collection_errors(project, kind, params, message):
    project.makepyfile(test_bad=f"""
import pytest

@pytest.mark.h3_gate("{kind}", {params})
def test_bad(h3_gate):
    pass
""")
    result = _run(project, "--collect-only", "test_bad.py")
    assert result.ret != 0
    result.stdout.fnmatch_lines([f"*{message}*"])


def test_unknown_kind(project):
    project.makepyfile(test_kind="""
import pytest

@pytest.mark.h3_gate("speed")
def test_kind(h3_gate):
    pass
""")
    result = _run(project, "--collect-only", "test_kind.py")
    result.stdout.fnmatch_lines(["*unknown gate kind 'speed'; kinds: *model*"])


def test_freeze_refuses_xdist(project):
    result = _run(project, "--h3-freeze", "-n", "2")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--h3-freeze refuses to run under xdist*"])


def test_force_without_freeze_is_an_error(project):
    result = _run(project, "--h3-freeze-force=because")
    result.stderr.fnmatch_lines(["*only apply together with --h3-freeze*"])


def test_unknown_candidate_names_the_available_ones(project):
    project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=nope").stderr.fnmatch_lines(
        ["*--h3-candidate=nope: no candidate 'nope' is installed; installed: *provider*"]
    )


def test_missing_bounds_fail_with_the_freeze_command(project):
    result = _run(project, "-m", "gate")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no frozen model bounds at *model-bounds.json; freeze them with: pytest test_gate.py::test_model --h3-freeze*"])


def test_freeze_then_check_writes_results_and_junit(project):
    frozen = _run(project, "-m", "gate", "--h3-freeze", "--h3-variants=sdpa-math")
    frozen.assert_outcomes(passed=1)
    frozen.stdout.fnmatch_lines(["the model gate's files are all frozen and locked; next, tiny/cpu/*-bounds.json "
                                 "(* file(s) to go; h3gate status lists them): pytest *--h3-freeze*"])
    bounds_file = project.path / "thresholds" / "tiny" / "cpu" / "model-bounds.json"
    assert json.loads(bounds_file.read_text())["sources"] == ["provider", "sdpa-math"]
    again = _run(project, "-m", "gate", "--h3-freeze", "--h3-variants=sdpa-math")
    again.assert_outcomes(failed=1)
    again.stdout.fnmatch_lines(["*exists: frozen bounds are not overwritten*"])

    checked = _run(project, "-m", "gate", "--junitxml=junit.xml", "-o", "junit_family=xunit1")
    checked.assert_outcomes(passed=1)
    results = json.loads((project.path / "h3-out" / "results.json").read_text())["results"]
    assert results["test_gate.py::test_model"]["passed"] is True
    junit = (project.path / "junit.xml").read_text()
    assert 'name="h3_gate" value="model"' in junit and 'name="h3_bounds_sha256"' in junit


def test_tampered_bounds_are_refused_at_session_start(project):
    _run(project, "-m", "gate", "--h3-freeze", "--h3-variants=sdpa-math").assert_outcomes(passed=1)
    bounds_file = project.path / "thresholds" / "tiny" / "cpu" / "model-bounds.json"
    data = json.loads(bounds_file.read_text())
    data["bounds"]["outputs.video"] *= 2
    bounds_file.write_text(json.dumps(data))
    result = _run(project, "-m", "gate")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*model-bounds.json does not match its digest*"])


def test_tampered_thresholds_stop_an_xdist_run_that_selects_the_gates_by_path(project):
    """Without ``-m gate`` the controller leaves the thresholds to its workers, which refuse them once they collected:
    the run stops with the refusal and pytest's usage-error status, not with xdist's internal error about the items
    it had handed the workers."""
    contract = project.path / "thresholds" / "tiny" / "model-contract.json"
    contract.write_text(contract.read_text().replace("{", "{\n", 1))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", "-n",
                                          "2", "test_gate.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + result.stderr.str()
    result.stderr.fnmatch_lines(["*model-contract.json does not match its digest*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def _truncate(path):
    path.write_text(path.read_text()[:60])


def _foreign(path):
    path.write_text(json.dumps({**json.loads(path.read_text()), "code": "other"}))


DAMAGES = [  # what damages the provider's run folder F, and the line its item fails with
    (lambda f: _truncate(f / "run.json"), "{f}/run.json: not valid JSON (*); expected a run identity; move {f} away "
     "or delete it to start afresh"),
    (lambda f: _truncate(f / "finished.json"), "{f}/finished.json: not valid JSON (*); expected a finished run record; "
     "move {f} away or delete it to start afresh"),
    (lambda f: (f / "step-0000.safetensors").unlink(),
     "{f}/step-0000.safetensors (step 1/1) is missing; move {f} away*"),
    (lambda f: _foreign(f / "run.json"), "{f} holds a generation of another identity, which is never overwritten*"),
    (lambda f: (f / "run.json").unlink(), "{f} holds step files but no run.json: *move it away"),
]


def test_a_damaged_or_foreign_run_folder_fails_its_item_in_one_line(project):
    _add_frozen(project, *PREFLIGHT)
    project.makepyfile(test_team_generation=GENERATION_TEST.format(seeds=42, contract="generation-preflight"))
    args = ("-m", "gate", "--h3-skip-model-gate=no model gate in this test", "test_team_generation.py")
    _run(project, *args).assert_outcomes(passed=1)
    runs = project.path / "h3-out" / "generation" / "tiny" / "generation-preflight"
    folder = next(runs.glob("provider-*/fl2va-seed42"))
    pristine = shutil.copytree(folder, project.path / "pristine")
    for damage, message in DAMAGES:
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)
        damage(folder)
        _failed_in_one_line(_run(project, *args), "test_generation[seed42]",
                            message.format(f=folder.relative_to(project.path)))


def test_a_missing_generation_contract_fails_in_one_line_naming_the_fix(project):
    _add_frozen(project, *PREFLIGHT)
    project.makepyfile(test_team_generation=GENERATION_TEST.format(seeds=42, contract="nope"))
    result = _run(project, "-m", "gate", "test_team_generation.py")
    _failed_in_one_line(result, "test_generation[seed42]", "*/thresholds/tiny/nope-contract.json: no generation "
                        "contract 'nope' for tiny (there: generation-preflight); mark the test with one of those "
                        "(contract=...), or write the default contracts with `h3gate contracts --model=tiny "
                        "--thresholds=*/thresholds`")


def test_a_seed_outside_the_contract_fails_in_one_line(project):
    _add_frozen(project, *PREFLIGHT)
    project.makepyfile(test_team_generation=GENERATION_TEST.format(seeds=99, contract="generation-preflight"))
    result = _run(project, "-m", "gate", "test_team_generation.py")
    _failed_in_one_line(result, "test_generation[seed99]", "seed 99 is not among */generation-preflight-contract."
                        "json's seeds [[]42[]]: mark the test with those (seeds=[[]42[]]) or another contract")


def test_the_generation_fixture_fails_a_teams_test_in_one_line_on_a_missing_contract(project):
    """A team's own test calling ``h3_generation`` meets the same bad input as the gate: the same one line."""
    project.makepyfile(test_own="""
import pytest

@pytest.mark.h3_gate("threshold")
def test_own(h3_generation, h3_threshold):
    h3_generation(42, "provider", contract="nope")
""")
    result = _run(project, "test_own.py")
    _failed_in_one_line(result, "test_own", "*/thresholds/tiny/nope-contract.json: missing*")


def test_the_generation_fixture_on_a_contract_of_two_workflows_names_the_option_that_picks_one(project):
    _add_frozen(project, PREFLIGHT[0])
    contract = project.path / "thresholds" / PREFLIGHT[0]
    contract.write_text(json.dumps({**json.loads(contract.read_text()), "workflow": ["t2va", "fl2va"]}))
    from h3gate.bounds import lock_files

    lock_files(project.path / "thresholds", [contract])
    project.makepyfile(test_own="""
import pytest

@pytest.mark.h3_gate("threshold")
def test_own(h3_generation, h3_threshold):
    h3_generation(42, "provider", contract="generation-preflight")
""")
    _failed_in_one_line(_run(project, "test_own.py"), "test_own", "*/generation-preflight-contract.json generates 2 "
                        "workflows, t2va, fl2va: pick the one to generate with workflow='t2va' or workflow='fl2va'")


def test_the_power_item_without_bounds_fails_with_the_freeze_command(project):
    """On a device class with no frozen bounds, the power item fails naming the bounds it reads and the item that
    freezes them (the power item freezes nothing), with no power table to show."""
    from h3gate import suite

    (project.path / "thresholds" / suite.RECORD).write_text(suite.record_text("test_gate.py"))
    # Written as test_team_power.py, as GENERATION_TEST is: tests/gates/test_power.py may be imported already.
    project.makepyfile(test_team_power=(Path(__file__).parents[1] / "gates" / "test_power.py").read_text())
    result = _run(project, "test_team_power.py", "-k", "model-mutants")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no frozen model bounds at *model-bounds.json; freeze them with: "
                                 "pytest test_gate.py::test_model --h3-freeze --h3-model=tiny --h3-device=cpu"])
    assert "KeyError" not in result.stdout.str()


def test_h3_bounds_names_the_item_of_the_repositorys_own_suite_that_freezes_them(project):
    """A repository set up by h3gate init: the fix names its suite's test, not this repository's tests/gates."""
    from h3gate import suite

    (project.path / "thresholds" / suite.RECORD).write_text(suite.record_text("qual/test_h3_gates.py"))
    project.makepyfile(test_own="""
import re

import pytest

from h3gate.bounds import BoundsError


def test_own(h3_bounds):
    fix = "freeze them with the block gate's test: pytest 'qual/test_h3_gates.py::test_block[block1]' --h3-freeze"
    with pytest.raises(BoundsError, match=f"no frozen block bounds .*block1-bounds.json; {re.escape(fix)}"):
        h3_bounds("block", block=1)
""")
    _run(project, "test_own.py").assert_outcomes(passed=1)


def test_a_run_from_a_subfolder_says_where_it_looked_for_thresholds_and_init_s_pytest_ini_anchors_it(project):
    """Without a pytest configuration, rootdir (and so <rootdir>/thresholds) is the folder pytest runs in: the header
    and the failure say so; the pytest.ini h3gate init writes makes the repository's root the rootdir from every
    subfolder."""
    sub = project.mkdir("sub")
    (project.path / "test_gate.py").rename(sub / "test_gate.py")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(sub)
        lost = _run(project, "-m", "gate")
        lost.assert_outcomes(failed=1)
        lost.stdout.fnmatch_lines([f"h3 thresholds: {sub}/thresholds does not exist: it is <rootdir>/thresholds, and "
                                   f"rootdir {sub} is the folder of the paths given, as pytest found no configuration "
                                   "file; run pytest from the folder holding thresholds/, *"])
        (project.path / "pytest.ini").write_text(repository.INI_TEXT)
        anchored = _run(project, "-m", "gate")
    anchored.assert_outcomes(failed=1)
    anchored.stdout.fnmatch_lines([f"*no frozen model bounds at {project.path}/thresholds/tiny/cpu/model-bounds.json; "
                                   "freeze them with: pytest sub/test_gate.py::test_model --h3-freeze*"])


def test_results_that_cannot_be_written_fail_the_run_in_one_line(project):
    project.makeconftest("""
import shutil

def pytest_sessionfinish(session):
    out = session.config.rootpath / "h3-out"
    shutil.rmtree(out, ignore_errors=True)
    out.write_text("")  # a file where the results go, which looked like a writable folder at the start
""")
    result = _run(project, "-m", "gate")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR, result.stdout.str()
    output = result.stdout.str() + result.stderr.str()
    assert "Traceback" not in output and "INTERNALERROR" not in output, output
    result.stdout.fnmatch_lines(["results NOT written, so neither is the evidence: cannot write h3-out/results.json "
                                 "(*); * then run again, or give --h3-out a folder that can be written"])
    assert (project.path / "h3-out").read_text() == "", "nothing half-written"
