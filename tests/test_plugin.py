"""The pytest plugin, through pytest's own pytester: markers, parametrization, refusals, freeze then check."""

import json
import shutil

import pytest

from conftest import THRESHOLDS

GATE_TEST = """
import pytest

@pytest.mark.h3_gate("model")
def test_model(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
"""


@pytest.fixture
def project(pytester):
    """A fresh project with the tiny model's contract (locked) and no bounds yet."""
    (pytester.path / "thresholds" / "tiny").mkdir(parents=True)
    shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", pytester.path / "thresholds" / "tiny")
    from h3gate.bounds import lock_files

    lock_files(pytester.path / "thresholds", [pytester.path / "thresholds" / "tiny" / "model-contract.json"])
    pytester.makepyfile(test_gate=GATE_TEST)
    return pytester


def _run(project, *args):
    return project.runpytest("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", *args)


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
