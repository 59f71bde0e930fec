"""What kernels that read through Triton's device-side tensor descriptors (TMA on Hopper) need from the host.

- Scratch memory: ``tl.make_tensor_descriptor`` writes each descriptor to global memory that Triton asks an
  allocator for at launch. Triton keeps the allocator in a context variable, which autograd's backward threads
  do not inherit, so :func:`set_scratch_allocator` runs before every such launch (torch's caching allocator
  serves the few hundred bytes).
- Alignment: a descriptor's base address and every stride but the unit one must be multiples of 16 bytes
  (:func:`aligned`); anything else is read by the pointer kernels.
- Persistent grids: :func:`program_slots` is the number of programs that run at once, one per SM.
"""

import functools

import torch
import triton

from h3_triton.interpret import INTERPRET

_TMA_ALIGNMENT = 16
# Under the interpreter programs run one after the other; a few of them still walk several tiles each.
_INTERPRETER_SLOTS = 3


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cpu" if INTERPRET else "cuda")


def set_scratch_allocator() -> None:
    triton.set_allocator(_scratch)


def aligned(t: torch.Tensor, strides: tuple[int, ...]) -> bool:
    """Whether ``t``'s first element and the given element strides fall on 16-byte boundaries."""
    size = t.element_size()
    return t.data_ptr() % _TMA_ALIGNMENT == 0 and all(stride * size % _TMA_ALIGNMENT == 0 for stride in strides)


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def program_slots(device: torch.device) -> int:
    if INTERPRET:
        return _INTERPRETER_SLOTS
    return _multiprocessors(device.index if device.index is not None else torch.cuda.current_device())
