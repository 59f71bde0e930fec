"""The on-disk store of tuned tilings: keyed by GPU model and triton version, shared by xdist workers, strict.

The store itself is plain JSON and runs anywhere. The launcher tests run a small copy kernel through
:class:`Launcher` with the tuner's timings faked (on a CPU under the interpreter, which Triton cannot time), so
what they check is the launcher's use of the store: what it seeds, what it writes, what it leaves alone.
"""

import json
import multiprocessing

import pytest
import torch
import triton
import triton.language as tl

from h3_triton import tuning
from h3_triton.interpret import INTERPRET
from h3_triton.tuning import Launcher, TuningStore, store_path

DEVICE = "cpu" if INTERPRET else "cuda"
CONFIGS = [triton.Config({"BLOCK": block}, num_warps=4, num_stages=2) for block in (16, 32)]
KEY = (50, "torch.float32", "torch.float32")


@triton.jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@pytest.fixture
def path():
    return store_path("NVIDIA H200")


@pytest.fixture(autouse=True)
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("H3_TRITON_TUNING_DIR", str(tmp_path / "tunings"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_path_names_gpu_model_and_triton_version(tuning_dir, monkeypatch):
    version = f"triton-{triton.__version__}.json"
    assert store_path("NVIDIA H200") == tuning_dir / "tunings" / "nvidia-h200" / version
    assert store_path("NVIDIA H100 80GB HBM3") == tuning_dir / "tunings" / "nvidia-h100-80gb-hbm3" / version
    monkeypatch.delenv("H3_TRITON_TUNING_DIR")
    assert store_path("NVIDIA H200") == tuning_dir / "home/.cache/h3_triton/tunings/nvidia-h200" / version


def test_roundtrip_keeps_key_types_and_the_listed_config(path):
    tuned = {KEY: CONFIGS[1], (7, 1.5, True, "torch.bfloat16"): CONFIGS[0]}
    TuningStore(path).save("k abc", tuned)
    loaded = TuningStore(path).load("k abc", CONFIGS)
    assert loaded == tuned
    assert [type(value) for value in next(k for k in loaded if k[0] == 7)] == [int, float, bool, str]
    assert all(loaded[key] is config for key, config in tuned.items())
    assert TuningStore(path).load("k other", CONFIGS) == {}


def test_two_workers_keep_each_others_entries(path):
    first, second = TuningStore(path), TuningStore(path)
    first.save("k abc", {KEY: CONFIGS[0]})
    second.save("k abc", {(70, "torch.float32", "torch.float32"): CONFIGS[1]})
    second.save("other abc", {KEY: CONFIGS[1]})
    first.save("k abc", {KEY: CONFIGS[1]})
    assert first.load("k abc", CONFIGS) == {KEY: CONFIGS[1], (70, "torch.float32", "torch.float32"): CONFIGS[1]}
    assert first.load("other abc", CONFIGS) == {KEY: CONFIGS[1]}


def _save_many(path, worker):
    for n in range(20):
        TuningStore(path).save("k abc", {(worker, n): CONFIGS[0]})


def test_concurrent_workers_lose_no_entry(path):
    """Each save reads, merges and rewrites the whole file: without the lock, interleaved saves drop entries."""
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_save_many, args=(path, worker), daemon=True) for worker in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0] * 4
    assert set(TuningStore(path).load("k abc", CONFIGS)) == {(worker, n) for worker in range(4) for n in range(20)}
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{path.name}.lock"]


@pytest.mark.parametrize("text", ["{not json", "[]", '{"k abc": [{"key": [[1]], "config": {}}]}',
                                  '{"k abc": [{"key": [1]}]}'])
def test_corrupt_file_is_an_error_naming_it(path, text):
    path.parent.mkdir(parents=True)
    path.write_text(text)
    for use in (lambda store: store.load("k abc", CONFIGS), lambda store: store.save("k abc", {KEY: CONFIGS[0]})):
        with pytest.raises(RuntimeError, match="delete it") as raised:
            use(TuningStore(path))
        assert str(path) in str(raised.value)
    assert path.read_text() == text


def test_entry_whose_config_left_the_list_is_dropped(path):
    """Same tile, other warps: a different tiling, so the entry is tuned again rather than mapped to a neighbour."""
    TuningStore(path).save("k abc", {KEY: triton.Config({"BLOCK": 32}, num_warps=8, num_stages=2),
                                     (70,): CONFIGS[0]})
    assert TuningStore(path).load("k abc", CONFIGS) == {(70,): CONFIGS[0]}


def test_key_that_json_would_change_is_refused(path):
    with pytest.raises(TypeError, match="tuning key"):
        TuningStore(path).save("k abc", {((1, 2), "torch.float32"): CONFIGS[0]})
    assert not path.exists()


class _Timings:
    """Stands in for the autotuner's benchmark: the timings of each config, and how often it was asked."""

    def __init__(self, timings):
        self.timings, self.calls = timings, 0

    def __call__(self, *args, config, **meta):
        self.calls += 1
        return [self.timings[config]] * 3


@pytest.fixture
def gpu(monkeypatch):
    """A tuned launcher's world: autotuning on, a GPU name to key by, a fresh launcher list."""
    monkeypatch.setattr(tuning, "INTERPRET", False)
    monkeypatch.setattr(tuning, "AUTOTUNE", True)
    monkeypatch.setattr(tuning, "LAUNCHERS", [])
    if INTERPRET:  # the interpreter's functions have no source digest; a GPU's JITFunction has its own
        monkeypatch.setattr(_copy, "cache_key", "copy v1", raising=False)
    name = {"device": "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name["device"])
    return name


def _launch(launcher, timings, n=50):
    """Launches the copy with ``timings`` as the tuner's benchmark; the block sizes launched."""
    launcher._tuned._bench = timings
    x = torch.randn(n, device=DEVICE)
    y = torch.empty_like(x)
    blocks = []
    launcher(lambda meta: blocks.append(meta["BLOCK"]) or (triton.cdiv(n, meta["BLOCK"]),), x, y, n)
    assert torch.equal(y, x)
    return blocks


def _launcher(configs=CONFIGS):
    return Launcher(_copy, {4: configs}, key=["n"], interpreter={"BLOCK": 16})


def test_launcher_reuses_tunings_of_the_same_gpu_model(gpu):
    first = _Timings({CONFIGS[0]: 2.0, CONFIGS[1]: 1.0})
    _launch(_launcher(), first)
    assert first.calls == 2
    stored = json.loads(store_path("NVIDIA H200").read_text())
    assert list(stored.values()) == [[{"key": list(KEY), "config": CONFIGS[1].all_kwargs()}]]

    later = _launcher()
    untimed = _Timings({})
    assert _launch(later, untimed) == [32] and untimed.calls == 0
    _launch(later, _Timings({CONFIGS[0]: 1.0, CONFIGS[1]: 2.0}), n=70)
    assert TuningStore(store_path("NVIDIA H200")).load(later.group, CONFIGS) == {
        KEY: CONFIGS[1], (70, "torch.float32", "torch.float32"): CONFIGS[0]}

    gpu["device"] = "NVIDIA H100 80GB HBM3"
    other = _Timings({CONFIGS[0]: 1.0, CONFIGS[1]: 2.0})
    assert _launch(_launcher(), other) == [16] and other.calls == 2
    assert len(json.loads(store_path("NVIDIA H200").read_text())[later.group]) == 2


def test_other_tiling_list_is_tuned_afresh(gpu):
    """A list with a new candidate must time it; two launchers of one kernel (the GEMMs) keep apart too."""
    _launch(_launcher(), _Timings({CONFIGS[0]: 2.0, CONFIGS[1]: 1.0}))
    wider = [*CONFIGS, triton.Config({"BLOCK": 64}, num_warps=4, num_stages=2)]
    timings = _Timings({CONFIGS[0]: 2.0, CONFIGS[1]: 1.5, wider[2]: 1.0})
    assert _launch(_launcher(wider), timings) == [64] and timings.calls == 3


@pytest.mark.skipif(not INTERPRET, reason="edits the kernel's source digest, which a GPU's JITFunction computes")
def test_edited_kernel_is_tuned_afresh(gpu, monkeypatch):
    _launch(_launcher(), _Timings({CONFIGS[0]: 2.0, CONFIGS[1]: 1.0}))
    monkeypatch.setattr(_copy, "cache_key", "copy v2")
    edited = _Timings({CONFIGS[0]: 1.0, CONFIGS[1]: 2.0})
    assert _launch(_launcher(), edited) == [16] and edited.calls == 2


@pytest.mark.parametrize("interpret, autotune", [(True, True), (False, False)], ids=["interpreter", "autotune-0"])
def test_untuned_launches_touch_no_disk(gpu, monkeypatch, tuning_dir, interpret, autotune):
    monkeypatch.setattr(tuning, "INTERPRET", interpret)
    monkeypatch.setattr(tuning, "AUTOTUNE", autotune)
    monkeypatch.setattr(tuning, "TuningStore", None)  # any use of the store would fail the launch
    launcher = _launcher()
    x = torch.randn(50, device=DEVICE)
    y = torch.empty_like(x)
    launcher(lambda meta: (triton.cdiv(50, meta["BLOCK"]),), x, y, 50)
    assert torch.equal(y, x)
    assert list(tuning_dir.rglob("*")) == []
