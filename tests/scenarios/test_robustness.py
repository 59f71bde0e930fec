"""Faults and bad inputs: every JSON loader fails only with its documented error, a full disk leaves nothing
half-written, a capture that is not the frozen one is refused, a NaN or misshapen candidate is named."""

import errno
import json
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import THRESHOLDS
from h3gate import bounds, files
from h3gate.evidence import signing
from h3gate.evidence.statement import statement_of
from h3gate.generation import contract as generation_contract, resume
from safetensors.torch import save

from h3gate.block_program import PROVIDER_OPS, Installation
from h3gate.bounds import BoundsError
from h3gate.candidates import Candidate, CandidateError
from h3gate.files import FileFormatError, WriteError
from h3gate.gates import block as block_gate, model as model_gate
from h3gate.model.contract import load_model_contract

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=12,
)


def _mutations(document: dict):
    """A valid document with one field dropped, retyped or replaced by arbitrary JSON; or any JSON at all."""
    keys = sorted(document)
    dropped = st.sampled_from(keys).map(lambda k: {x: v for x, v in document.items() if x != k})
    replaced = st.tuples(st.sampled_from(keys), JSON).map(lambda kv: {**document, kv[0]: kv[1]})
    return st.one_of(dropped, replaced, JSON)


def _loaders(tmp_path):
    model_contract = json.loads((THRESHOLDS / "tiny" / "model-contract.json").read_text())
    generation = json.loads((THRESHOLDS / "tiny" / "generation-contract.json").read_text())
    model_bounds = json.loads((THRESHOLDS / "tiny" / "cpu" / "model-bounds.json").read_text())
    lock = json.loads((THRESHOLDS / "LOCK.json").read_text())
    return {
        "model contract": (model_contract, tmp_path / "tiny" / "model-contract.json", load_model_contract, (FileFormatError,)),
        "generation contract": (
            generation, tmp_path / "tiny" / "generation-contract.json", generation_contract.load, (FileFormatError,),
        ),
        "bounds": (
            model_bounds,
            tmp_path / "tiny" / "cpu" / "model-bounds.json",
            lambda path: bounds.load(path, "model", model_bounds["model_identity"], "cpu"),
            (FileFormatError, bounds.BoundsError),
        ),
        "lock": (lock, tmp_path / "LOCK.json", lambda path: bounds.read_lock(path.parent), (FileFormatError,)),
        "run identity": (
            {"schema": "fuzz", "seed": 42},
            tmp_path / "run" / "run.json",
            lambda path: _open_run(path.parent),
            (FileFormatError, resume.ResumeError),
        ),
        "evidence": (
            {"payloadType": signing.PAYLOAD_TYPE, "payload": "e30=", "signatures": []},
            tmp_path / "evidence.json",
            lambda path: statement_of(signing.open_envelope(path)),
            (signing.EvidenceError,),
        ),
    }


def _open_run(folder):
    with resume.Run(folder, {"schema": "fuzz", "seed": 42}, 3, label="fuzz", progress=None, lock_timeout=0):
        pass


@pytest.mark.parametrize("loader", ["model contract", "generation contract", "bounds", "lock", "run identity", "evidence"])
def test_json_loaders_fail_only_with_their_documented_error(loader, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz")
    document, path, load, allowed = _loaders(folder)[loader]
    path.parent.mkdir(parents=True, exist_ok=True)

    @settings(max_examples=60, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_mutations(document) | st.binary(max_size=40).map(lambda b: b"\x00" + b))
    def fuzz(content):
        path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        try:
            load(path)
        except allowed as error:
            assert str(path.name) in str(error) or loader in ("lock", "evidence", "bounds", "run identity"), str(error)

    fuzz()


def test_a_full_disk_leaves_nothing_half_written(tmp_path, monkeypatch):
    target = tmp_path / "bounds.json"
    files.write_json(target, {"old": 1})

    def no_space(fd):  # where a full disk surfaces for buffered writes: flushing them to the device
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(WriteError, match=r"cannot write .*bounds.json \(No space left on device\); the previous file is intact"):
        files.write_json(target, {"new": 2})
    with pytest.raises(WriteError, match="no file was created"):
        files.write_json(tmp_path / "fresh.json", {"new": 2})
    monkeypatch.undo()
    assert json.loads(target.read_text()) == {"old": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bounds.json"], "no temporary file left behind"


def test_a_capture_that_is_not_the_frozen_one_or_is_unreadable_is_refused(tmp_path):
    path = tmp_path / "block0-capture.safetensors"
    with pytest.raises(BoundsError, match=r"frozen capture of block 0 is missing: .*block0-capture.safetensors "
                       r"\(sha256 0{64}\); `h3gate capture .*` re-makes it"):
        block_gate.load_capture(path, "0" * 64, 0)
    data = save({"hidden_states": torch.ones(3, 4)})
    path.write_bytes(data)
    _, digest = block_gate.load_capture(path, "0" * 64, 0)
    with pytest.raises(BoundsError, match=r"block0-capture.safetensors \(sha256 [0-9a-f]{12}\) is not the capture its "
                       r"bounds were frozen from \(000000000000\)"):
        digest.result()
    path.write_bytes(b"not safetensors")
    with pytest.raises(FileFormatError, match=r"block0-capture.safetensors: capture is not a readable safetensors file"):
        block_gate.load_capture(path, "0" * 64, 0)


class _Broken(Candidate):
    def __init__(self, name, linear):
        self.name = name
        self.ops = PROVIDER_OPS.__class__(**{**PROVIDER_OPS.__dict__, "linear": linear})

    def install(self, transformer):
        return Installation(transformer, self.ops)


def test_a_candidate_returning_nan_is_named_with_the_first_tap(tiny, tiny_contract, tiny_model_bounds):
    nan = _Broken("nan-out", lambda module, x: module(x) * float("nan") if module.out_features == 256 else module(x))
    with pytest.raises(CandidateError, match=r"candidate nan-out produced non-finite values in nodes\.\S+ \(\d+ NaN"):
        model_gate.check(tiny, nan, tiny_contract, tiny_model_bounds, "cpu")


def test_a_candidate_returning_the_wrong_shape_is_named(tiny, tiny_contract, tiny_model_bounds):
    short = _Broken("short-rows", lambda module, x: module(x)[:, :-1])
    with pytest.raises(CandidateError, match=r"candidate short-rows failed in the whole-model run: RuntimeError"):
        model_gate.check(tiny, short, tiny_contract, tiny_model_bounds, "cpu")


def test_a_triton_error_in_a_candidate_is_named_and_running_out_of_memory_is_not_blamed_on_it(
    tiny, tiny_contract, tiny_model_bounds
):
    from triton.runtime.errors import InterpreterError

    def interpreter_error(module, x):
        raise InterpreterError("ValueError('Cannot make_shape_compatible: incompatible dimensions at index 0')")

    def out_of_memory(module, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.28 GiB")

    crashing = _Broken("crashing", interpreter_error)
    with pytest.raises(CandidateError, match=r"candidate crashing failed in the whole-model run: InterpreterError: "):
        model_gate.check(tiny, crashing, tiny_contract, tiny_model_bounds, "cpu")
    with pytest.raises(torch.OutOfMemoryError):
        model_gate.check(tiny, _Broken("greedy", out_of_memory), tiny_contract, tiny_model_bounds, "cpu")


WRITER = """
import sys
from h3gate.files import write_json
path = sys.argv[1]
for i in range(10**6):
    write_json(path, {"generation": i, "payload": [i] * 20000})
"""


def test_sigkill_while_writing_never_leaves_a_half_written_file(tmp_path):
    """The evidence, bounds, sidecars and reports all go through write_atomic: a kill at any instant leaves the
    previous complete file (or none), never a torn one."""
    import random
    import subprocess
    import sys
    import time

    target = tmp_path / "evidence.json"
    rng = random.Random(7)
    for _ in range(5):
        process = subprocess.Popen([sys.executable, "-c", WRITER, str(target)])
        time.sleep(rng.uniform(0.8, 1.6))
        process.kill()
        process.wait()
        if target.exists():
            data = json.loads(target.read_text())
            assert data["payload"] == [data["generation"]] * 20000
    assert target.exists(), "the writer was killed before its first write every time: nothing was tested"
