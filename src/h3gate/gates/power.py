"""Gate power: every gate run against every mutant and against every provider variant presented as a candidate.

A gate earns trust by rejecting what it exists to reject and accepting what it must accept. The report is a
table subject x gate -> caught / missed (mutants) or accepted / falsely rejected (variants), each with the
first line of the gate's verdict; it passes when every mutant is caught by every gate meant for it (its
``caught_by``), no variant is rejected anywhere, and every kernel-gate item (op, dtype) of a mutated op rejects at
least one of its op's mutants: a mutant counts as caught when any item of its op fails, so an item that can never
fail (a dtype whose checks cannot see any of the bugs) would hide behind its sibling. Taps of the model gate that
no mutant pushed past their bound are listed as non-discriminating: a bound nothing can exceed proves nothing.

The mutants wrap a base candidate's standalone ops (:mod:`h3gate.candidates.mutants`). On a GPU the base is the product,
``h3_triton``; on a CPU, where Triton's interpreter makes each h3_triton gate run take minutes, the base can be
the provider's own ops: the bug is emulated exactly the same way around either base, so what is measured — can
the gate see this bug — is the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from h3gate import gates as gate_registry, numerics, op_registry
from h3gate.block_program import PROVIDER_OPS, Installation
from h3gate.candidates import Candidate, CandidateError
from h3gate.candidates.mutants import MUTANTS, MutantCandidate
from h3gate.gates.kernel import OPS as KERNEL_OPS, shared_torch_side
from h3gate.verdict import Check, GateResult

GATE = "power"
GENERATION_CONTRACT = "generation-preflight"


class _Undo:
    def __init__(self, stack: contextlib.ExitStack):
        self.stack = stack

    def remove(self) -> None:
        self.stack.close()


class VariantCandidate(Candidate):
    """A provider variant presented as a candidate: the provider's own arithmetic under one backend choice.

    ``compiled`` compiles each block (regional compilation, as users deploy it) rather than the whole model."""

    def __init__(self, variant: str, device: str = "cpu"):
        self.mode = numerics.get(variant, device)
        self.name = f"variant:{variant}"

    def identity(self) -> dict:
        return {"name": self.name, "mode": self.mode.name}

    def install(self, transformer):
        """The provider's ops, each run under the mode's switches, which so reach the transformer's ops alone: a
        generation's VAEs and text encoder stay the provider's, as in the generation gate's own variant runs. A
        backward follows its forward's kernels (SDPA) or the defaults (BLAS): provider arithmetic either way."""
        stack = contextlib.ExitStack()
        ops = PROVIDER_OPS
        if self.mode.sets_switches:
            ops = dataclasses.replace(ops, **{f.name: numerics.scoped(self.mode, getattr(ops, f.name))
                                              for f in dataclasses.fields(ops)})
        stack.callback(Installation(transformer, ops).remove)
        if self.mode.compiled:
            for block in transformer.transformer_blocks:
                block.forward = torch.compile(block.forward, dynamic=False)
        return _Undo(stack)

    def with_provider_groups(self, groups) -> Candidate:
        return self

    def kernel_ops(self) -> dict:
        def under_mode(fn):
            def op(*args, **kwargs):
                with numerics.activate(self.mode):
                    return fn(*args, **kwargs)

            return op

        return {name: under_mode(fn) for name, fn in op_registry.provider_ops().items()}


@dataclass
class Row:
    subject: str
    kind: str  # "mutant" or "variant"
    gate: str
    meant: bool  # a mutant: the gate is one of those meant to catch it; a variant: always (must accept)
    rejected: bool
    line: str
    seconds: float = 0.0  # wall time of this subject's run of this gate: where a power item spends its time

    @property
    def ok(self) -> bool:
        return self.rejected if self.kind == "mutant" else not self.rejected

    @property
    def verdict(self) -> str:
        if self.kind == "mutant":
            return "caught" if self.rejected else "missed"
        return "falsely rejected" if self.rejected else "accepted"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    tap_failures: dict[str, int] = field(default_factory=dict)  # model gate tap -> mutants that exceeded it
    model_taps: list[str] = field(default_factory=list)
    kernel_items: dict[str, int] = field(default_factory=dict)  # kernel item of a mutated op -> mutants it rejected

    @property
    def failures(self) -> list[Row]:
        """Mutants missed by a gate meant to catch them, and variants rejected anywhere."""
        return [row for row in self.rows if row.meant and not row.ok]

    @property
    def passed(self) -> bool:
        return bool(self.rows) and not self.failures and not self.blind_kernel_items

    @property
    def non_discriminating(self) -> list[str]:
        return sorted(tap for tap in self.model_taps if not self.tap_failures.get(tap))

    @property
    def blind_kernel_items(self) -> list[str]:
        """Kernel-gate items that rejected none of their op's mutants."""
        return sorted(item for item, rejected in self.kernel_items.items() if not rejected)

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "rows": [{**row.__dict__, "verdict": row.verdict, "ok": row.ok} for row in self.rows],
            "non_discriminating_model_taps": self.non_discriminating,
            "kernel_items": self.kernel_items,
            "blind_kernel_items": self.blind_kernel_items,
        }

    def table(self) -> str:
        gates = [g for g in gates_measured() if any(r.gate == g for r in self.rows)]
        subjects = list(dict.fromkeys(row.subject for row in self.rows))
        cells = {(row.subject, row.gate): row for row in self.rows}
        lines = ["| subject | " + " | ".join(gates) + " |", "|---|" + "---|" * len(gates)]
        for subject in subjects:
            marks = []
            for gate in gates:
                row = cells.get((subject, gate))
                if row is None:
                    marks.append("n/a")
                else:
                    mark = row.verdict + ("" if row.meant else " (not meant)")
                    marks.append(f"**{mark}**" if row.meant and not row.ok else mark)
            lines.append(f"| {subject} | " + " | ".join(marks) + " |")
        return "\n".join(lines)


def gates_measured() -> tuple[str, ...]:
    """Every registered gate but this one and those whose measure is a test's own (a user's threshold)."""
    return tuple(name for name, gate in gate_registry.REGISTRY.items()
                 if name != GATE and not gate.measured_by_test)


def measure(
    model,
    device: str,
    thresholds: Path,
    out_dir: Path,
    base: Candidate,
    mutants=tuple(MUTANTS),
    variants=None,
    gates=None,
    ops=None,
    kernel_examples: int = 4,
    progress=lambda message: None,
) -> Report:
    """The power table of ``gates`` (default: every registered gate but this one) over ``mutants`` of ``base`` and
    the provider ``variants`` of ``device``. Each gate's items and frozen bounds come through the gate protocol
    (:mod:`h3gate.gates`), contract checks included; the generation gate measures its preflight contract. ``ops``
    narrows the kernel gate's items and the mutants to those ops."""
    gates = tuple(gates) if gates is not None else gates_measured()
    if ops is not None:
        mutants = [name for name in mutants if MUTANTS[name].op in ops]
    unknown = [gate for gate in gates if gate not in gates_measured()]
    if unknown:
        raise ValueError(f"unknown gates {unknown}; gates: {', '.join(gates_measured())}")
    base_run = gate_registry.GateRun(
        model.name, lambda: model, device, Path(thresholds), Path(out_dir), options={"contract": GENERATION_CONTRACT},
        kernel_examples=kernel_examples, kernel_shrink=False, diagnostics=False,
        required_override="gate power measurement: every subject runs every gate", _model=model,
    )
    frozen = {}  # gate -> [(item run, its bounds)]
    for gate in gates:
        module = gate_registry.REGISTRY[gate].module
        item_runs = [base_run.with_params(**params) for params in module.items(base_run)
                     if ops is None or "op" not in params or params["op"] in ops]
        has_bounds = module.bounds_file(base_run if not item_runs else item_runs[0]) is not None
        frozen[gate] = [(item, module.load_bounds(item) if has_bounds else None) for item in item_runs]
    subjects = [("mutant", MutantCandidate(name, base)) for name in mutants]
    subjects += [("variant", VariantCandidate(name, device)) for name in (variants if variants is not None else [m.name for m in numerics.variants(device)])]
    model_bounds = frozen["model"][0][1] if "model" in frozen and mutants else None  # taps only mutants exceed
    report = Report(model_taps=sorted(model_bounds.bounds) if model_bounds else [])
    with shared_torch_side():  # every subject meets the kernel gate's same examples
        _measure_subjects(report, subjects, gates, frozen, progress)
    return report


def _measure_subjects(report: Report, subjects: list, gates: tuple, frozen: dict, progress) -> None:
    for kind, candidate in subjects:
        meant = set(candidate.mutant.caught_by) if kind == "mutant" else set(gates_measured())
        for gate in gates:
            items = [(item, bounds) for item, bounds in frozen[gate] if _applies(item.params, kind, candidate)]
            if not items:
                continue  # n/a in the table: no item of this gate the subject meets
            progress(f"{candidate.name} x {gate}")
            start = time.perf_counter()
            repeat = kind == "mutant" or candidate.mode.deterministic  # a variant without one: judged by numerics
            results = [_check_item(gate, dataclasses.replace(item, candidate=candidate, repeat=repeat), bounds)
                       for item, bounds in items]
            rejected = [result for result in results if not result.passed]
            line = (rejected or results)[0].summary()
            report.rows.append(Row(candidate.name, kind, gate, gate in meant, bool(rejected), line,
                                   round(time.perf_counter() - start, 3)))
            if gate == "kernel" and kind == "mutant":
                for (item, _), result in zip(items, results):
                    label = " ".join(str(value) for value in item.params.values())
                    report.kernel_items[label] = report.kernel_items.get(label, 0) + (not result.passed)
            if gate == "model" and kind == "mutant":
                for check in results[0].failures:
                    report.tap_failures[check.name] = report.tap_failures.get(check.name, 0) + 1


def _check_item(gate: str, item, bounds) -> GateResult:
    try:
        return gate_registry.REGISTRY[gate].module.check_item(item, bounds)
    except CandidateError as error:  # NaN or a crash of the candidate: the gate stops it
        return GateResult(gate, item.params, [Check.failed("candidate", "error", str(error))])


def _applies(params: dict, kind: str, candidate) -> bool:
    """A mutant meets the kernel gate at its own op; a variant meets the ops its switches reach, and one whose forced
    backend takes half precision only (flash, cuDNN) their bf16 kernel items alone; one whose backend refuses shapes
    the kernel gate draws meets none of them (the other gates gate it)."""
    if kind == "mutant" and "op" in params:
        return params["op"] == candidate.mutant.op
    if kind == "variant" and "op" in params:  # a kernel item
        if not (candidate.mode.every_shape and reaches(candidate.mode, params["op"])):
            return False
    if kind == "variant" and "dtype" in params:
        return candidate.mode.takes(params["dtype"])
    return True


def reaches(mode: numerics.Mode, op: str) -> bool:
    """Whether a variant's switches can change ``op``'s arithmetic (:attr:`h3gate.op_registry.Op.switches`). One that
    cannot computes the provider's op itself, whose error is torch's and so within the kernel gate's rule by
    construction: its run would prove nothing (``compiled`` changes the model's blocks, never a standalone op)."""
    return any(getattr(mode, switch) is not None for switch in op_registry.by_name(op).switches)


def as_result(report: Report, base: Candidate, params: dict | None = None) -> GateResult:
    """The power report as a gate result (of the item ``params`` name): one check per (subject, gate meant for it),
    the table in the metrics."""
    checks = [
        Check(f"{row.subject} x {row.gate}", "power", 0.0 if row.ok else 1.0, 0.0, row.ok, {"verdict": row.verdict, "line": row.line})
        for row in report.rows
        if row.meant
    ]
    checks += [
        Check(f"kernel {item}", "item_power", float(rejected), 1.0, rejected >= 1, {"mutants_rejected": rejected},
              direction="min")
        for item, rejected in sorted(report.kernel_items.items())
    ]
    context = {"base": base.identity(), "non_discriminating": report.non_discriminating}
    return GateResult(GATE, dict(params or {}), checks, context, {"power_table": report.table(), **report.to_json()})


# The gate protocol (:mod:`h3gate.gates`) ------------------------------------------------------------------

# One item per gate measured, the kernel gate's per op (``gates="all"``), and per kind of subject (``subjects="all"``):
# the mutants or the variants against that gate (or op), so xdist spreads the measurement and each of the report's
# verdicts (every row, the kernel items' power, the model taps no mutant exceeded) still lies whole inside one item:
# a kernel item meets only its own op's mutants, and the verdicts on mutants never depend on a variant's. A callable:
# a gate registered after this module is imported is measured too.
KERNEL_OP = "kernel:"
SUBJECTS = ("mutants", "variants")


def measured() -> tuple[str, ...]:
    return tuple(part for gate in gates_measured()
                 for part in ([KERNEL_OP + op for op in KERNEL_OPS] if gate == "kernel" else [gate]))


LIST_CHOICES = {"gates": measured, "subjects": SUBJECTS}


def items(run) -> list[dict]:
    return [{"measured": part, "subjects": subjects} for part in measured() for subjects in SUBJECTS]


def bounds_file(run) -> None:
    return None  # it uses the bounds the other gates froze


def check_item(run, _bounds) -> GateResult:
    """The mutants' base is the run's candidate on a GPU and the provider's ops on CPU, where the interpreter makes
    h3_triton gate runs slow. An item measures the gate its params name, or every gate, against the kind of subject
    they name, or both; one with nothing to measure on this device (no variant reaches the op) is not claimed."""
    from h3gate.candidates import ProviderCandidate
    from h3gate.gates import NotClaimed

    base = run.candidate if run.device.startswith("cuda") else ProviderCandidate()
    part, subjects = run.params.get("measured"), run.params.get("subjects")
    gate, _, op = (part or "").partition(":")
    with run.progress(None) as bar:
        report = measure(run.model, run.device, run.thresholds, run.out / "power", base, gates=[gate] if part else None,
                         ops=[op] if op else None, progress=bar.step,
                         mutants=() if subjects == "variants" else tuple(MUTANTS),
                         variants=[] if subjects == "mutants" else None)
    if not report.rows:
        raise NotClaimed(f"nothing to measure: no {subjects or 'subject'} on {run.device} can change "
                         f"{part or 'any gate'}'s results (power table n/a)")
    return as_result(report, base, run.params)
