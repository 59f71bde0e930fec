"""The candidate: a kernel in the place of the provider's ``rms_norm_modulate``; every other op stays diffusers'.

The adapter speaks the op's signature (``h3gate.op_registry``: ``rms_norm_modulate(x, weight, eps, scale=None,
shift=None, idx=None)``) and leaves the AdaLN modulation to torch, as the kernel only normalises. It declares the
dtype the kernels are written for (bfloat16, the blocks' precision), so the kernel gate qualifies it there and reports
its float32 items, like those of the ops it leaves to the provider, as not claimed. ``kernel`` picks the stand-in
(any CPU) or Liger-Kernel's Triton RMSNorm from PyPI (a GPU); an unknown name or a missing package is refused when
the candidate is built, before any gate runs.
"""

from h3gate.candidates import CandidateError, Option, replace

from h3_example_rmsnorm.kernel import KERNELS


def _ops(modulate_in_float32: bool, kernel: str) -> dict:
    if kernel not in KERNELS:
        raise CandidateError(f"example-rmsnorm option kernel={kernel!r}: choose one of {', '.join(KERNELS)}")
    try:
        rms_norm = KERNELS[kernel]()
    except ImportError as error:
        raise CandidateError(f"example-rmsnorm: {error}") from None

    def rms_norm_modulate(x, weight, eps, scale=None, shift=None, idx=None):
        y = rms_norm(x, weight, eps)
        if scale is None:
            return y
        if modulate_in_float32:
            y = y.float()
        modulated = y * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)
        return modulated.to(x.dtype)

    rms_norm_modulate.__wrapped__ = rms_norm  # the identity pins the packages whose kernel the op runs
    return {"rms_norm_modulate": rms_norm_modulate}


CANDIDATE = replace(
    "example-rmsnorm",
    _ops,
    supports={"dtypes": ["bfloat16"]},
    options={
        "modulate_in_float32": Option(bool, False, "apply the AdaLN scale and shift in float32, then round"),
        "kernel": Option(str, "stand-in", f"the RMSNorm kernel: {' or '.join(KERNELS)} (Liger-Kernel, on a GPU)"),
    },
)
