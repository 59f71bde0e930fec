"""The one place that knows Triton's CPU interpreter multiplies bfloat16 ``tl.dot`` operands wrongly.

Under ``TRITON_INTERPRET=1`` (triton 3.9) ``tl.dot`` on bfloat16 operands multiplies their bit patterns
(upstream triton issue 11584). Every kernel calls :func:`mma` with ``UPCAST=INTERPRET``: on the interpreter
both operands are upcast to float32 first (exact, bfloat16 embeds in float32), on a GPU the branch is
resolved at compile time and the native bf16 tensor-core dot is emitted, so the GPU path pays nothing.
"""

import os

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# Read once at import, like Triton itself: the kernels of this package are compiled either for the
# interpreter or for a GPU, never both in one process.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

if INTERPRET and not isinstance(tl.cdiv, InterpretedFunction):
    raise ImportError(
        "TRITON_INTERPRET=1 was set after triton was imported (diffusers imports it): Triton's own library is "
        "compiled for a GPU and the interpreter cannot call it. Set TRITON_INTERPRET=1 in the environment before "
        "starting Python (pytest-h3 does so itself when --h3-device resolves to cpu)."
    )


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` with float32 accumulation; float32 operands use IEEE products, never TF32."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)
