"""``h3_triton.attention`` against float64 torch, forward and dq, dk, dv.

Rule: the candidate's relative L2 error to float64 (computed from the same low-precision inputs, upcast) is at
most twice the error of torch's own ``scaled_dot_product_attention`` at that precision plus one unit roundoff of
the dtype. Inputs are views into larger NaN-filled buffers, cut along the sequence and head_dim, so a load that
strays past a mask turns a result into NaN.
"""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from h3_triton import attention as attention_module
from h3_triton import attention_hopper
from h3_triton.attention import attention
from h3_triton.interpret import INTERPRET
from sm90 import compile_for_h200


DEVICE = "cpu" if INTERPRET else "cuda"
DTYPES = [torch.bfloat16, torch.float32]
NAMES = ("out", "dq", "dk", "dv")


def carved(shape, dtype, seed, std=1.0):
    """Normal values (scaled by ``std``) in a (B, S, H, D) view cut out of a NaN buffer along S and D."""
    B, S, H, D = shape
    buf = torch.full((B, S + 5, H, D + 16), float("nan"), dtype=dtype, device=DEVICE)
    view = buf[:, 3 : 3 + S, :, 8 : 8 + D]
    gen = torch.Generator().manual_seed(seed)
    view.copy_((std * torch.randn(shape, generator=gen)).to(dtype))
    return view


def inputs(shape, dtype, seed=0):
    """q, k, v and dout; q and k have std 2, so logits have std 4 and attention is peaked, as in trained models."""
    return [carved(shape, dtype, seed + i, std) for i, std in enumerate((2.0, 2.0, 1.0, 1.0))]


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def run(fn, q, k, v, dout):
    """Output and dq, dk, dv of ``fn`` back-propagated with ``dout``."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def rel_l2(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


def check(q, k, v, dout, names=NAMES):
    """Compare the candidate and torch's low-precision SDPA with float64 on the tensors named in ``names``."""
    got = run(attention, q, k, v, dout)
    torch_low = run(sdpa, q, k, v, dout)
    ref = run(sdpa, q.double(), k.double(), v.double(), dout.double())
    for name, g, t, r in zip(NAMES, got, torch_low, ref):
        assert g.dtype == q.dtype and g.shape == q.shape and g.is_contiguous(), f"{name}: {g.dtype} {g.stride()}"
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        if name not in names:
            continue
        err, torch_err = rel_l2(g, r), rel_l2(t, r)
        bound = 2 * torch_err + torch.finfo(g.dtype).eps / 2
        assert err <= bound, f"{name}: relative L2 {err:.3e} > {bound:.3e} (torch {torch_err:.3e})"
    return got, ref


# (B, S, H, D): every S of the brief with every D at least once, ragged against the tiles (128 wide under the
# interpreter, 64 or 128 on a GPU).
SHAPES = [(2, 7, 3, 64), (1, 65, 3, 128), (2, 65, 1, 32), (1, 130, 1, 64), (1, 130, 3, 32), (1, 300, 1, 128)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_float64(shape, dtype):
    check(*inputs(shape, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("D", [32, 128])
def test_single_key(D, dtype):
    """One key: softmax is exactly 1, so out == v and dv == dout bitwise, and dq, dk vanish up to fp32 rounding."""
    q, k, v, dout = inputs((2, 1, 3, D), dtype)
    out, dq, dk, dv = check(q, k, v, dout, names=())[0]
    assert torch.equal(out, v) and torch.equal(dv, dout)
    # dq = (dp - delta) k / sqrt(D): dp and delta are the same D products summed in two orders in float32.
    scale = D * torch.finfo(torch.float32).eps * dout.abs().max() * v.abs().max() * max(q.abs().max(), k.abs().max())
    assert dq.abs().max() <= scale and dk.abs().max() <= scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["last_key_dominates", "all_logits_negative"])
def test_last_partial_key_tile(case, dtype):
    """S = 129 leaves key 128 alone in the last tile of every tile size (32 to 128) after full tiles: it must count
    fully, and the padding after it not at all.

    ``last_key_dominates``: key 128 outscores the others by about 30, so dropping the last tile loses almost all
    of the output. ``all_logits_negative``: every real logit is about -30, so a padded key (logit 0) that leaked
    into the softmax would take almost all of the weight. Both broken answers are built in float64 and must be
    far from the reference, which shows the test can fail.
    """
    B, S, H, D = 1, 129, 2, 32
    q, k, v, dout = inputs((B, S, H, D), dtype)
    q[..., 0] = math.sqrt(D)  # a key's logit is then its coordinate 0, plus noise of std ~0.4
    k.mul_(0.1)
    if case == "last_key_dominates":
        k[:, -1, :, 0] = 30.0
        broken = sdpa(q.double(), k.double()[:, :-1], v.double()[:, :-1])
    else:
        k[..., 0] = -30.0
        pad = torch.zeros((B, -S % 128, H, D), dtype=torch.float64, device=DEVICE)  # a 128-wide last tile's
        broken = sdpa(q.double(), torch.cat([k.double(), pad], 1), torch.cat([v.double(), pad], 1))
    (out, *_), (ref, *_) = check(q, k, v, dout)
    assert rel_l2(broken, ref) > 0.5, "the broken variant is too close to the reference to be caught"
    assert rel_l2(out, ref) < 0.1 * rel_l2(broken, ref)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_deterministic_and_layout_independent(dtype):
    """Two runs are bitwise equal, and equal to a run on contiguous copies; NaN around the views never leaks.

    k is a transposed (B, H, S, D) buffer seen as (B, S, H, D), and dout is strided, so every stride argument of
    every kernel differs from the contiguous run.
    """
    q, _, v, dout = inputs((2, 45, 2, 64), dtype)
    k = carved((2, 2, 45, 64), dtype, seed=7).transpose(1, 2)
    first = run(attention, q, k, v, dout)
    second = run(attention, q, k, v, dout)
    dense = run(attention, *(t.contiguous() for t in (q, k, v, dout)))
    for name, a, b, c in zip(NAMES, first, second, dense):
        assert not torch.isnan(a).any(), f"{name}: NaN from the buffer around the inputs"
        assert torch.equal(a, b), f"{name}: two runs differ"
        assert torch.equal(a, c), f"{name}: strided and contiguous inputs differ"


def test_descriptor_and_pointer_paths_agree(monkeypatch):
    """bfloat16 heads on 16-byte boundaries are read through tensor descriptors (TMA: the forward, and the
    warp-specialised dK/dV kernel), others through pointers: each path is the one taken, and the two give the
    same bits."""
    taken = []
    forward, described_dkdv = attention_module._fwd, attention_module._dkdv_described
    pointer_dkdv = attention_module._dkdv
    monkeypatch.setattr(attention_module, "_fwd", lambda grid, *args, **meta: taken.append(
        ("forward", meta["DESCRIBED"])) or forward(grid, *args, **meta))
    monkeypatch.setattr(attention_module, "_dkdv_described", lambda *args, **meta: taken.append(
        ("dkdv", True)) or described_dkdv(*args, **meta))
    monkeypatch.setattr(attention_module, "_dkdv", lambda *args, **meta: taken.append(
        ("dkdv", False)) or pointer_dkdv(*args, **meta))
    q, k, v, dout = inputs((2, 45, 2, 64), torch.bfloat16)
    described = run(attention, q, k, v, dout)
    off_boundary = torch.full((2, 45, 2, 65), float("nan"), dtype=torch.bfloat16, device=DEVICE)[..., :64]
    pointed = run(attention, q, off_boundary.copy_(k), v, dout)
    assert taken == [("forward", True), ("dkdv", True), ("forward", False), ("dkdv", False)]
    for name, a, b in zip(NAMES, described, pointed):
        assert torch.equal(a, b), f"{name}: descriptor and pointer paths differ"


def test_broadcast_output_gradient():
    """``out.sum().backward()`` hands a gradient with all strides 0; it must act like an explicit ones tensor."""
    q, k, v, _ = inputs((1, 33, 2, 32), torch.float32)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    attention(*leaves).sum().backward()
    explicit = run(attention, q, k, v, torch.ones_like(q))[1:]
    for name, a, b in zip(NAMES[1:], [t.grad for t in leaves], explicit):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q, k, v: (q[..., :48], k[..., :48], v[..., :48]), "head_dim 48"),
        (lambda q, k, v: (q.half(), k.half(), v.half()), "dtype torch.float16"),
        (lambda q, k, v: (q, k.double(), v), "k is torch.float64"),
        (lambda q, k, v: (q, k[:, :5], v), "k has shape"),
        (lambda q, k, v: (q, k, v.transpose(2, 3).contiguous().transpose(2, 3)), "v has head_dim stride"),
        (lambda q, k, v: (q[0], k[0], v[0]), "must be (batch, seq, heads, head_dim)"),
        (lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), "sequence is empty"),
    ],
    ids=["head_dim", "dtype", "mixed_dtype", "shape", "stride", "rank", "empty"],
)
def test_rejects_bad_input(change, message):
    q, k, v, _ = inputs((1, 8, 2, 64), torch.float32)
    with pytest.raises(ValueError, match=re.escape(message)):
        attention(*change(q, k, v))


COMPILE_FOR_H200 = """
import h3_triton.attention as A

def first_tiling(kernel, rows, names, tensors):
    consts = dict(zip(names, rows[0][:-2]), HEAD_DIM=128, UPCAST=False)
    if "EXACT" in kernel.arg_names:
        consts["EXACT"] = tensors["Q"] == "*fp32"
    if "DESCRIBED" in kernel.arg_names:
        consts["DESCRIBED"] = tensors["Q"] == "*bf16"
    compile_(kernel, consts, tensors, *rows[0][-2:])

for size, element in ((2, "*bf16"), (4, "*fp32")):
    tensors = dict.fromkeys(("Q", "K", "V", "O", "DO", "DK", "DV", "DQ"), element)
    tensors.update(ROW_MAX="*fp32", ROW_LOG_SUM="*fp32", DELTA="*fp32")
    first_tiling(A._fwd_kernel, A._FWD_ROWS[size], ("BLOCK_M", "BLOCK_N"), tensors)
    first_tiling(A._delta_kernel, A._DELTA_ROWS[size], ("BLOCK_M",), tensors)
    first_tiling(A._dkdv_kernel, A._DKDV_ROWS[size], ("BLOCK_M", "BLOCK_N"), tensors)
    first_tiling(A._dq_kernel, A._DQ_ROWS[size], ("BLOCK_M", "BLOCK_N"), tensors)
    if size in A._DKDV_DESCRIBED_ROWS:
        first_tiling(A._dkdv_described_kernel, A._DKDV_DESCRIBED_ROWS[size], ("BLOCK_M", "BLOCK_N"), tensors)
"""


def fused_heads(S):
    """bfloat16 q, k, v of (2, S, 3, 128) cut from one fused projection (outer strides not those of a contiguous
    tensor): on a Hopper GPU with Triton 3.6, the heads the Gluon kernels take."""
    fused = torch.randn((2, S, 3, 3, 128), generator=torch.Generator().manual_seed(S)).to(torch.bfloat16)
    return fused.to(DEVICE).unbind(2)


def hopper_heads(S):
    """:func:`fused_heads`, skipping the test where the Gluon kernels do not run."""
    if INTERPRET:
        pytest.skip("Gluon kernels run on a GPU only (test_the_interpreter_never_chooses_the_gluon_kernels)")
    q, k, v = fused_heads(S)
    if not attention_hopper.applies(q):
        pytest.skip("the Gluon kernels run on compute capability 9.0 with Triton 3.6 only")
    return q, k, v


@pytest.mark.skipif(not INTERPRET, reason="on a GPU the hopper tests below run the Gluon kernels themselves")
def test_the_interpreter_never_chooses_the_gluon_kernels(monkeypatch):
    """Under the interpreter the heads the Gluon kernels take on a Hopper GPU must run the Triton kernels, forward
    and backward (Gluon does not interpret): the dispatch must never reach ``attention_hopper``."""

    def unreachable(*args, **kwargs):
        raise AssertionError("the interpreter chose a Gluon kernel")

    monkeypatch.setattr(attention_hopper, "forward", unreachable)
    monkeypatch.setattr(attention_hopper, "backward", unreachable)
    q, k, v = (t.requires_grad_(True) for t in fused_heads(65))
    attention(q, k, v).sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("S", [1, 63, 64, 65, 128, 129, 300, 1111])
def test_hopper_forward_has_the_bits_of_the_triton_forward(S):
    """On a Hopper GPU with Triton 3.6 the bfloat16 forward at head_dim 128 runs the Gluon kernel of
    ``attention_hopper``, whose arithmetic is the Triton kernel's step for step: its output and saved row
    statistics must be bitwise the Triton kernel's, for one or two query halves, partial and full last key tiles,
    two batches, and q, k, v cut from one fused projection (outer strides not those of a contiguous tensor)."""
    q, k, v = hopper_heads(S)
    outputs = [attention_module._forward_outputs(q) for _ in range(2)]
    attention_module.triton_forward(q, k, v, *outputs[0])
    attention_module.set_scratch_allocator()
    attention_hopper.forward(q, k, v, *outputs[1], attention_module._qk_scale(128))
    for name, want, got in zip(("output", "row max", "log2 row sum"), *outputs):
        assert torch.equal(got, want), f"{name}: max difference {(got.float() - want.float()).abs().max().item()}"


@pytest.mark.parametrize("S", [1, 63, 64, 65, 128, 129, 300, 1111])
def test_hopper_backward_against_the_triton_backward(S):
    """On a Hopper GPU with Triton 3.6 the bfloat16 backward at head_dim 128 runs the Gluon kernel of
    ``attention_hopper``, whose dK and dV products are the Triton kernel's in the same order: they must be bitwise
    the Triton kernel's. Its dQ adds each key block's float32 term in a fixed order where the Triton dQ kernel
    accumulates inside the tensor cores, so dQ must be repeatable bit for bit and within one bfloat16 rounding of
    the Triton kernel's (any lost, doubled or misplaced term is far outside that); heads split over launches (to
    bound the float32 dQ sum's memory) must not change a bit. Cases: one or two key halves, partial and full last
    tiles (padded rows and keys must vanish), two batches; dO is a strided view as autograd may hand it."""
    q, k, v = hopper_heads(S)
    do = torch.randn((2, S, 3, 256), generator=torch.Generator().manual_seed(10_000 + S)).to(torch.bfloat16)
    do = do.to(DEVICE)[..., 64:192]
    o, row_max, row_log_sum = attention_module._forward_outputs(q)
    attention_module.triton_forward(q, k, v, o, row_max, row_log_sum)
    saved = (q, k, v, do, row_max, row_log_sum, attention_module.row_delta(o, do))
    grads = [torch.empty((3, 2, S, 3, 128), dtype=q.dtype, device=DEVICE).unbind(0) for _ in range(4)]
    attention_module.triton_backward(*saved, *grads[0])
    attention_module.set_scratch_allocator()
    scales = attention_module.backward_scales(128)
    for gluon_grads in grads[1:3]:
        attention_hopper.backward(*saved, *gluon_grads, *scales)
    attention_hopper.backward(*saved, *grads[3], *scales, sum_bytes=1)  # a launch a head
    want, got, again, split = grads
    for name, w, g in zip(("dk", "dv"), want[1:], got[1:]):
        assert torch.equal(g, w), f"{name}: max difference {(g.float() - w.float()).abs().max().item()}"
    assert torch.equal(got[0], again[0]), "dq: two runs differ"
    for name, g, h in zip(("dq", "dk", "dv"), got, split):
        assert torch.equal(g, h), f"{name}: a launch a head differs from one launch"
    torch.testing.assert_close(got[0], want[0], rtol=2 ** -7, atol=2 ** -14 * want[0].abs().max().item())


def test_compiles_for_h200():
    """The interpreter accepts code the GPU compiler rejects: compile each kernel's first tiling of both dtypes
    for sm_90 at D = 128 (the bfloat16 forward reading through tensor descriptors, as contiguous inputs do) and
    check it fits the H200's 227 KiB of shared memory per block."""
    compile_for_h200(COMPILE_FOR_H200)
