"""``h3_triton.launch``: a call signature launched before reuses its compiled kernel, and anything Triton specialises a
kernel on (a scalar's value or type, a tensor's dtype or 16-byte alignment, a constexpr, an option, the device)
makes a new signature that goes through ``kernel[grid]`` again."""

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given
from hypothesis import strategies as st

from h3_triton import launch
from h3_triton.interpret import INTERPRET
from sm90 import H200_TRITON_VERSION, h200_triton_path


class _Compiled:
    def __init__(self, calls):
        self.calls, self.function, self.packed_metadata = calls, "function", "metadata"

    def run(self, *args):
        self.calls.append(("direct", args))


class _Kernel:
    """A jit kernel's stand-in: ``kernel[grid](...)`` notes the launch and returns its compiled kernel."""

    def __init__(self):
        self.calls = []
        self.params = [type("Param", (), {"name": name, "default": default})
                       for name, default in (("x", None), ("n", None), ("FLAG", None), ("BLOCK", 64))]

    def __getitem__(self, grid):
        def run(*args, **meta):
            self.calls.append(("triton", grid, args, meta))
            return _Compiled(self.calls)
        return run


@pytest.fixture
def direct(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(launch, "stream_of", lambda device: 7)
    kernel = _Kernel()
    return kernel, launch._Direct(kernel)


def test_a_signature_seen_before_launches_its_compiled_kernel_with_every_parameter(direct):
    kernel, lean = direct
    x = torch.zeros(64)
    grid = lambda named: (named["n"] + named["BLOCK"], named["FLAG"] + 2)  # noqa: E731
    lean.launch(grid, (x, 5), {"FLAG": 1, "num_warps": 4})
    assert kernel.calls[0][0] == "triton"
    lean.launch(grid, (x, 5), {"FLAG": 1, "num_warps": 4})
    # the grid of every parameter by name, the stream, the compiled handles, no launch hooks, then every parameter
    # in order, BLOCK at its default
    assert kernel.calls[1] == ("direct", (69, 3, 1, 7, "function", "metadata", None, None, None, x, 5, 1, 64))


@pytest.mark.parametrize("change", ["scalar", "bool-for-int", "dtype", "alignment", "constexpr", "option", "device"])
def test_whatever_triton_specialises_on_makes_a_new_signature(direct, monkeypatch, change):
    kernel, lean = direct
    buffer = torch.zeros(64)
    args, meta = (buffer[:32], 1), {"FLAG": 1, "num_warps": 4}
    lean.launch((1,), args, meta)
    changed = {
        "scalar": lambda: ((buffer[:32], 2), meta),
        "bool-for-int": lambda: ((buffer[:32], True), meta),
        "dtype": lambda: ((buffer[:32].to(torch.float64), 1), meta),
        "alignment": lambda: ((buffer[1:33], 1), meta),
        "constexpr": lambda: (args, {**meta, "FLAG": 2}),
        "option": lambda: (args, {**meta, "num_warps": 8}),
        "device": lambda: monkeypatch.setattr(torch.cuda, "current_device", lambda: 1) or (args, meta),
    }[change]
    lean.launch((1,), *changed())
    assert [call[0] for call in kernel.calls] == ["triton", "triton"]
    lean.launch((1,), *changed())
    assert kernel.calls[-1][0] == "direct"


def test_an_argument_of_another_type_always_goes_through_triton(direct):
    kernel, lean = direct
    for _ in range(2):
        lean.launch((1,), (torch.zeros(4), "text"), {})
    assert [call[0] for call in kernel.calls] == ["triton", "triton"]


def test_signatures_are_forgotten_past_the_limit(direct, monkeypatch):
    kernel, lean = direct
    monkeypatch.setattr(launch, "_KEPT", 2)
    x = torch.zeros(4)
    for n in (1, 2, 3, 1):
        lean.launch((1,), (x, n), {})
    assert [call[0] for call in kernel.calls] == ["triton"] * 4
    assert len(lean.compiled) == 2


@pytest.mark.parametrize("value", ["", "2", "yes"])
def test_a_direct_launch_setting_other_than_0_or_1_is_refused(monkeypatch, value):
    monkeypatch.setenv("H3_TRITON_DIRECT_LAUNCH", value)
    with pytest.raises(ValueError, match="set it to 0 .* or 1"):
        launch._direct_setting()


@pytest.mark.parametrize("runs, interpreter, hip, version", [
    ("Triton's CPU interpreter", True, None, "3.6.0"),
    ("a ROCm build of torch", False, "6.4", "3.6.0"),
    ("Triton 3.9.0", False, None, "3.9.0"),
])
def test_direct_launches_are_refused_where_they_cannot_run(monkeypatch, runs, interpreter, hip, version):
    monkeypatch.setenv("H3_TRITON_DIRECT_LAUNCH", "1")
    monkeypatch.setattr(launch, "INTERPRET", interpreter)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(triton, "__version__", version)
    with pytest.raises(ValueError, match=f"this process runs {runs}: unset it"):
        launch._direct_setting()


def test_launches_go_through_triton_by_default(monkeypatch):
    monkeypatch.delenv("H3_TRITON_DIRECT_LAUNCH", raising=False)
    assert not launch._direct_setting()


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr = 128):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * SCALE, mask=offsets < n)


def test_a_kernel_launched_again_computes_what_triton_launched(monkeypatch):
    """On a GPU with a Triton of :data:`LAUNCHER_VERSIONS` the second launch of each signature is direct (under the
    interpreter each goes through Triton): an aligned and a misaligned input, two scales, a default constexpr, a
    grid of the parameters by name; each matches torch."""
    monkeypatch.setattr(launch, "DIRECT", not INTERPRET and triton.__version__.startswith(launch.LAUNCHER_VERSIONS))
    device = "cpu" if INTERPRET else "cuda"
    buffer = torch.randn(1001, device=device)
    for x, scale in [(buffer[:1000], 2), (buffer[1:], 2), (buffer[:1000], 3), (buffer[1:], 3)] * 2:
        y = torch.full_like(x, float("nan"))
        launch.launch(_copy_kernel, lambda named: (launch.cdiv(named["n"], named["BLOCK"]),), (x, y, 1000),
                      {"SCALE": scale, "BLOCK": 256} if scale == 3 else {"SCALE": scale})
        assert torch.equal(y, x * scale)


@given(st.integers(-10**12, 10**12), st.integers(1, 10**6))
def test_cdiv_is_tritons(a, b):
    assert launch.cdiv(a, b) == (a + b - 1) // b


_SPECIALISATIONS = """
import torch, triton
from triton._C.libtriton import native_specialize_impl
from triton.backends.nvidia.compiler import CUDABackend
assert CUDABackend.supports_native_tensor_specialization  # no backend-specific tensor specialisation
buffer = torch.zeros(1 << 16, dtype=torch.uint8)
seen = {}
for dtype in (torch.bfloat16, torch.float32, torch.int32):
    flat = buffer.view(dtype)
    for t in (flat[:100], flat[8:4008].view(-1, 8), flat[:4096].view(64, 64).t(), flat[1:], flat[3:50:7], flat[:0]):
        key = (t.dtype, t.data_ptr() % 16 == 0)
        spec = native_specialize_impl(CUDABackend, t, False, True, True)
        assert seen.setdefault(key, spec) == spec, (key, spec, seen[key])
assert len(seen) == len(set(seen.values())) == 6, seen
print(triton.__version__)
"""


def test_tritons_with_direct_launches_specialise_a_tensor_on_its_dtype_and_alignment_alone():
    """The call signature's premise, asked of the H200's Triton itself: tensors of one dtype and alignment, whatever
    their shape, strides, offset or size, get one specialisation; each dtype and alignment its own."""
    assert launch.LAUNCHER_VERSIONS == (H200_TRITON_VERSION.rpartition(".")[0] + ".",)
    env = h200_triton_path(dict(os.environ, TRITON_INTERPRET="0"))
    done = subprocess.run([sys.executable, "-c", _SPECIALISATIONS], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == H200_TRITON_VERSION
