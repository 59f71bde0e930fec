"""h3_triton.interpret: the interpreter's arithmetic of a tile product, the same on every CPU and at every tile width."""

import pytest
import torch
import triton
import triton.language as tl

from h3_triton.interpret import INTERPRET, mma


@triton.jit
def _product_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, WIDTH: tl.constexpr):
    """c[:, :N] = c + a @ b[:, :N] through :func:`mma`, one program; b and c have WIDTH columns."""
    rm, rk, rn = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * WIDTH + rn[None, :])
    c_ptrs = c_ptr + rm[:, None] * WIDTH + rn[None, :]
    tl.store(c_ptrs, mma(a, b, tl.load(c_ptrs), True))


@pytest.mark.skipif(not INTERPRET, reason="the interpreter's arithmetic")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_a_tile_product_is_the_same_at_any_width(dtype):
    """The product of a 16 x 64 by a 64 x 128 tile: its first 64 columns bitwise those of the 64-wide product, and
    each element the float64 sum of its products rounded to float32, then added to the accumulator (numpy's float32
    matmul, the interpreter's ``tl.dot``, differs in the last bit between the two widths on an AMD EPYC)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 64, generator=g).to(dtype), torch.randn(64, 128, generator=g).to(dtype)
    acc = torch.randn(16, 128, generator=g)
    wide, narrow = acc.clone(), acc.clone()
    _product_kernel[(1,)](a, b, wide, M=16, K=64, N=128, WIDTH=128)
    _product_kernel[(1,)](a, b, narrow, M=16, K=64, N=64, WIDTH=128)
    assert torch.equal(wide[:, :64], narrow[:, :64])
    assert torch.equal(narrow[:, 64:], acc[:, 64:])
    assert torch.equal(wide, acc + (a.double() @ b.double()).float())
