"""``h3_triton.gemm`` against float64 torch, forward and every gradient.

Rule: the candidate's relative L2 error to float64 (computed from the same low-precision inputs, upcast) is at
most twice torch's own error at that precision plus one unit roundoff of the dtype. Every input is a strided
view into a larger NaN-filled buffer, so a load that strays past a mask turns the result into NaN.
"""

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from h3_triton import gemm
from h3_triton.interpret import INTERPRET
from h3_triton.gemm import linear, silu_linear
from kernel_checks import CountingLaunches
from sm90 import compile_for_h200, h200_triton_path


DEVICE = "cpu" if INTERPRET else "cuda"
PAD = 2


def carved(shape, dtype, seed, pad=(PAD,)):
    """Standard normal values in a view offset by ``pad`` (one per dim, or one for all) into a NaN buffer."""
    pads = pad * len(shape) if len(pad) == 1 else pad
    buf = torch.full([s + 2 * p for s, p in zip(shape, pads)], float("nan"), dtype=dtype, device=DEVICE)
    view = buf[tuple(slice(p, p + s) for s, p in zip(shape, pads))]
    gen = torch.Generator().manual_seed(seed)
    view.copy_(torch.randn(shape, generator=gen).to(dtype))
    return view


def run(fn, inputs, dy, frozen=()):
    """Output and the gradients of every input for ``fn(*inputs)`` back-propagated with ``dy``, but those of the
    inputs at the indices ``frozen`` (which need none)."""
    leaves = [None if t is None else t.detach().requires_grad_(i not in frozen) for i, t in enumerate(inputs)]
    y = fn(*leaves)
    y.backward(dy)
    return [y.detach()] + [t.grad for i, t in enumerate(leaves) if t is not None and i not in frozen]


def rel_l2(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


def check(candidate, low, inputs, dy, names, frozen=()):
    """Compare ``candidate`` and torch's ``low`` precision op on ``inputs`` with the float64 reference."""
    got = run(candidate, inputs, dy, frozen)
    torch_low = run(low, inputs, dy, frozen)
    ref = run(low, [None if t is None else t.double() for t in inputs], dy.double(), frozen)
    assert len(names) == len(got) == len(torch_low), f"{len(got)} results for names {names}"
    for name, g, t, r in zip(names, got, torch_low, ref):
        assert g.dtype == t.dtype and g.shape == t.shape, f"{name}: {g.dtype} {g.shape} vs torch {t.dtype} {t.shape}"
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        err, torch_err = rel_l2(g, r), rel_l2(t, r)
        bound = 2 * torch_err + torch.finfo(g.dtype).eps / 2
        assert err <= bound, f"{name}: relative L2 {err:.3e} > {bound:.3e} (torch {torch_err:.3e})"


def torch_silu_linear(temb, weight, bias):
    return F.linear(F.silu(temb).to(weight.dtype), weight, bias)


# Every M, K and N value of the brief appears; each (M, K, N) runs 2-D and as a (B, S) 3-D slice.
SHAPES = [(1, 48, 80), (7, 80, 48), (130, 96, 200), (600, 200, 96)]
ROWS_3D = {1: (1, 1), 7: (7, 1), 130: (2, 65), 600: (4, 150)}
DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("ndim", [2, 3])
@pytest.mark.parametrize("M,K,N", SHAPES)
def test_linear(M, K, N, ndim, has_bias, dtype):
    lead = (M,) if ndim == 2 else ROWS_3D[M]
    x = carved((*lead, K), dtype, 1)
    weight = carved((N, K), dtype, 2)
    bias = carved((N,), dtype, 3) if has_bias else None
    dy = carved((*lead, N), dtype, 4)
    names = ["y", "dx", "dweight", "dbias"][: 4 if has_bias else 3]
    check(linear, F.linear, [x, weight, bias], dy, names)


def test_linear_layouts():
    """Layouts beyond row slices: a transposed weight, strided columns, 4-D rows that collapse to two
    strides, gradients as autograd may hand them (expanded, or rows that share no split with x), 1-D x."""
    dtype = torch.bfloat16
    weight_t = carved((96, 200), dtype, 2).T  # (N=200, K=96) with unit stride along N
    bias = carved((200,), dtype, 3)
    x_cols = carved((130, 192), dtype, 1)[:, ::2]
    check(linear, F.linear, [x_cols, weight_t, bias], carved((130, 200), dtype, 4), ["y", "dx", "dw", "db"])
    x4 = carved((2, 3, 5, 96), dtype, 5, pad=(0, 1, 0, 3))  # rows break once, after dim 0
    dy_expanded = torch.ones((), dtype=dtype, device=DEVICE).expand(2, 3, 5, 200)
    check(linear, F.linear, [x4, weight_t, bias], dy_expanded, ["y", "dx", "dw", "db"])
    dy_scattered = carved((2, 3, 5, 200), dtype, 6)  # breaks after dims 0, 1 and 2
    check(linear, F.linear, [x4, weight_t, bias], dy_scattered, ["y", "dx", "dw", "db"])
    x1 = carved((96,), dtype, 7)  # a single row without leading dimensions, as torch accepts
    check(linear, F.linear, [x1, weight_t, bias], carved((200,), dtype, 8), ["y", "dx", "dw", "db"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("T,E,N", [(1, 200, 96), (3, 80, 200)])
def test_silu_linear(T, E, N, has_bias, dtype):
    temb = carved((T, E), torch.float32, 1)
    weight = carved((N, E), dtype, 2)
    bias = carved((N,), dtype, 3) if has_bias else None
    dy = carved((T, N), dtype, 4)
    names = ["y", "dtemb", "dweight", "dbias"][: 4 if has_bias else 3]
    check(silu_linear, torch_silu_linear, [temb, weight, bias], dy, names)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_k(dtype, monkeypatch):
    """Skinny products with a long K (the AdaLN input gradient with its weight frozen: K is silu_linear's N;
    linear's bias gradient: K is the rows) are split K: accurate, and the split gradient has the same bits under
    every skinny tiling, since the chunks follow K alone."""
    counting = CountingLaunches(gemm._chunk_sum_kernel)
    monkeypatch.setattr(gemm, "_chunk_sum_kernel", counting)
    n = 2 * gemm._K_CHUNK + 70
    temb, weight, bias = carved((3, 40), torch.float32, 1), carved((n, 40), dtype, 2), carved((n,), dtype, 3)
    dy = carved((3, n), dtype, 4)
    check(silu_linear, torch_silu_linear, [temb, weight, bias], dy, ["y", "dtemb", "dbias"], frozen=(1,))
    assert counting.launches == 1, "the input gradient did not take the split-K path"
    rows = 2 * gemm._K_CHUNK + 30
    x, w, b = carved((rows, 24), dtype, 5), carved((20, 24), dtype, 6), carved((20,), dtype, 7)
    check(linear, F.linear, [x, w, b], carved((rows, 20), dtype, 8), ["y", "dx", "dweight", "dbias"])
    assert counting.launches == 2, "the bias gradient did not take the split-K path"
    tilings = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]): c for c in gemm._SKINNY.tilings[dtype.itemsize]}
    dtembs = []
    for config in tilings.values():
        with gemm._SKINNY.forcing(config):
            dtembs.append(run(silu_linear, [temb, weight, bias], dy, frozen=(1,))[1])
    assert len(dtembs) >= 2
    assert all(torch.equal(dtembs[0], other) for other in dtembs[1:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_short_reductions_are_outer_products(dtype, monkeypatch):
    """Weight and bias gradients over at most 16 rows (the AdaLN's three) whose input needs no gradient sum outer
    products, one per row in row order: accurate, and the same bits under every tiling of that kernel."""
    counting = CountingLaunches(gemm._OUTER.kernel)
    monkeypatch.setattr(gemm._OUTER, "kernel", counting)
    x, w, b = carved((2, 3, 72), dtype, 1, pad=(0, 1, 2)), carved((200, 72), dtype, 2), carved((200,), dtype, 3)
    dy = carved((2, 3, 200), dtype, 4)
    check(linear, F.linear, [x, w, b], dy, ["y", "dweight", "dbias"], frozen=(0,))
    assert counting.launches == 1, "the weight and bias gradients did not take one outer-product launch"
    temb = carved((3, 72), torch.float32, 5)
    grads = []
    for config in gemm._OUTER.tilings[dtype.itemsize]:
        with gemm._OUTER.forcing(config):
            grads.append([run(linear, [x, w, b], dy, frozen=(0,))[1:],
                          run(silu_linear, [temb, w, b], dy[0], frozen=(0,))[1:]])
    flat = [[t for pair in g for t in pair] for g in grads]
    assert len(flat) >= 2 and all(all(map(torch.equal, flat[0], other)) for other in flat[1:])


FEW_ROWS = {  # (fn, input shape and dtype, out_features, bias, pad): both ops, one and several chunks, split rows
    "silu-split-k": (silu_linear, (3, 40), torch.float32, 2 * gemm._K_CHUNK + 70, True, (PAD,)),
    "silu-one-chunk": (silu_linear, (3, 72), torch.float32, 200, True, (PAD,)),
    "linear-split-rows": (linear, (2, 3, 72), None, 2 * gemm._K_CHUNK + 70, False, (0, 1, 2)),
    "linear-16-rows": (linear, (16, 24), None, 130, True, (PAD,)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", FEW_ROWS)
def test_few_rows_backward_is_one_launch_with_the_bits_of_the_products_apart(case, dtype, monkeypatch):
    """The whole backward over at most 16 rows (the AdaLN's) runs in one launch: accurate, with dX bitwise the
    split-K (or skinny) kernel's (weight frozen) and dW, dbias bitwise the outer-product kernel's (input frozen),
    the same bits under every tiling of its launcher, and its tile counters left zero for the next launch."""
    fn, x_shape, x_dtype, n, has_bias, pad = FEW_ROWS[case]
    fused = CountingLaunches(gemm._FEW_ROWS_BACKWARD.kernel)
    monkeypatch.setattr(gemm._FEW_ROWS_BACKWARD, "kernel", fused)
    apart = [CountingLaunches(k) for k in (gemm._chunk_sum_kernel, gemm._OUTER.kernel)]
    monkeypatch.setattr(gemm, "_chunk_sum_kernel", apart[0])
    monkeypatch.setattr(gemm._OUTER, "kernel", apart[1])
    x = carved(x_shape, x_dtype or dtype, 1, pad)
    w, dy = carved((n, x_shape[-1]), dtype, 2), carved((*x_shape[:-1], n), dtype, 4)
    inputs = [x, w, carved((n,), dtype, 3) if has_bias else None]
    low = torch_silu_linear if fn is silu_linear else F.linear
    check(fn, low, inputs, dy, ["y", "dx", "dweight", "dbias"][: 4 if has_bias else 3])
    assert fused.launches == 1 and apart[0].launches == apart[1].launches == 0, (fused.launches, apart)
    together = run(fn, inputs, dy)
    assert all(torch.equal(a, b) for a, b in zip(together, run(fn, inputs, dy))), "a repeated launch differs"
    # one buffer of counters for every launch on a stream: each must leave it zero for the next
    assert not any(count.any() for _, count in gemm._SCRATCH.values()), "tile counters left nonzero"
    assert torch.equal(together[1], run(fn, inputs, dy, frozen=(1,))[1])
    assert all(map(torch.equal, together[2:], run(fn, inputs, dy, frozen=(0,))[1:]))
    for config in gemm._FEW_ROWS_BACKWARD.tilings[dtype.itemsize]:
        with gemm._FEW_ROWS_BACKWARD.forcing(config):
            assert all(map(torch.equal, together, run(fn, inputs, dy))), config


@pytest.mark.parametrize("in_features", [72, 1], ids=["wide", "one-column"])
@pytest.mark.parametrize("rows", [3, 40], ids=["outer", "tiled"])
@pytest.mark.parametrize("layout", ["strided", "contiguous"])
def test_a_bias_gradient_summed_with_its_weight_gradient_has_the_bits_of_its_own(rows, in_features, layout):
    """The bias gradient the weight gradient's kernel sums on the way (few rows; both orientations of its tile;
    contiguous bfloat16 rows take the TMA kernel for the weight gradient, which sums nothing) is bitwise the column
    sum that runs alone when the weight is frozen."""
    made = [carved((rows, in_features), torch.bfloat16, 1), carved((200, in_features), torch.bfloat16, 2),
            carved((200,), torch.bfloat16, 3), carved((rows, 200), torch.bfloat16, 4)]
    x, w, b, dy = made if layout == "strided" else [t.contiguous() for t in made]
    fused = run(linear, [x, w, b], dy)[3]
    frozen = w.detach().requires_grad_(False)
    b_alone = b.detach().requires_grad_(True)
    linear(x.detach(), frozen, b_alone).backward(dy)
    assert torch.equal(fused, b_alone.grad)
    assert torch.allclose(fused.float(), dy.float().sum(0), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "fn,shapes",
    [(linear, [(2, 65, 96), (200, 96), (200,)]), (silu_linear, [(3, 80), (200, 80), (200,)])],
    ids=["linear", "silu_linear"],
)
def test_deterministic(fn, shapes):
    dtypes = [torch.float32 if fn is silu_linear else torch.bfloat16, torch.bfloat16, torch.bfloat16]
    inputs = [carved(s, d, i) for i, (s, d) in enumerate(zip(shapes, dtypes))]
    dy = carved((*shapes[0][:-1], shapes[1][0]), torch.bfloat16, 9)
    first, second = run(fn, inputs, dy), run(fn, inputs, dy)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_bfloat16_rounds_to_nearest_even():
    """With K = 1 the float32 accumulator holds the exact product, so the output must be torch's rounding of
    it, bit for bit; a truncating cast (the interpreter's own) passes the error rule but fails here."""
    x = carved((130, 1), torch.bfloat16, 1)
    weight = carved((200, 1), torch.bfloat16, 2)
    assert torch.equal(linear(x, weight), (x.float() @ weight.float().T).to(torch.bfloat16))


@pytest.fixture
def described_launches(monkeypatch):
    """The (A_T, B_T) of every launch of the TMA GEMM kernel."""
    launches = []
    launcher = gemm._DESCRIBED

    def recording(grid, *args, **meta):
        launches.append((meta["A_T"], meta["B_T"]))
        return launcher(grid, *args, **meta)

    monkeypatch.setattr(gemm, "_DESCRIBED", recording)
    return launches


def test_aligned_bfloat16_runs_the_descriptor_kernel(described_launches):
    """Rows on 16-byte boundaries (pad 8 bfloat16 values) send the forward, the input gradient and the weight
    gradient through the TMA kernel, one stored layout each; ragged M, N, K and NaN around every view."""
    dtype, aligned = torch.bfloat16, (8,)
    x, weight = carved((130, 200), dtype, 1, aligned), carved((136, 200), dtype, 2, aligned)
    bias = carved((136,), dtype, 3, aligned)
    check(linear, F.linear, [x, weight, bias], carved((130, 136), dtype, 4, aligned), ["y", "dx", "dw", "db"])
    # forward (x, W), dx = dy @ W (W read as stored), dW = dy^T x (dy read transposed)
    assert described_launches[:3] == [(False, False), (False, True), (True, True)]


def test_unaligned_rows_run_the_pointer_kernel(described_launches):
    x = carved((130, 200), torch.bfloat16, 1)  # PAD = 2 values: 4 bytes off the boundary
    check(linear, F.linear, [x, carved((136, 200), torch.bfloat16, 2, (8,)), None],
          carved((130, 136), torch.bfloat16, 4, (8,)), ["y", "dx", "dw"])
    assert described_launches == [(False, True)]  # dx = dy @ W alone has aligned operands


def test_descriptor_kernel_rounds_to_nearest_even(described_launches):
    """The TMA kernel's epilogue rounds like torch: K = 8 with one nonzero column keeps the sum exact."""
    x = torch.zeros(130, 8, dtype=torch.bfloat16, device=DEVICE)
    x[:, 0] = carved((130,), torch.bfloat16, 1, (8,))
    weight = carved((200, 8), torch.bfloat16, 2, (8,))
    assert torch.equal(linear(x, weight), (x.float() @ weight.float().T).to(torch.bfloat16))
    assert described_launches == [(False, False)]


def test_output_dtypes():
    temb = torch.randn(3, 48, device=DEVICE)
    weight = torch.randn(80, 48, dtype=torch.bfloat16, device=DEVICE)
    y, dtemb, dweight = run(silu_linear, [temb, weight, None], torch.ones(3, 80, dtype=torch.bfloat16, device=DEVICE))
    assert (y.dtype, dtemb.dtype, dweight.dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)


def test_empty_rows_give_zero_gradients():
    x = torch.empty(0, 48, dtype=torch.float32, device=DEVICE)
    weight = torch.randn(80, 48, device=DEVICE)
    bias = torch.randn(80, device=DEVICE)
    y, dx, dweight, dbias = run(linear, [x, weight, bias], torch.empty(0, 80, device=DEVICE))
    assert y.shape == (0, 80) and dx.shape == (0, 48)
    assert torch.equal(dweight, torch.zeros_like(weight)) and torch.equal(dbias, torch.zeros_like(bias))


W = torch.zeros(80, 48)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: linear(torch.zeros(4, 40), W), "must end in weight's in_features 48"),
        (lambda: linear(torch.zeros(4, 48, dtype=torch.bfloat16), W), "cast x to it"),
        (lambda: linear(torch.zeros(4, 48), W, torch.zeros(48)), r"bias must have shape \(80,\)"),
        (lambda: linear(torch.zeros(4, 48), W.double()), "not supported"),
        (lambda: linear(torch.zeros(4, 48), torch.zeros(80, 48, 1)), "weight must be 2-D"),
        (lambda: linear(torch.zeros(4, 5, 6, 50)[:, 1:, 1:, :48], W), r"pass x.contiguous\(\)"),
        (lambda: silu_linear(torch.zeros(3, 48, dtype=torch.float64), W, None), "temb dtype"),
    ],
)
def test_bad_inputs_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


COMPILE_FOR_H200 = """
import h3_triton.gemm as G

for config in G._DESCRIBED.tilings[2]:
    for a_t, b_t in ((False, False), (False, True), (True, True)):  # forward, dx, dW as _described_matmul runs them
        consts = dict(config.kwargs, A_T=a_t, B_T=b_t, HAS_BIAS=True, INTERPRETED=False, NUM_SMS=132)
        done = compile_(G._tma_gemm_kernel, consts, dict.fromkeys(("a_ptr", "b_ptr", "c_ptr", "bias_ptr"), "*bf16"),
                        config.num_warps, config.num_stages)
        assert "cp.async.bulk.tensor" in done.asm["ptx"] and "wgmma" in done.asm["ptx"], (config, a_t, b_t)

# The skinny kernels as the release model launches them (benchmarks/results/paths-release-cuda.txt), each at every
# bfloat16 tiling: the forward of the AdaLN (a float32 SiLU'd temb over bfloat16 W) and of linear over 15 rows
# (whole, or in float32 chunks of K), and the few-rows backward of silu_linear (3 rows, split into chunks) and of
# linear (15 rows, in one chunk or split: the float32 partial sums).
for a, c, adaln in (("*fp32", "*bf16", True), ("*bf16", "*bf16", False), ("*bf16", "*fp32", False)):
    for config in G._SKINNY.tilings[2]:
        consts = dict(config.kwargs, M_SPLIT=False, HAS_BIAS=adaln, A_SILU=adaln, SILU_GRAD=False, INTERPRETED=False)
        compile_(G._gemm_kernel, consts, dict(a_ptr=a, b_ptr="*bf16", c_ptr=c, bias_ptr="*bf16", z_ptr="*bf16"),
                 config.num_warps, config.num_stages)
for rows, silu, x, partial in ((3, True, "*fp32", "*fp32"), (15, False, "*bf16", "*bf16"),
                               (15, False, "*bf16", "*fp32")):
    tensors = dict(dy_ptr="*bf16", x_ptr=x, w_ptr="*bf16", dx_ptr=x, dw_ptr="*bf16", dbias_ptr="*bf16",
                   partial_ptr=partial, count_ptr="*i32")
    for config in G._FEW_ROWS_BACKWARD.tilings[2]:
        consts = dict(config.kwargs, R=rows, M_SPLIT=False, SILU=silu, HAS_DBIAS=silu, INTERPRETED=False)
        compile_(G._few_rows_backward_kernel, consts, tensors, config.num_warps, config.num_stages)
# the sum of a split-K skinny product's chunks (Triton's default 4 warps, as it is launched)
consts = dict(M_SPLIT=False, HAS_BIAS=False, SILU_GRAD=False, INTERPRETED=False, BLOCK_M=G._SKINNY_ROWS,
              BLOCK_N=G._CHUNK_SUM_N)
compile_(G._chunk_sum_kernel, consts, dict(partial_ptr="*fp32", c_ptr="*bf16", bias_ptr="*bf16", z_ptr="*bf16"), 4, 3)
"""


def test_descriptor_kernel_compiles_for_h200():
    """Every tiling of the TMA GEMM in every operand layout compiles for sm_90 to TMA copies feeding wgmma, and
    every bfloat16 tiling of the AdaLN's forward and few-rows backward compiles, and the split-K chunk sum, each
    within the 227 KiB of shared memory an SM has."""
    compile_for_h200(COMPILE_FOR_H200)


def test_cluster_reading_of_the_descriptor_kernel_runs():
    """``benchmarks/gemm_clusters.py`` (what ``results/sm90-compile/gemm-clusters.log`` holds) compiles the shipped
    TMA kernel in a cluster of two with the H200's Triton and finds its TMA loads in the PTX."""
    env = h200_triton_path(dict(os.environ, TRITON_INTERPRET="0"))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gemm_clusters.py"), "--ctas", "2"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reading = re.fullmatch(r"num_ctas 2: cluster of 2, \d+ B shared a CTA, (\d+) TMA loads in the PTX, \d+ of them "
                           r"multicast\n", done.stdout)
    assert reading and int(reading.group(1)) > 0, done.stdout
