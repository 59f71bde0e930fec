"""The resumable run store: on a toy denoising loop (fast, every rule) and on the embedded pipeline in real
subprocesses that are killed, preempted and raced (the promise: a resumed generation is byte for byte the
uninterrupted one, and the store is never corrupted)."""

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from filelock import FileLock

from h3gate.gates.generation import run_generation
from h3gate.generation import contract as generation_contract, resume

from conftest import THRESHOLDS

pytestmark = pytest.mark.usefixtures("one_thread")


CALLS = 6
IDENTITY = {"model": "toy", "candidate": {"name": "toy", "source_sha256": "a"}}


class Crash(Exception):
    pass


class Toy(torch.nn.Module):
    """A 'transformer' called as the pipeline calls it (keywords only, a tuple back), counting what it computes."""

    def __init__(self, noise=0.0, fail_at=None, on_call=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 16).reshape(4, 4))
        self.noise, self.fail_at, self.on_call = noise, fail_at, on_call
        self.computed = 0

    def forward(self, *, hidden_states, timestep, return_dict=False):
        if self.computed == self.fail_at:
            raise Crash(f"crash before call {self.computed}")
        if self.on_call is not None:
            self.on_call(self.computed)
        self.computed += 1
        out = torch.tanh(hidden_states @ self.weight) * timestep
        if self.noise:
            out = out + self.noise * torch.randn_like(out)
        return out, out.sum(-1)


def toy_loop(module, seed=0, schedule=None):
    """An Euler loop like the pipeline's: every call's input depends on every earlier output."""
    schedule = schedule or [1.0 - i / CALLS for i in range(CALLS)]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
    for t in schedule:
        velocity, _ = module(hidden_states=x, timestep=torch.tensor(t), return_dict=False)
        x = x - 0.1 * velocity
    return x


def toy_run(folder, module, identity=IDENTITY, seed=0, schedule=None, **options):
    with resume.Run(folder, identity, CALLS, **options) as run:
        with run.intercept(module):
            result = toy_loop(module, seed, schedule)
        run.finish({})
    return result, run


def sidecars(folder):
    return sorted(folder.glob("step-*.json"))


def same_place(uninterrupted, root):
    """Where a run of the uninterrupted run's identity lands under ``root`` (folders are keyed by identity)."""
    return root.joinpath(*uninterrupted.parts[-5:])


def files(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.name != resume.LOCK_FILE}


@pytest.fixture
def reference(tmp_path):
    result, _ = toy_run(tmp_path / "reference", Toy())
    return result, tmp_path / "reference"


# The toy loop: every rule of the store ----------------------------------------------------------------


def test_a_crashed_run_resumes_by_replaying_saved_calls(tmp_path, reference):
    expected, reference_folder = reference
    with pytest.raises(Crash):
        toy_run(tmp_path / "run", Toy(fail_at=3))
    assert len(sidecars(tmp_path / "run")) == 3
    module = Toy()
    result, run = toy_run(tmp_path / "run", module)
    assert module.computed == CALLS - 3, "the three saved calls are replayed, not recomputed"
    assert torch.equal(result, expected)
    assert files(tmp_path / "run") == files(reference_folder)


def test_a_finished_run_is_reused_only_with_its_identity(tmp_path, reference):
    _, folder = reference
    before = files(folder)
    with resume.Run(folder, IDENTITY, CALLS) as run:
        assert run.finished is not None and len(run.saved) == CALLS
    changed = {**IDENTITY, "candidate": {"name": "toy", "source_sha256": "b"}}
    with pytest.raises(resume.IdentityMismatch, match=r"candidate\.source_sha256: 'a' -> 'b'"):
        with resume.Run(folder, changed, CALLS):
            pass
    assert files(folder) == before, "a refused folder is left exactly as it was"


@pytest.mark.parametrize("damage", ["bit-flip", "truncation"])
def test_a_damaged_step_file_is_named(reference, damage):
    _, folder = reference
    path = folder / "step-0002.safetensors"
    data = bytearray(path.read_bytes())
    if damage == "bit-flip":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-7:]
    path.write_bytes(bytes(data))
    with pytest.raises(resume.CorruptRun, match=r"step-0002\.safetensors \(step 3/6\) is damaged"):
        with resume.Run(folder, IDENTITY, CALLS):
            pass


def _truncate(path):
    path.write_text(path.read_text()[:20])


@pytest.mark.parametrize("damage, says", [
    (lambda f: _truncate(f / "step-0004.json"), r"step-0004\.json: not valid JSON .*; expected a step sidecar"),
    (lambda f: _truncate(f / "run.json"), r"run\.json: not valid JSON .*; expected a run identity"),
    (lambda f: _truncate(f / "finished.json"), r"finished\.json: not valid JSON .*; expected a finished run record"),
    (lambda f: (f / "finished.json").write_text('{"schema": "other"}'), r"finished\.json: schema is 'other'"),
    (lambda f: (f / "step-0001.json").write_text("{}"), r"step-0001\.json is not the sidecar of step 1"),
], ids=["sidecar", "identity", "finished", "finished-schema", "sidecar-schema"])
def test_a_damaged_record_is_a_corrupt_run_with_its_fix(reference, damage, says):
    """Not the JSON reader's error: the folder's, naming it and what to do with it, which the gate reports as is."""
    _, folder = reference
    damage(folder)
    before = files(folder)
    with pytest.raises(resume.CorruptRun, match=f"{says}.*move {re.escape(str(folder))} away"):
        with resume.Run(folder, IDENTITY, CALLS):
            pass
    assert files(folder) == before, "a refused folder is left exactly as it was"


def test_every_replayed_input_is_checked(tmp_path):
    with pytest.raises(Crash):
        toy_run(tmp_path, Toy(fail_at=4))
    schedule = [1.0 - i / CALLS for i in range(CALLS)]
    schedule[2] = 0.5  # the third call gets another timestep
    with pytest.raises(resume.ReplayMismatch, match=r"replayed step 3/6 \(step-0002\) received other inputs .*\(timestep\)"):
        toy_run(tmp_path, Toy(), schedule=schedule)


def test_verify_last_step_catches_a_nondeterministic_transformer(tmp_path):
    with pytest.raises(Crash):
        toy_run(tmp_path / "noisy", Toy(noise=1e-6, fail_at=3))
    with pytest.raises(resume.Nondeterministic, match=r"step 3/6 \(step-0002\) recomputed differs .*not deterministic"):
        toy_run(tmp_path / "noisy", Toy(noise=1e-6), verify_last_step=True)
    with pytest.raises(Crash):
        toy_run(tmp_path / "exact", Toy(fail_at=3))
    _, run = toy_run(tmp_path / "exact", Toy(), verify_last_step=True)
    assert run.verified_step == 2


def test_the_first_call_is_checked_before_anything_is_computed(tmp_path, reference):
    _, folder = reference
    with resume.Run(folder, IDENTITY, CALLS) as run:
        expected = run.first_call_inputs
    module = Toy()
    with pytest.raises(resume.StartMismatch) as caught:
        toy_run(tmp_path / "other-noise", module, seed=1, expected_first_inputs=expected)
    message = str(caught.value)
    assert f"hidden_states: {caught.value.found['hidden_states']} (this run) vs {expected['hidden_states']}" in message
    assert {name for name in expected if caught.value.found[name] != expected[name]} == {"hidden_states"}
    assert module.computed == 0
    assert not sidecars(tmp_path / "other-noise")


def test_sigterm_finishes_the_step_then_preempts(tmp_path, reference):
    expected, reference_folder = reference
    handler = signal.getsignal(signal.SIGTERM)

    def terminate(call):
        if call == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    folder = tmp_path / "run"
    with pytest.raises(resume.Preempted, match=r"^preempted at step 3/6; run the same command to resume$"):
        toy_run(folder, Toy(on_call=terminate))
    assert signal.getsignal(signal.SIGTERM) is handler, "the caller's handler is back"
    assert len(sidecars(folder)) == 3
    result, _ = toy_run(folder, Toy())
    assert torch.equal(result, expected) and files(folder) == files(reference_folder)


def test_a_signal_after_the_run_finished_says_the_run_is_whole(tmp_path, reference):
    expected, reference_folder = reference
    folder = tmp_path / "run"
    with pytest.raises(resume.Preempted, match=r"^preempted after its last step \(6/6\), the run saved whole; run the "
                                               r"same command to finish$"):
        with resume.Run(folder, IDENTITY, CALLS) as run:
            module = Toy()
            with run.intercept(module):
                toy_loop(module, 0, None)
            run.finish({})
            os.kill(os.getpid(), signal.SIGTERM)  # as the decode after the last call runs
    result, again = toy_run(folder, Toy())
    assert torch.equal(result, expected) and again.resumed_at is None and files(folder) == files(reference_folder)


def test_a_busy_folder_is_refused_when_not_waiting(tmp_path):
    with FileLock(str(tmp_path / resume.LOCK_FILE)):
        with pytest.raises(resume.RunBusy, match=f"{tmp_path} is in use by another process"):
            toy_run(tmp_path, Toy(), lock_timeout=0)
    assert not sidecars(tmp_path)


def test_the_call_count_and_hooks_are_enforced(tmp_path):
    module = Toy()
    with resume.Run(tmp_path / "extra", IDENTITY, CALLS) as run, run.intercept(module):
        toy_loop(module)
        with pytest.raises(resume.ResumeError, match="more than the 6 transformer calls"):
            toy_loop(module)
    with resume.Run(tmp_path / "short", IDENTITY, CALLS) as run:
        with run.intercept(module):
            toy_loop(module, schedule=[1.0] * 5)
        with pytest.raises(resume.ResumeError, match="made 5 transformer calls; this run expects 6"):
            run.finish({})
    module.register_forward_hook(lambda *args: None)
    with resume.Run(tmp_path / "hooked", IDENTITY, CALLS) as run:
        with pytest.raises(resume.ResumeError, match="forward hooks"):
            with run.intercept(module):
                pass


@pytest.mark.parametrize("tensor, digest", [
    (torch.arange(12, dtype=torch.float32).reshape(3, 4).t(),
     "6ee3a81d2040027ef250f22cab06ab212f9ca840e930e8299935b1a35c483d48"),
    (torch.linspace(-1, 1, 5).to(torch.bfloat16), "1cf4e9111a086bf7e305b0a92bbc1c69f56eea9bc2f599f8235f2e799411234e"),
    (torch.tensor(7), "f35a8986077acb892549ebbccefb82b8d980272aaca7a5f8f3a4ee6d8bca02f6"),
    (torch.zeros(0, 2, dtype=torch.bool), "9c32832a8a96a488fd0098cd79917cba4b5db7f75c7aff3767cb1c8dee2c1244"),
], ids=["float32-transposed", "bfloat16", "int64-scalar", "bool-empty"])
def test_input_digests_stay_those_saved_folders_hold(tensor, digest):
    """Digests recorded by earlier versions: a change here would make every saved run refuse to resume."""
    header = f"{tensor.dtype}|{tuple(tensor.shape)}|".encode()
    assert resume.tensor_sha256(tensor) == digest
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert digest == hashlib.sha256(header + data).hexdigest()


def test_computed_calls_are_hashed_in_the_background_as_they_were_called(tmp_path, monkeypatch):
    """From the second call on, a computed call returns before its inputs are hashed (the device does not wait
    for sha256), and the digests recorded are those of the inputs at the call, though the loop changes them in
    place before they are hashed."""
    hold, release, waits = threading.Event(), threading.Event(), []
    hashed = resume.tensor_sha256

    def held(tensor):
        if hold.is_set():
            waits.append(release.wait(timeout=20))  # False: the main thread waited for this hash
        return hashed(tensor)

    monkeypatch.setattr(resume, "tensor_sha256", held)
    module, x, at_call = Toy(), torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), []
    with resume.Run(tmp_path, IDENTITY, 3) as run:
        with run.intercept(module):
            for call, t in enumerate([1.0, 0.5, 0.25]):
                if call == 1:
                    hold.set()
                at_call.append(hashed(x))
                velocity, _ = module(hidden_states=x, timestep=torch.tensor(t), return_dict=False)
                x.sub_(0.1 * velocity)
        release.set()
        run.finish({})
    assert waits and all(waits)
    recorded = [json.loads(path.read_text())["inputs"]["hidden_states"] for path in sidecars(tmp_path)]
    assert recorded == at_call and len(set(at_call)) == 3


def test_sidecars_land_in_step_order_after_their_files(tmp_path, monkeypatch):
    """Step files are written several at once, so a slow one is overtaken; the sidecars still land in step order,
    each after its step file (a sidecar means a complete step, and the steps on disk stay contiguous)."""
    landed, write_atomic, write_json = [], resume.write_atomic, resume.write_json

    def slow_file(path, data):
        if path.name == "step-0001.safetensors":
            time.sleep(0.5)
        write_atomic(path, data)
        landed.append(path.name)

    def recorded_json(path, value):
        write_json(path, value)
        landed.append(path.name)

    monkeypatch.setattr(resume, "STORE_THREADS", 3)
    monkeypatch.setattr(resume, "write_atomic", slow_file)
    monkeypatch.setattr(resume, "write_json", recorded_json)
    toy_run(tmp_path, Toy())
    steps = [name for name in landed if name.startswith("step-")]
    assert steps.index("step-0002.safetensors") < steps.index("step-0001.safetensors"), "files in flight at once"
    sidecars_landed = [name for name in steps if name.endswith(".json")]
    assert sidecars_landed == [f"step-{i:04d}.json" for i in range(CALLS)]
    assert all(steps.index(f"step-{i:04d}.safetensors") < steps.index(f"step-{i:04d}.json") for i in range(CALLS))


def test_a_failed_hash_stops_the_run(tmp_path, monkeypatch):
    def broken(tensor):
        raise MemoryError("cannot hash")

    module = Toy()
    with pytest.raises(resume.ResumeError, match="cannot hash"):
        with resume.Run(tmp_path, IDENTITY, CALLS) as run, run.intercept(module):
            toy_loop(module, schedule=[1.0])  # the first call hashes before it computes, not in the background
            monkeypatch.setattr(resume, "tensor_sha256", broken)
            toy_loop(module, schedule=[1.0] * 2)
    assert [path.name for path in sidecars(tmp_path)] == ["step-0000.json"], "no step without its digests"


# The embedded pipeline in subprocesses ----------------------------------------------------------------

STEPS = 25  # 24 transformer calls of ~30 ms: room to land a kill inside the loop
WORKER = """
import sys, torch
torch.set_num_threads(1)
from h3gate.gates.generation import run_generation
from h3gate.generation import contract as generation_contract
from h3gate.model.factory import build_preset
generation = run_generation(build_preset("tiny"), generation_contract.load(sys.argv[1]), 42, "cpu", sys.argv[2], progress=sys.stderr)
print("reused" if generation.reused else "generated", flush=True)
"""


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    data = json.loads((THRESHOLDS / "tiny" / "generation-contract.json").read_text())
    data.update(num_inference_steps=STEPS, seeds=[42])
    path = tmp_path_factory.mktemp("contract") / "generation-contract.json"
    path.write_text(json.dumps(data))
    return generation_contract.load(path)


@pytest.fixture(scope="module")
def uninterrupted(contract, tiny, tmp_path_factory):
    return run_generation(tiny, contract, 42, "cpu", tmp_path_factory.mktemp("uninterrupted")).folder


def start_worker(contract, out, log):
    with open(log.with_suffix(".out"), "w") as stdout, open(log.with_suffix(".err"), "w") as stderr:
        return subprocess.Popen([sys.executable, "-c", WORKER, str(contract.path), str(out)], stdout=stdout, stderr=stderr)


def wait_for(condition, process, timeout=180.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the worker ended early with {process.returncode}"
        assert time.monotonic() < deadline, "the worker made no progress"
        time.sleep(0.002)


def test_sigkill_at_random_points_then_resume_is_byte_identical(contract, uninterrupted, tiny, tmp_path):
    rng = random.Random(20261130)
    folder = same_place(uninterrupted, tmp_path)
    saved_at_kill = []
    for attempt in range(3):  # aim at least 8 calls before the end: this process may get the CPU late
        saved = len(sidecars(folder))
        target = rng.randint(saved + 1, max(saved + 1, min(saved + 5, STEPS - 9)))
        process = start_worker(contract, tmp_path, tmp_path / f"kill{attempt}")
        wait_for(lambda: len(sidecars(folder)) >= target, process)
        time.sleep(rng.uniform(0.0, 0.03))  # anywhere inside the next step, its writes included
        process.kill()
        process.wait()
        saved_at_kill.append(len(sidecars(folder)))
    assert saved_at_kill == sorted(set(saved_at_kill)) and saved_at_kill[-1] < STEPS - 1, saved_at_kill
    generation = run_generation(tiny, contract, 42, "cpu", tmp_path)
    assert not generation.reused
    assert files(folder) == files(uninterrupted), "steps, video, audio and records equal the uninterrupted run's"


def test_sigterm_preempts_with_a_resumable_folder(contract, uninterrupted, tiny, tmp_path):
    folder = same_place(uninterrupted, tmp_path)
    process = start_worker(contract, tmp_path, tmp_path / "worker")
    wait_for(lambda: len(sidecars(folder)) >= 3, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) != 0
    stderr = (tmp_path / "worker.err").read_text()
    found = re.search(r"preempted at step (\d+)/(\d+); run the same command to resume", stderr)
    assert found, stderr[-2000:]
    assert int(found[2]) == STEPS - 1 and int(found[1]) == len(sidecars(folder)) < STEPS - 1
    generation = run_generation(tiny, contract, 42, "cpu", tmp_path)
    assert not generation.reused and files(folder) == files(uninterrupted)


def test_two_processes_on_one_seed(contract, uninterrupted, tiny, tmp_path):
    processes = [start_worker(contract, tmp_path, tmp_path / f"worker{i}") for i in range(2)]
    codes = [process.wait(timeout=300) for process in processes]
    outcomes = sorted((tmp_path / f"worker{i}.out").read_text().strip() for i in range(2))
    assert codes == [0, 0], [(tmp_path / f"worker{i}.err").read_text()[-2000:] for i in range(2)]
    assert outcomes == ["generated", "reused"], "one generates while the other waits, then reuses"
    assert files(same_place(uninterrupted, tmp_path)) == files(uninterrupted)
