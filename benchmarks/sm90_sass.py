"""What a kernel compiles to on an H200 (sm_90), read on any machine: no GPU is needed to compile, only the triton
the H200 runs (3.6, which ``make setup`` installs in ``.venv/triton-3.6``: put it first on ``PYTHONPATH``), whose
wheel ships ptxas, nvdisasm and cuobjdump.

:func:`compile_sm90` compiles a Triton or Gluon kernel at the specialisation a launch would give it, as the
caller states it (constexprs, unit strides among them, and the arguments divisible by 16); :func:`inspect` reads
the result: registers and shared memory (cuobjdump), spilled bytes (ptxas's own report on the kernel's PTX, the
same compile the wheel ran), and the SASS (nvdisasm), whose loops :func:`loops` finds and :class:`Loop`
summarises: its instructions, local-memory accesses (spills reloaded inside it), exponentials, and Hopper's
asynchronous products: how many ``HGMMA`` instructions it issues, in how many commit groups, and how many waits it
makes for all of them (a loop that waits for every group it commits runs its products one after another: ptxas
serialises them where it cannot prove an asynchronous product safe).
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

import triton


def compile_sm90(kernel, types: dict[str, str], consts: dict, aligned=(), **options):
    """``kernel`` (Triton or Gluon) compiled for sm_90: ``types`` gives each runtime argument's type (``*bf16``,
    ``i32``, ``fp32``), ``consts`` each constexpr, ``aligned`` the arguments marked divisible by 16; ``options``
    are the launch's (``num_warps``, ``num_stages``, ``maxnreg``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source_type = ASTSource
    if type(kernel).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as source_type
    signature = {name: "constexpr" if name in consts else types[name] for name in kernel.arg_names}
    marks = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names) if name in aligned}
    constants = {(kernel.arg_names.index(name),): value for name, value in consts.items()}
    source = source_type(kernel, signature, constants, marks)
    return triton.compile(source, target=GPUTarget("cuda", 90, 64), options=options)


@dataclass
class Loop:
    """One loop of the SASS: its body's opcodes, in order."""
    opcodes: list[str]
    lines: list[str] = field(repr=False)

    def count(self, *prefixes: str) -> int:
        return sum(1 for op in self.opcodes if op.startswith(prefixes))

    @property
    def products(self) -> tuple[int, int, int]:
        """(HGMMA instructions, commit groups, waits for every group): groups end at an HGMMA marked ``gsb0``.
        Static counts: in a body with branches (a persistent GEMM's tile loop, its epilogue inside) a wait on a path
        taken once a tile counts as one of every iteration."""
        groups = sum(1 for line in self.lines if "HGMMA" in line and "gsb0" in line)
        drains = sum(1 for line in self.lines if re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0\b", line))
        return self.count("HGMMA"), groups, drains

    def summary(self) -> str:
        hgmma, groups, drains = self.products
        mix = collections.Counter(op.split(".")[0] for op in self.opcodes)
        top = " ".join(f"{op}:{n}" for op, n in mix.most_common(6))
        return (f"{len(self.opcodes):5d} instructions, {hgmma:3d} HGMMA in {groups:2d} groups, {drains:2d} waits for "
                f"all, {self.count('MUFU.EX2'):3d} EX2, {self.count('LDL', 'STL'):2d} local loads/stores | {top}")


@dataclass
class Compiled:
    """What :func:`inspect` reads of one compiled kernel."""
    registers: int
    shared: int
    stack: int
    spill_stores: int
    spill_loads: int
    register_limits: list[int]  # the counts warp-specialised partitions set (setmaxnreg), each once
    sass: list[str] = field(repr=False)

    def summary(self) -> str:
        limits = f" (partitions set {'/'.join(map(str, self.register_limits))})" if self.register_limits else ""
        return (f"{self.registers} registers{limits}, {self.shared} B shared, {self.stack} B stack, spilled "
                f"{self.spill_stores} B stored / {self.spill_loads} B loaded")


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def inspect(compiled) -> Compiled:
    """Registers, shared memory, spills and SASS of ``compiled``."""
    with tempfile.TemporaryDirectory() as folder:
        cubin, ptx = os.path.join(folder, "kernel.cubin"), os.path.join(folder, "kernel.ptx")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", cubin], capture_output=True, text=True,
                               check=True).stdout
        sass = subprocess.run([_tool("nvdisasm"), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout.splitlines()
        report = subprocess.run([_tool("ptxas"), "-arch=sm_90a", "-v", ptx, "-o", os.path.join(folder, "again.cubin")],
                                capture_output=True, text=True, check=True).stderr
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    limits = sorted({int(m.group(1), 16) for line in sass
                     if (m := re.search(r"USETMAXREG\.\S+ (?:\w+, )?(0x[0-9a-f]+)", line))})
    return Compiled(registers=int(re.search(r"REG:(\d+)", usage).group(1)), shared=compiled.metadata.shared,
                    stack=int(re.search(r"STACK:(\d+)", usage).group(1)), spill_stores=int(spills.group(1)),
                    spill_loads=int(spills.group(2)), register_limits=limits, sass=sass)


_OPCODE = re.compile(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s")


def loops(sass: list[str]) -> list[Loop]:
    """The SASS's loops, each the body between a label and a conditional branch back to it, longest first (ptxas
    places the retries of a wait out of line, past the kernel's end, and returns from them with an unconditional
    branch: not a loop)."""
    labels = {m.group(1): i for i, line in enumerate(sass) if (m := re.match(r"^(\.L_x_\d+):", line))}
    spans = [(labels[m.group(1)], i) for i, line in enumerate(sass)
             if (m := re.search(r"@!?U?P\w+\s+BRA `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    found = []
    for first, last in spans:
        body = [line for line in sass[first:last + 1] if _OPCODE.search(line)]
        found.append(Loop([_OPCODE.search(line).group(1) for line in body], body))
    return sorted(found, key=lambda loop: -len(loop.opcodes))


def resident(registers: int, shared: int, warps: int) -> int:
    """Programs an H100/H200 SM holds at once: registers go out per warp in blocks of 256, shared memory per
    program with 1 KiB the runtime keeps, from 64K registers, 228 KiB and 64 warps."""
    per_warp = -(-registers * 32 // 256) * 256
    return min(65536 // per_warp // warps, 233472 // (shared + 1024), 64 // warps, 32)
