"""The whole-model run streamed block by block: golden made one block at a time, every tap reduced as it appears.

:func:`h3gate.measure.run_taps` holds a float32 copy of the whole transformer and every tap of every run; at
release size (33.1 B parameters) that is 123 GiB of golden weights and 105-210 GB of taps per run, so the model
gate could not run on one GPU. :func:`stream_errors` computes the same errors (``errors_against(run_taps(run),
run_taps(golden))`` for each run) holding only what the next step needs:

- The part before the block stack (projections, token refiner, timestep embedding, rope) runs whole, through
  diffusers' own forward, stopped where it enters the stack; its graph is kept for the last backward step. The
  part after it (``norm_out`` and the two heads) is diffusers' three lines, run on the stack's output.
- The blocks advance in lockstep: for each block the reference (golden) runs first, then every compared run. A
  golden block is the float32 upcast of that block only, made when it runs and dropped after. A compared run's
  tap is reduced at once to :func:`h3gate.compare.compare`'s metrics against golden's, which is dropped once
  every run has used it: only statistics are kept.
- Each run keeps its block inputs (and the stack's output), on the device or in host memory. The backward walks
  the blocks in reverse, recomputing each block's forward from its saved input and back-propagating the incoming
  output gradient through that block alone (``torch.autograd.grad``), in lockstep; the block's output gradient,
  parameter gradients and input gradient are compared as they appear and freed. The pre-stack graph's backward
  comes last, with the input gradient of block 0 and the timestep embedding's gradient summed over every block.

Tap names and inventory are :func:`h3gate.taps.forward_backward`'s with :data:`~h3gate.taps.MODEL_NODES`.
Blocks run diffusers' forward, or a candidate's installed one; under math SDPA (golden, ``sdpa-math``) they run
the block program over :data:`~h3gate.block_program.PROVIDER_OPS`, bitwise diffusers' blocks
(tests/test_block_program.py) with math SDPA in query chunks once the scores would pass 2 GiB (at release size
they would take 305 GiB).

Same numbers as the in-memory run (tests/test_streaming.py): on a CPU every metric is bitwise equal, since each
op sees the same operands in the same order: a block recomputed from its saved input repeats its forward, and
the timestep embedding's gradient is summed in autograd's order (``norm_out``, then the blocks from last to
first). Where not: ``compare`` runs on the tap's device, so on a GPU its float64 sums may differ from the
in-memory gate's host sums in the last bit; the ``compiled`` variant compiles each block (and runs the parts
before and after the stack eagerly) where the in-memory run compiles the whole transformer, so its arithmetic
differs within what compilation may change; golden's attention at release size runs in query chunks.

Memory at release size (sequence S = 38,222 rows, hidden 5,376; measured by benchmarks/release_model_gate.py):
the bfloat16 weights are 61.7 GiB; golden's float32 non-block part 3.1 GiB; one golden block 2.4 GiB (646 M
parameters) plus its float32 parameter gradients 2.4 GiB while the runs catch up; a saved block input is
S x 5,376 values, 392 MiB in bfloat16 and 784 MiB in float32, so golden saves 39.0 GiB over 51 inputs and a
bfloat16 run 19.5 GiB: golden, provider and candidate (a check) 78 GiB, which go to host memory (on the GPU
they would not fit beside the weights), golden and one variant (a freeze step) 58.5 GiB. One block's recomputed
forward and backward at float32 holds about 26 GiB of activations, math SDPA's chunked scores 2 GiB more, and a
comparison float64 temporaries of 1.5 GiB per copy of a tap. About 120 GiB of GPU memory and 80 GiB of host
memory in all: within one H200 (139 GiB) and its host (128 GiB). Host memory is pageable rather than pinned:
torch's pinned allocator rounds each request up to a power of two (784 MiB to 1 GiB), which would take 100 GiB,
and moving a saved input costs little of a block's time.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass, field
from typing import Callable, Collection, Mapping

import torch
from diffusers.models.modeling_utils import get_parameter_dtype

from h3gate import numerics, taps
from h3gate.block_program import PROVIDER_OPS, transformer_block_forward
from h3gate.candidates import Candidate
from h3gate.compare import compare
from h3gate.measure import blamed_on, check_finite, timed
from h3gate.model.identity import Model

HEAD = ("norm_out", "proj_out", "audio_proj_out")  # the modules diffusers' forward runs after the block stack
MATH = "_native_math"  # the attention backend whose runs' blocks go through the block program, in query chunks
SAVED_ON = ("device", "host")


class _Handoff(Exception):
    """Carries the block stack's arguments out of the transformer's forward."""

    def __init__(self, arguments: tuple):
        super().__init__("the transformer's forward reached its block stack")
        self.arguments = arguments


class _Stop(torch.nn.Module):
    def forward(self, *arguments):
        raise _Handoff(arguments)


@contextlib.contextmanager
def _stopped_at_blocks(transformer):
    """The transformer's forward ends where it enters the block stack, for the body."""
    blocks = transformer.transformer_blocks
    transformer.transformer_blocks = torch.nn.ModuleList([_Stop()])
    try:
        yield
    finally:
        transformer.transformer_blocks = blocks


@dataclass
class _Run:
    name: str
    mode: numerics.Mode
    candidate: Candidate | None
    transformer: torch.nn.Module  # golden's: a float32 copy without blocks, which come one at a time
    blocks: torch.nn.ModuleList
    deterministic: bool = False  # torch's deterministic algorithms in its steps (runs compared bitwise)
    saved: list = field(default_factory=list)  # block inputs, then the stack's output
    arguments: dict = field(default_factory=dict)
    stack_inputs: tuple = ()  # (hidden_states, temb, adaln_indices, rotary_emb) as the pre-stack part made them
    grad_hidden: torch.Tensor | None = None
    grad_temb: torch.Tensor | None = None

    @contextlib.contextmanager
    def scope(self):
        """The run's numerics mode and candidate for one step; a crash of the candidate names it."""
        installed = self.candidate.installed(self.transformer) if self.candidate is not None else contextlib.nullcontext()
        strict = numerics.deterministic() if self.deterministic else contextlib.nullcontext()
        with blamed_on(self.candidate), numerics.activate(self.mode), strict, installed:
            yield

    def block(self, index: int) -> torch.nn.Module:
        block = self.blocks[index]
        return copy.deepcopy(block).float() if self.mode.fp32_weights else block

    def call(self, block: torch.nn.Module) -> Callable:
        if self.candidate is None and self.mode.attention_backend == MATH:
            block = functools.partial(transformer_block_forward, PROVIDER_OPS, block)
        return numerics.runner(self.mode, block)


class _Lockstep:
    """The reference's taps, each held until every run has been compared with it; the runs' metrics."""

    def __init__(self, reference: _Run, runs: list[_Run], timings: dict):
        self.reference = reference
        self.timings = timings
        self.pending: dict[str, list] = {}  # tap -> [reference tensor, runs still to compare]
        self.errors: dict[str, dict[str, dict]] = {run.name: {} for run in runs}

    def store(self, run: _Run):
        """What :func:`h3gate.taps.recording` records ``run``'s taps into."""
        return _Taps(functools.partial(self.put, run))

    def put(self, run: _Run, name: str, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        if run is self.reference:
            self.pending[name] = [tensor, len(self.errors)]
            return
        if run.candidate is not None:
            check_finite(run.candidate, name, tensor)
        held = self.pending.get(name)
        if held is None:  # a tap the reference has not: left out, as errors_against leaves it
            return
        with timed(self.timings, "compare"):
            self.errors[run.name][name] = compare(tensor, held[0])
        held[1] -= 1
        if not held[1]:
            del self.pending[name]


@dataclass
class _Taps:
    put: Callable[[str, torch.Tensor], None]


def stream_errors(
    model: Model,
    device: str,
    reference_mode: numerics.Mode,
    runs: Mapping[str, tuple[numerics.Mode, Candidate | None]],
    inputs: dict,
    upstream: dict,
    progress=lambda message: None,
    timings: dict | None = None,
    saved_on: str = "host",
    deterministic: Collection[str] = (),
) -> dict[str, dict[str, dict]]:
    """{run name: {tap: :func:`h3gate.compare.compare` metrics against the reference}} for each of ``runs`` (name ->
    (mode, candidate or None)), from one forward and backward of the whole transformer at ``inputs`` (module
    docstring). ``timings`` collects seconds per phase (``forward.pre``, ``forward.block<i>``, ...; ``compare``
    counts the comparisons inside them); ``saved_on`` says where the runs keep their block inputs; the runs named in
    ``deterministic`` run with torch's deterministic algorithms."""
    if saved_on not in SAVED_ON:
        raise ValueError(f"saved_on is one of {SAVED_ON}, not {saved_on!r}")
    if any(mode.fp32_weights and candidate is not None for mode, candidate in runs.values()):
        raise ValueError("a candidate runs at checkpoint precision, not under the golden mode")
    timings = timings if timings is not None else {}
    transformer = model.transformer.to(device)
    blocks = transformer.transformer_blocks
    if reference_mode.fp32_weights:
        with _stopped_at_blocks(transformer):
            shell = copy.deepcopy(transformer).float()
    reference = _Run(reference_mode.name, reference_mode, None, shell if reference_mode.fp32_weights else transformer, blocks)
    compared = [_Run(name, mode, candidate, transformer, blocks, deterministic=name in deterministic)
                for name, (mode, candidate) in runs.items()]
    lockstep = _Lockstep(reference, compared, timings)
    everyone = [reference, *compared]
    host = torch.device("cpu" if saved_on == "host" else device)

    def step(phase: str, action: Callable[[_Run], None]) -> None:
        progress(phase)
        with timed(timings, phase):
            for run in everyone:
                with run.scope():
                    action(run)

    step("forward.pre", lambda run: _forward_pre(run, inputs, device, lockstep, host))
    for index in range(len(blocks)):
        step(f"forward.block{index}", lambda run: _forward_block(run, index, lockstep, device, host))
    step("forward_backward.head", lambda run: _head(run, upstream, lockstep, device))
    for index in reversed(range(len(blocks))):
        step(f"backward.block{index}", lambda run: _backward_block(run, index, lockstep, device))
    step("backward.pre", lambda run: _backward_pre(run, lockstep))
    return lockstep.errors


def _forward_pre(run: _Run, inputs: dict, device: str, lockstep: _Lockstep, host: torch.device) -> None:
    run.arguments = taps.call_arguments(inputs, device)
    with _stopped_at_blocks(run.transformer), taps.recording(run.transformer, lockstep.store(run)):
        try:
            run.transformer(**run.arguments)
        except _Handoff as handoff:
            run.stack_inputs = handoff.arguments
    if not run.stack_inputs:
        raise RuntimeError("the transformer's forward returned without entering its block stack")
    run.saved = [run.stack_inputs[0].detach().to(host)]


def _block_inputs(run: _Run, index: int, device: str) -> tuple:
    _, temb, adaln_indices, rotary_emb = run.stack_inputs
    hidden = run.saved[index].to(device).detach().requires_grad_(True)
    return hidden, temb.detach().requires_grad_(True), adaln_indices, rotary_emb


def _forward_block(run: _Run, index: int, lockstep: _Lockstep, device: str, host: torch.device) -> None:
    # With gradients on, as in the whole-model run: a kernel may take another path when nothing is saved.
    output = run.call(run.block(index))(*_block_inputs(run, index, device))
    lockstep.put(run, f"nodes.transformer_blocks.{index}", output)
    run.saved.append(output.detach().to(host))


def _head(run: _Run, upstream: dict, lockstep: _Lockstep, device: str) -> None:
    """diffusers' forward after the block stack (its step 5), then the backward of the head alone."""
    transformer, arguments = run.transformer, run.arguments
    hidden, temb, _, _ = _block_inputs(run, len(run.saved) - 1, device)
    run.saved.pop()
    store = lockstep.store(run)
    with taps.recording(transformer, store):
        states = transformer.norm_out(hidden, temb, arguments["timestep_indices"]).to(get_parameter_dtype(transformer.proj_out))
        video = transformer.proj_out(states).index_select(1, arguments["video_indices"])
        audio = transformer.audio_proj_out(states).index_select(1, arguments["audio_indices"])
        loss = taps.upstream_loss(video, audio, upstream, store)
    named = [(name, p) for name, p in transformer.named_parameters() if name.split(".")[0] in HEAD]
    run.grad_hidden, run.grad_temb = _backward(run, lockstep, loss, None, (hidden, temb), named, "")


def _backward_block(run: _Run, index: int, lockstep: _Lockstep, device: str) -> None:
    block = run.block(index)
    hidden, temb, adaln_indices, rotary_emb = _block_inputs(run, index, device)
    run.saved.pop()
    output = run.call(block)(hidden, temb, adaln_indices, rotary_emb)
    lockstep.put(run, f"nodes.transformer_blocks.{index}.grad", run.grad_hidden)
    named = list(block.named_parameters())
    run.grad_hidden, grad_temb = _backward(
        run, lockstep, output, run.grad_hidden, (hidden, temb), named, f"transformer_blocks.{index}."
    )
    # Summed in the order autograd sums the whole-model run's: the head's first, then the blocks' from last to first.
    run.grad_temb = run.grad_temb + grad_temb


def _backward_pre(run: _Run, lockstep: _Lockstep) -> None:
    hidden, temb, _, _ = run.stack_inputs
    leaves = tuple(run.arguments[name] for name in taps.INPUTS_WITH_GRADIENTS)
    named = [
        (name, p) for name, p in run.transformer.named_parameters()
        if name.split(".")[0] not in (*HEAD, "transformer_blocks")
    ]
    gradients = _backward(run, lockstep, (hidden, temb), (run.grad_hidden, run.grad_temb), leaves, named, "")
    for name, gradient in zip(taps.INPUTS_WITH_GRADIENTS, gradients):
        lockstep.put(run, f"input_gradients.{name}", gradient)
    run.stack_inputs, run.arguments, run.grad_hidden, run.grad_temb = (), {}, None, None


def _backward(run, lockstep, outputs, grad_outputs, leaves, named, prefix) -> tuple:
    """The gradients of ``leaves`` (zeros where none arrives), after putting each parameter's of ``named``."""
    wrt = (*leaves, *(p for _, p in named))
    gradients = torch.autograd.grad(outputs, wrt, grad_outputs, allow_unused=True)
    gradients = [taps.grad_or_zeros(gradient, like) for gradient, like in zip(gradients, wrt)]
    for (name, _), gradient in zip(named, gradients[len(leaves):]):
        lockstep.put(run, f"parameter.{prefix}{name}.grad", gradient)
    return tuple(gradients[:len(leaves)])
