"""A Ctrl-C, in one process or under xdist: the session ends in the line "preempted at step k/N; run the same command
to resume" and nothing else of the interrupt (no KeyboardInterrupt banner, no traceback, no crashed worker, no
warning); the same command then resumes each generation and says at which step (and, with --h3-verify-last-step, that
the last saved step was recomputed bitwise). An item that fails once a signal came (its compiler killed by the same
Ctrl-C) is interrupted, unrecorded, not failed."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import THRESHOLDS
from h3gate import suite
from h3gate.bounds import lock_files
from seeded_gates import seeded_gate

FILES = ("tiny/generation-contract.json", "tiny/cpu/generation-bounds.json")
# A Ctrl-C as a terminal sends it (to the whole process group: controller and workers), once, as the first candidate
# generation to get there has saved its third step; or, with H3_TEST_TIMEOUT set, the SIGTERMs of timeout(1): one to
# the command (an xdist worker's parent) and one to its process group, here 0.3 s apart.
CONFTEST = """
import os
import signal
import time

from h3gate.generation import resume

_save = resume.Run._save


def _save_then_interrupt(self, step, digests, outputs, info):
    _save(self, step, digests, outputs, info)
    if step == 2 and self.label.startswith("candidate") and os.environ.get("H3_TEST_CTRL_C"):
        try:
            os.close(os.open(os.environ["H3_TEST_CTRL_C"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        if os.environ.get("H3_TEST_TIMEOUT"):
            os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(0.3)
            os.killpg(os.getpgrp(), signal.SIGTERM)
        else:
            os.killpg(os.getpgrp(), signal.SIGINT)


resume.Run._save = _save_then_interrupt
"""


@pytest.fixture
def project(pytester):
    for name in FILES:
        (pytester.path / "thresholds" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(THRESHOLDS / name, pytester.path / "thresholds" / name)
    lock_files(pytester.path / "thresholds", [pytester.path / "thresholds" / name for name in FILES])
    pytester.makepyfile(test_gates=suite.text("test_gates.py", [42, 43], [42]))
    pytester.makeconftest(CONFTEST)
    return pytester


def session(project, workers, **environment) -> subprocess.CompletedProcess:
    """The gate suite's generation items (on ``workers``: xdist's options), in a process group of its own, as a
    terminal starts it: its Ctrl-C reaches that group only."""
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *workers, "--h3-device=cpu",
               "--h3-candidate=provider", "--h3-skip-model-gate=the model gate is not under test", "-k",
               "test_generation and not preflight"]
    return subprocess.run(command, cwd=project.path, env={**os.environ, **environment}, capture_output=True, text=True,
                          timeout=600, start_new_session=True)


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one process", "xdist"])
def test_ctrl_c_says_where_each_generation_stopped_and_nothing_else(project, workers):
    # PYTEST_XDIST_WORKER as a session started by a test on an xdist worker inherits it: a process is a worker by its
    # config, not by its environment.
    interrupted = session(project, workers, H3_TEST_CTRL_C=str(project.path / "ctrl-c-sent"), PYTEST_XDIST_WORKER="gw1")
    output = interrupted.stdout + interrupted.stderr
    assert interrupted.returncode == pytest.ExitCode.INTERRUPTED, output
    # A generation the signal met after its run had finished (decoding, say) has nothing to resume, and says so.
    stopped = [line for line in interrupted.stdout.splitlines() if ": preempted " in line]
    preempted = [line for line in stopped if "preempted at step" in line]
    assert preempted and all(line.endswith("; run the same command to resume") for line in preempted), output
    assert all(line.endswith("the run saved whole; run the same command to finish") for line in stopped
               if line not in preempted), output
    assert any(line.startswith("test_gates.py::test_generation[seed") and ": preempted at step 3/7" in line
               for line in preempted), output
    for noise in ("KeyboardInterrupt", "Traceback", "!!!", "crashed", "node down", "INTERNALERROR", "Interrupted",
                  "Warning"):
        assert noise not in output, f"{noise!r} in:\n{output}"

    resumed = session(project, workers + ["--h3-verify-last-step"])
    assert resumed.returncode == pytest.ExitCode.OK, resumed.stdout + resumed.stderr
    lines = [line for line in resumed.stdout.splitlines() if ": resumed " in line]
    assert len(lines) >= len(preempted), resumed.stdout
    assert any(line.endswith(" at step 4/7, the steps before it replayed as saved, step 3 recomputed bitwise equal")
               for line in lines), resumed.stdout
    if "-n" not in workers:  # the step bar says it as the run starts (xdist workers draw no bars)
        assert "the 2 saved steps replayed and saved step 3 recomputed, to equal it bitwise" in resumed.stderr, \
            resumed.stderr


def test_timeouts_two_sigterms_stop_an_xdist_session_once(project):
    """timeout(1) signals its command and then the command's process group: xdist's controller gets SIGTERM twice. The
    second is the same stop, not a second one that kills the controller before it can say where the runs stopped."""
    stopped = session(project, ["-n", "2"], H3_TEST_CTRL_C=str(project.path / "stop-sent"), H3_TEST_TIMEOUT="1",
                      PYTEST_XDIST_WORKER="gw1")
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == pytest.ExitCode.INTERRUPTED, output
    assert any(line.startswith("test_gates.py::test_generation[seed") and line.endswith(
        ": preempted at step 3/7; run the same command to resume") for line in stopped.stdout.splitlines()), output


def test_a_signal_held_stops_at_once_when_it_comes_again_later(monkeypatch):
    from pytest_h3 import distribution

    monkeypatch.setattr(distribution, "SAME_STOP_S", 0.2)
    monkeypatch.setattr(distribution, "SIGNALS", [])
    before, then = [], []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: before.append(signum))
    try:
        with distribution.first_signal_held(then.append) as received:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            assert received == then == [signal.SIGTERM] and before == [], "a repeat at once is the same stop"
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)
            assert before == [signal.SIGTERM], "a second stop goes to the handler before, as if none were held"
    finally:
        signal.signal(signal.SIGTERM, previous)


# A gate whose second item meets a scheduler's stop: SIGTERM to its own process.
TERMINATED_GATE = seeded_gate("terminated", imports="import os\nimport signal\nimport time", body='''
    if run.params["seed"] == 2:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return GateResult(GATE, run.params, [Check("x", "relative_l2", 0.0, 1.0, True)])''')


def test_a_sigterm_in_one_process_keeps_the_results_of_the_items_that_ran(pytester, monkeypatch):
    """By default a SIGTERM kills the process at once, with the results and evidence of every item that ran unwritten;
    here it stops the session as a Ctrl-C does, and the summary says what stopped it."""
    from h3gate import gates as registry

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    pytester.makepyfile(**TERMINATED_GATE, test_terminated='''
import pytest


@pytest.mark.h3_gate("terminated", seeds=[1, 2])
def test_terminated(h3_gate):
    assert h3_gate.run().passed
''')
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--h3-device=cpu",
                                           "--h3-candidate=provider", "-m", "gate")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, output
    assert "stopped by SIGTERM after the items that were running: run the same command to run the rest" in output
    recorded = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"]
    assert sorted(recorded) == ["test_terminated.py::test_terminated[seed1]"], output
    assert (pytester.path / "h3-out" / "evidence.json").is_file(), output


# A scheduler's stop that comes as the last item has finished, after every other hook has seen it end: SIGTERM to each
# process of the session (timeout(1)'s reaches xdist's controller and, through the process group, its workers).
LATE_SIGTERM = """
import os
import signal
import time

import pytest


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    if nodeid.endswith("[seed2]"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
"""

# A scheduler's stop that comes as the session writes its evidence (results.json written, the evidence not yet).
SIGTERM_WHILE_WRITING = """
import os
import signal

from pytest_h3 import session_evidence

_write = session_evidence.write_session_evidence


def _terminated_then_written(*args):
    os.kill(os.getpid(), signal.SIGTERM)
    return _write(*args)


session_evidence.write_session_evidence = _terminated_then_written
"""


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "1"]], ids=["one process", "xdist"])
@pytest.mark.parametrize("stop, said", [
    (LATE_SIGTERM, "SIGTERM came after every item had run: nothing is left to run"),
    (SIGTERM_WHILE_WRITING, "SIGTERM came as the session wrote its results and evidence: they were written first"),
], ids=["after the last item", "while the evidence is written"])
def test_a_sigterm_as_the_session_ends_stops_nothing(pytester, monkeypatch, workers, stop, said):
    """A time limit met as the session ends (every gate run, its evidence not yet written) must neither kill the process
    with the evidence unwritten (SIGTERM's default), nor send the user to run the same command for a rest that does not
    exist, nor end a whole, passing session as interrupted: the results and evidence are written, the summary says
    when the signal came, and the exit status is the session's own."""
    from h3gate import gates as registry

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    files = seeded_gate("finished", body='''
    return GateResult(GATE, run.params, [Check("x", "relative_l2", 0.0, 1.0, True)])''')
    files["conftest"] += stop
    pytester.makepyfile(**files, test_finished='''
import pytest


@pytest.mark.h3_gate("finished", seeds=[1, 2])
def test_finished(h3_gate):
    assert h3_gate.run().passed
''')
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers, "--h3-device=cpu",
                                           "--h3-candidate=provider", "-m", "gate")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, output
    assert said in output
    assert "run the same command" not in output
    recorded = json.loads((pytester.path / "h3-out" / "results.json").read_text())["results"]
    assert sorted(recorded) == [f"test_finished.py::test_finished[seed{seed}]" for seed in (1, 2)], output
    assert (pytester.path / "h3-out" / "evidence.json").is_file(), output


# A gate whose first item's compiler dies of the Ctrl-C that reached the whole process group: the signal comes, and
# the item fails on the compiler's error (a compiler pool turns the interrupt into its own error, as inductor's did).
KILLED_COMPILER_GATE = seeded_gate("compiling", imports="import os\nimport signal\nimport time", body='''
    if run.params["seed"] == 1:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass
        return GateResult(GATE, run.params, [Check.failed("compile", "error", "CppCompileError: cc1plus killed")])
    return GateResult(GATE, run.params, [Check("x", "relative_l2", 0.0, 1.0, True)])''')


@pytest.mark.parametrize("workers", [[], ["-n", "1"]], ids=["one process", "xdist"])
def test_an_item_that_fails_once_a_signal_came_is_interrupted_not_failed(pytester, monkeypatch, workers):
    from h3gate import gates as registry

    monkeypatch.setattr(registry, "REGISTRY", dict(registry.REGISTRY))
    pytester.makepyfile(**KILLED_COMPILER_GATE, test_compiling='''
import pytest


@pytest.mark.h3_gate("compiling", seeds=[1, 2])
def test_compiling(h3_gate):
    result = h3_gate.run()
    assert result.passed, result.report()
''')
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--h3-device=cpu", "--h3-candidate=provider",
                                           "-m", "gate", "-rs", *workers)
    output = result.stdout.str() + result.stderr.str()
    assert "CppCompileError" not in output and "failed" not in result.parseoutcomes(), output
    assert "interrupted by SIGINT while it ran" in output, output
    results = pytester.path / "h3-out" / "results.json"
    assert not results.exists() or "seed1" not in results.read_text(), output
