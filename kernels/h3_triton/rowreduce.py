"""What the row kernels (norm, rope, elementwise) share; above all, deterministic sums into table rows.

Their backward passes reduce per-row products into weight gradients (every row adds into one row) and
modulation-table gradients (row s adds into table row ``idx[s]``). Atomics would make the float32 sums depend
on scheduling. Instead a fixed number of programs each own a contiguous range of rows and keep the sum of
the current *run* (consecutive rows that share a table row) in registers; when the table row changes the run
is added to the program's own float32 partial slot ``(program, table row)``. A finalize kernel sums the
written slots over programs in one fixed order. The program count depends only on the shape and the device,
so two runs are bitwise equal. Packed H3 sequences hold long runs (text, video and audio segments per
timestep), so a program flushes a handful of times; random row tables still work, at the cost of one flush
per table row per tile.

Slots live in a ``(programs, table_rows, width)`` float32 buffer left uninitialised: each program clears its
own row of flags on entry and loads a slot only once its flag says it was written. Between a program's
store into a slot and its next load of it stands a CTA barrier, which orders global memory within a program;
another stands between every thread's read of a slot's flag and the store that marks it written, so that no
warp sees the mark before its own part of the slot holds a value (it would add the buffer's garbage).

Also here: the row tiling and the input checks.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from h3_triton import paths
from h3_triton.interpret import INTERPRET, column_sum, device_function, to_dtype
from h3_triton.launch import cdiv

# A whole row is one tile in registers; the widest H3 row that needs it is the hidden size, 5376.
MAX_WIDTH = 16384

# Elements per tile: a few KB of bf16 per program keeps loads vectorised and several programs resident per
# SM. The interpreter pays per operation, not per element, so it runs one fixed tile twice that size.
_TILE_ELEMENTS = 8192 if INTERPRET else 4096
# Programs of a reducing kernel per SM: enough resident programs to cover memory latency, while the
# partial slots they leave (programs x touched table rows x width x 4 bytes) stay a few percent of the traffic.
_PROGRAMS_PER_SM = 4
_INTERPRET_PROGRAMS = 4
# Where the interpreter computes differently from a GPU, :mod:`h3_triton.interpret` works around it; this
# constexpr selects those paths at compile time, so the GPU code pays nothing.
UPCAST = tl.constexpr(INTERPRET)


@dataclass(frozen=True)
class RowTiling:
    """Tile of ``rows`` whole rows padded to ``width`` (a power of two) columns, run by ``warps`` warps."""

    rows: int
    width: int
    warps: int


def warps_for(elements: int) -> int:
    """Warps for a tile of ``elements``: 8 to 16 elements per thread and tensor."""
    return max(4, min(16, elements // 512))


def full_row_tiling(width: int, name: str) -> RowTiling:
    """Tiling for kernels that need a whole row at once (a norm over it, or a table row accumulated per row)."""
    if not 0 < width <= MAX_WIDTH:
        raise ValueError(f"{name} has {width} channels; these kernels hold a row in one tile, 1 to {MAX_WIDTH}")
    padded = triton.next_power_of_2(width)
    rows = max(1, _TILE_ELEMENTS // padded)
    return RowTiling(rows=rows, width=padded, warps=warps_for(rows * padded))


def split_rows(rows: int, tile_rows: int, device: torch.device) -> tuple[int, int]:
    """``(programs, rows_per_program)`` for a reducing kernel; rows_per_program is a multiple of ``tile_rows``.

    A function of the shape and the device only, never of tuning, so the summation order is reproducible.
    """
    if INTERPRET:
        target = _INTERPRET_PROGRAMS
    else:
        target = _PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    tiles = max(1, cdiv(rows, tile_rows))
    rows_per_program = cdiv(tiles, min(target, tiles)) * tile_rows
    return cdiv(rows, rows_per_program), rows_per_program


def new_slots(programs: int, table_rows: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised float32 partial slots and their int32 flags; the reducing kernel clears the flags."""
    parts = torch.empty((programs, table_rows, width), dtype=torch.float32, device=device)
    flags = torch.empty((programs, table_rows), dtype=torch.int32, device=device)
    return parts, flags


@device_function
def clear_flags(flag_base, table_rows):
    """Mark every slot of this program unwritten; run once on entry, before any :func:`flush_slot`."""
    for j in range(table_rows):
        tl.store(flag_base + j, 0)


@device_function
def flush_slot(acc, part_base, flag_base, j, width, cols, col_mask):
    """Add the run sum ``acc`` into this program's slot ``j`` (a plain store the first time)."""
    # Orders this program's earlier stores to the slot before the load below, across all of its threads.
    tl.debug_barrier()
    ptrs = part_base + j * width + cols
    if tl.load(flag_base + j) != 0:
        acc += tl.load(ptrs, mask=col_mask, other=0.0)
    tl.store(ptrs, acc, mask=col_mask)
    # Every thread has read the flag before any marks the slot written.
    tl.debug_barrier()
    tl.store(flag_base + j, 1)


@device_function
def _extend_run(acc, run, r, vals, part_base, flag_base, width, cols, col_mask):
    """Add a tile whose rows all belong to table row ``r``, flushing the current run first if ``r`` differs."""
    if r != run:
        flush_slot(acc, part_base, flag_base, run, width, cols, col_mask)
        acc = tl.zeros_like(acc)
        run = r
    return acc + column_sum(vals, UPCAST), run


@device_function
def accumulate_rows(acc, run, vals, table_row, row_mask, part_base, flag_base, width, cols, col_mask):
    """Add the rows of ``vals`` (tile rows x cols, float32) into table rows ``table_row``; returns ``(acc, run)``.

    ``acc`` holds the sum of the current run, whose table row is ``run``. A tile within one table row adds in
    registers (after flushing the run if the table row changed); a tile spanning several table rows flushes
    the run and one column sum per table row it spans, and leaves an empty run. Tiles of one row never span,
    and compile without that path. The caller flushes the last run with :func:`flush_slot`.
    """
    vals = tl.where(row_mask[:, None], vals, 0.0)
    table_row = tl.where(row_mask, table_row, run)
    lo = tl.min(table_row, axis=0)
    if vals.shape[0] == 1:
        acc, run = _extend_run(acc, run, lo, vals, part_base, flag_base, width, cols, col_mask)
    else:
        hi = tl.max(table_row, axis=0)
        if lo == hi:
            acc, run = _extend_run(acc, run, lo, vals, part_base, flag_base, width, cols, col_mask)
        else:
            flush_slot(acc, part_base, flag_base, run, width, cols, col_mask)
            for r in range(lo, hi + 1):
                part = column_sum(tl.where(table_row[:, None] == r, vals, 0.0), UPCAST)
                flush_slot(part, part_base, flag_base, r, width, cols, col_mask)
            acc = tl.zeros_like(acc)
            run = hi
    return acc, run


@device_function
def sum_slots(part_ptr, flag_ptr, programs, table_rows, width, j, cols, col_mask, BLOCK_G: tl.constexpr,
              BLOCK_C: tl.constexpr):
    """Sum over programs of the written slots ``j`` at ``cols``: blocks of programs in order, each a tree sum."""
    total = tl.zeros([BLOCK_C], dtype=tl.float32)
    for g0 in range(0, programs, BLOCK_G):
        g = g0 + tl.arange(0, BLOCK_G)
        slot = g.to(tl.int64) * table_rows + j
        written = tl.load(flag_ptr + slot, mask=g < programs, other=0) != 0
        part = tl.load(
            part_ptr + slot[:, None] * width + cols[None, :], mask=written[:, None] & col_mask[None, :], other=0.0
        )
        total += tl.sum(part, axis=0)
    return total


@triton.jit
def _reduce_slots_kernel(
    part_ptr, flag_ptr, out_ptr, programs, table_rows, width, first,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < width
    total = sum_slots(
        part_ptr, flag_ptr, programs, table_rows, width, first + tl.program_id(1), cols, col_mask, BLOCK_G, BLOCK_C
    )
    out = out_ptr + tl.program_id(1).to(tl.int64) * width + cols
    tl.store(out, to_dtype(total, out_ptr.dtype.element_ty, UPCAST), mask=col_mask)


def slot_blocks(programs: int, width: int) -> RowTiling:
    """Tiling of a finalize kernel: ``rows`` programs' slots by ``width`` columns per step."""
    block_c = min(triton.next_power_of_2(width), 128 if INTERPRET else 64)
    block_g = min(triton.next_power_of_2(max(1, programs)), 128)
    return RowTiling(rows=block_g, width=block_c, warps=warps_for(block_g * block_c))


def reduce_slots(parts: torch.Tensor, flags: torch.Tensor, first: int, out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` (n, width), contiguous, any float dtype, with the sums of slots ``first .. first + n - 1``."""
    programs, table_rows, width = parts.shape
    blocks = slot_blocks(programs, width)
    paths.launch(
        _reduce_slots_kernel, (cdiv(width, blocks.width), out.shape[0]),
        parts, flags, out, programs, table_rows, width, first,
        BLOCK_G=blocks.rows, BLOCK_C=blocks.width, num_warps=blocks.warps,
    )
    return out


_ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_activation(t: torch.Tensor, name: str) -> None:
    """Activations are computed in float32 and rounded once to their own dtype, so float64 would lose precision."""
    if t.dtype not in _ACTIVATION_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; these kernels take bfloat16, float16 or float32")


def as_batch_rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """A ``(batch, seq, width)`` view of ``t`` (..., seq, width); leading dims merge into batch without a copy."""
    if t.dim() < 2:
        raise ValueError(f"{name} must be (..., seq, channels), got shape {tuple(t.shape)}")
    try:
        return t.view(math.prod(t.shape[:-2]), *t.shape[-2:])
    except RuntimeError as error:
        raise ValueError(
            f"the leading dims of {name} (shape {tuple(t.shape)}, strides {t.stride()}) cannot merge into one "
            f"batch dim without a copy; pass {name}.contiguous()"
        ) from error


def check_table(table: torch.Tensor, name: str, width: int, device: torch.device) -> None:
    """A modulation table is a floating (R, width) tensor, possibly a column slice of a wider one."""
    if table.dim() != 2 or table.shape[1] != width or not table.is_floating_point():
        raise ValueError(f"{name} must be a floating (R, {width}) table, got {table.dtype} {tuple(table.shape)}")
    if table.device != device:
        raise ValueError(f"{name} is on {table.device}, the activations on {device}")


def check_row_index(idx: torch.Tensor, seq_len: int, device: torch.device) -> None:
    """``idx`` picks one table row per sequence position; its values must be in [0, R) (not checked on the host)."""
    if idx.dim() != 1 or idx.shape[0] != seq_len or idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"idx must be an int32 or int64 ({seq_len},) tensor, got {idx.dtype} {tuple(idx.shape)}")
    if idx.device != device:
        raise ValueError(f"idx is on {idx.device}, the activations on {device}")
