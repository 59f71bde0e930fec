"""The evidence of an --h3-out folder accumulates its sessions: a second session adds its items to the first's, and a
failed, refused or interrupted session never replaces or breaks good (signed) evidence."""

import json
import shutil

import pytest

from conftest import THRESHOLDS
from h3gate import suite
from h3gate.bounds import lock_files
from h3gate.evidence import signing
from h3gate.evidence.profiles import profile
from h3gate.evidence.statement import statement_of
from h3gate.evidence.verify import Verification, verify

GATES = suite.text("test_gates.py", [42, 43, 44], [42])  # h3gate init's gate suite: its model and block gates run here
SELECTED = ("-k", "test_model or test_block")
# Ends the session as a Ctrl-C would as the model gate's item starts (the block gate's ran before it), or errs in
# every item's set-up, when asked to.
CONFTEST = """
import os
import pytest

def pytest_runtest_call(item):
    if os.environ.get("H3_TEST_INTERRUPT") and "test_model" in item.nodeid:
        raise KeyboardInterrupt

@pytest.fixture(autouse=True)
def broken_setup():
    if os.environ.get("H3_TEST_SETUP_ERROR"):
        raise RuntimeError("a machine that lost its GPU")
"""
MODEL, BLOCKS = "test_gates.py::test_model", {f"test_gates.py::test_block[block{block}]" for block in (0, 1)}


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    """The tiny model's contract and its model and block bounds (frozen from the provider and sdpa-math)."""
    project = tmp_path_factory.mktemp("frozen")
    thresholds = project / "thresholds"
    (thresholds / "tiny").mkdir(parents=True)
    shutil.copy(THRESHOLDS / "tiny" / "model-contract.json", thresholds / "tiny")
    lock_files(thresholds, [thresholds / "tiny" / "model-contract.json"])
    return thresholds


@pytest.fixture
def project(pytester, frozen, request):
    shutil.copytree(frozen, pytester.path / "thresholds")
    pytester.makepyfile(test_gates=GATES)
    pytester.makeconftest(CONFTEST)
    if not (frozen / "tiny" / "cpu").is_dir():
        run(pytester, "--h3-freeze", "--h3-variants=sdpa-math").assert_outcomes(passed=3)
        shutil.rmtree(frozen)
        shutil.copytree(pytester.path / "thresholds", frozen)
    return pytester


def run(project, *args):
    return project.runpytest("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu", "-m", "gate",
                             "--junitxml=h3-out/junit.xml", "-o", "junit_family=xunit1", *SELECTED, *args)


def verified(project, *keys) -> Verification:
    return verify(project.path / "h3-out" / "evidence.json", keys or None,
                           thresholds=project.path / "thresholds", required=profile("model-block"))


def recorded_tests(project) -> dict:
    """The tests of the folder's evidence that ran (the suite's others are deselected)."""
    envelope = signing.open_envelope(project.path / "h3-out" / "evidence.json")
    tests = statement_of(envelope)["predicate"]["h3"]["tests"]
    return {nodeid: test for nodeid, test in tests.items() if test["outcome"] != "deselected"}


def test_a_second_session_adds_its_items_to_the_first_sessions(project):
    run(project, "-k", "test_model").assert_outcomes(passed=1)  # the last -k wins
    with pytest.raises(signing.EvidenceError, match="block: .*was deselected"):
        verified(project)
    second = run(project, "-k", "test_block")
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines(["evidence keeps 1 gate item of earlier sessions in h3-out*"])
    assert {nodeid: test["outcome"] for nodeid, test in recorded_tests(project).items()} == {
        MODEL: "passed", **dict.fromkeys(BLOCKS, "passed")}
    assert verified(project).result == "PASSED", "the first session's model item is kept, the block item added"
    results = json.loads((project.path / "h3-out" / "results.json").read_text())["results"]
    assert set(results) == BLOCKS, "results.json is the latest session's"
    assert len(list((project.path / "h3-out" / "sessions").iterdir())) == 2, "each session's own files are kept"


def test_a_refused_or_erring_session_keeps_the_signed_evidence(project, tmp_path, monkeypatch):
    private, public = signing.keygen(tmp_path / "keys")
    trusted = signing.load_public_key(public)
    run(project, f"--h3-sign-key={private}").assert_outcomes(passed=3)
    good = (project.path / "h3-out" / "evidence.json").read_bytes()
    assert verified(project, trusted).trusted

    unsigned = run(project)
    assert unsigned.ret == pytest.ExitCode.USAGE_ERROR
    unsigned.stderr.fnmatch_lines(["*--h3-out=h3-out holds evidence this session's could not join (it is signed "
                                   "(keyid *) and this session has no key: pass that key with --h3-sign-key): give "
                                   "another --h3-out, or move h3-out/evidence.json away to start anew"])
    assert (project.path / "h3-out" / "evidence.json").read_bytes() == good

    other, _ = signing.keygen(tmp_path / "other")
    run(project, f"--h3-sign-key={other}").stderr.fnmatch_lines(["*it is signed by keyid *, and this session's key*"])
    assert (project.path / "h3-out" / "evidence.json").read_bytes() == good

    monkeypatch.setenv("H3_TEST_SETUP_ERROR", "1")
    erring = run(project, f"--h3-sign-key={private}")
    erring.assert_outcomes(errors=3)
    assert {test["outcome"] for test in recorded_tests(project).values()} == {"passed"}, "no verdict replaces none"
    assert verified(project, trusted).result == "PASSED"


def test_a_session_measured_against_other_bounds_is_refused_before_it_runs(project):
    """Bounds frozen again since the folder's evidence was written: the earlier items were measured against others."""
    run(project).assert_outcomes(passed=3)
    good = (project.path / "h3-out" / "evidence.json").read_bytes()
    bounds = project.path / "thresholds" / "tiny" / "cpu" / "model-bounds.json"
    bounds.write_text(json.dumps({**json.loads(bounds.read_text()), "force_reason": "refrozen"}))
    lock_files(project.path / "thresholds", [bounds])
    refused = run(project)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*could not join (its items were measured against other bounds or contracts: "
                                  "bounds tiny/cpu/model-bounds.json: sha256 * in the evidence, * in */LOCK.json)*"])
    assert (project.path / "h3-out" / "evidence.json").read_bytes() == good


def test_an_interrupted_session_keeps_the_earlier_evidence_whole(project, monkeypatch):
    """A Ctrl-C as the model item starts, after the block items passed: the session ends, pytest rewrites junit.xml,
    and the folder's evidence verifies with the block items of this session and the model item of the earlier one."""
    run(project).assert_outcomes(passed=3)
    before = verified(project)
    monkeypatch.setenv("H3_TEST_INTERRUPT", "1")
    # In a process of its own: an in-process run would hand the interrupt on to this session.
    interrupted = project.runpytest_subprocess("-p", "no:cacheprovider", "--h3-candidate=provider", "--h3-device=cpu",
                                               "-m", "gate", "--junitxml=h3-out/junit.xml", "-o", "junit_family=xunit1",
                                               *SELECTED)
    assert interrupted.ret == pytest.ExitCode.INTERRUPTED
    interrupted.stdout.fnmatch_lines(["evidence keeps 1 gate item of earlier sessions in h3-out*"])
    after = verified(project)
    assert after.result == "PASSED" and set(recorded_tests(project)) == {MODEL, *BLOCKS}
    assert after.statement["predicate"]["h3"]["tests"][MODEL] == before.statement["predicate"]["h3"]["tests"][MODEL]
    sessions = sorted((project.path / "h3-out" / "sessions").iterdir())
    assert len(sessions) == 2 and (project.path / "h3-out" / "junit.xml").read_bytes() == \
        (sessions[-1] / "junit.xml").read_bytes(), "the interrupted session's JUnit, kept beside the first's"
