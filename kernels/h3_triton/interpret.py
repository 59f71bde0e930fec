"""The one place that knows where Triton's CPU interpreter (triton 3.9) computes differently from a GPU.

- ``tl.dot`` on bfloat16 operands multiplies their bit patterns (upstream triton issue 11584), and on float32 it
  is numpy's ``matmul``, whose BLAS sums in an order that depends on the CPU and on the operands' shapes (on an AMD
  EPYC with OpenBLAS 0.3.31 a 16 x 64 @ 64 x 64 product differs in the last bit from the first 64 columns of
  16 x 64 @ 64 x 128): :func:`mma` multiplies float64 upcasts of its operands, whose products float64 holds exactly
  (bfloat16 and float32 alike) and whose sums it holds exactly while the products span fewer than 2^31 (bfloat16),
  so the order BLAS adds them in does not show once the sum is rounded to float32.
- float32 -> bfloat16 casts truncate toward zero instead of rounding to nearest even, even when asked for
  ``"rtne"``: a biased half-ULP error that doubles the error of every rounded output. :func:`to_dtype`
  rounds on the bits first, bitwise equal to torch's cast, NaN and infinity included.

- Arithmetic on bfloat16 tensors (``a + b``, ``a * b``, ``tl.maximum``) works on their bit patterns as integers,
  as the dot does: a bfloat16 accumulator (``acc += x``) holds garbage. Every kernel here loads bfloat16 and computes
  in float32, so a kernel bug that accumulates in bfloat16 cannot show under the interpreter as it would on a GPU.

- ``tl.sum(x, axis=0)`` is numpy's sum down the columns of a row-major tile, which adds one row at a time: its
  float32 error grows with the tile's rows, where a GPU's tree reduction grows with their logarithm (a 256-row
  weight-gradient tile summed 2.6x worse than torch's). :func:`column_sum` sums groups of rows first.

Every kernel passes ``INTERPRET`` as the ``UPCAST`` constexpr: on a GPU the branches are resolved at compile
time and the native bf16 tensor-core dot and cast are emitted, so the GPU path pays nothing.
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
    """``acc + a @ b`` with float32 accumulation; float32 operands use IEEE products, never TF32.

    An IEEE float32 dot on a GPU is a chain of FMAs along K; chained into ``acc`` it makes a reduction over
    all of K one sequential sum, whose error grows with K (on an H200 a 467-row weight gradient came out 3x
    worse than cuBLAS's). Each tile's dot therefore sums on its own and is then added to ``acc``: the error
    grows with the tile depth plus the number of tiles. Its accumulator is ``acc * 0`` rather than zeros,
    because Triton rewrites ``dot(a, b, zeros) + acc`` into ``dot(a, b, acc)`` (its Combine pass), which would
    undo the split; ``acc * 0`` is not a constant it may fold. bfloat16 tensor-core dots accumulate into
    ``acc`` directly.
    """
    if UPCAST:
        exact = tl.dot(a.to(tl.float64), b.to(tl.float64), acc.to(tl.float64) * 0.0, out_dtype=tl.float64)
        return acc + exact.to(tl.float32)
    elif a.dtype == tl.float32:
        return acc + tl.dot(a, b, acc * 0.0, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def to_dtype(x, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """float32 ``x`` cast to ``dtype`` rounding to nearest even, as a GPU's cast does."""
    if UPCAST and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = tl.where(x != x, bits | 0x400000, bits + 0x7FFF + ((bits >> 16) & 1))
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def column_sum(x, UPCAST: tl.constexpr):
    """``tl.sum(x, axis=0)`` of a [rows, cols] tile; under the interpreter in two stages of 16 groups of rows, whose
    float32 error matches torch's column sum (a GPU's tree reduction needs no help)."""
    if UPCAST and x.shape[0] >= 32 and x.shape[0] % 16 == 0:
        return tl.sum(tl.sum(tl.reshape(x, (16, x.shape[0] // 16, x.shape[1])), axis=1), axis=0)
    else:
        return tl.sum(x, axis=0)


if INTERPRET:
    from triton.runtime.errors import InterpreterError

    class _InterpretedDeviceFunction(InterpretedFunction):
        """A device function called inside a launch without Triton's re-patching; see :func:`device_function`."""

        def __call__(self, *args, **kwargs):
            if not _launch_patched(self.fn):
                return super().__call__(*args, **kwargs)
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise InterpreterError(repr(e)) from e

    def _launch_patched(fn) -> bool:
        """Whether every ``triton.language`` module visible to ``fn`` (those ``_patch_lang`` would patch) is patched.

        A launch swaps each module's builtins (``tl.load`` among them) for interpreter wrappers, which lack the
        builtin mark, and restores them when it ends. A scan of ``fn``'s globals: microseconds, not milliseconds.
        """
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        return bool(langs) and not any(tl.core.is_builtin(lang.load) for lang in langs)

    def device_function(fn):
        """``triton.jit`` for a device function (a helper that kernels call, never launched with a grid).

        On a GPU this name is ``triton.jit`` itself. Under the interpreter (triton 3.9) each call of a jitted
        device function re-runs ``_patch_lang`` (``InterpretedFunction.__call__``), an ``inspect.getmembers``
        walk over triton.language of ~2 ms that re-patches what the kernel launch (``GridExecutor.__call__``)
        already patched for its whole run. In one tiny-model generation seed 8,134 of the 12,656 ``_patch_lang``
        calls came from these helpers; skipping them cut the candidate's transformer calls from 94 s to 61 s.
        Calls skip the patching while a launch's patch is active and take upstream's path otherwise; the
        rewritten function, hence every bit, is the same. triton-viz made the same fast path
        (Deep-Learning-Profiling-Tools/triton-viz PR #407). triton.language's own jit functions (``tl.zeros``,
        ``tl.sum``, ``tl.cdiv``, ...) still take upstream's path: 4,193 of the calls left.
        """
        jitted = triton.jit(fn)  # upstream's InterpretedFunction, for the options triton.jit passes
        return _InterpretedDeviceFunction(jitted.fn, **jitted.kwargs)

    # Rewrapped here rather than decorated above: a GPU JITFunction's cache_key (hence the tuning store's digest
    # of every kernel calling these) includes the line each function starts on, and those stay put.
    mma, to_dtype, column_sum = (device_function(f.fn) for f in (mma, to_dtype, column_sum))

    def _fast_triton_language() -> None:
        """triton.language's own jit functions (``tl.zeros``, ``tl.sum``, ``tl.cdiv``, ``tl.max``, ...) on the same
        fast path: in one tiny-model forward+backward they are 2,352 device calls, each ~1.5 ms of re-patching.
        Their class is switched in place (the objects are triton.language's; every kernel, ours or not, calls those
        very objects), which changes only whether a call re-patches what its launch already patched: the same
        rewritten function runs, bitwise the same, and a call outside a patched launch takes upstream's path."""
        for value in vars(tl.standard).values():
            if type(value) is InterpretedFunction:
                value.__class__ = _InterpretedDeviceFunction

    _fast_triton_language()

else:
    device_function = triton.jit
