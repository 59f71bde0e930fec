"""Candidates: what a gate qualifies, found through the ``h3gate.candidates`` entry-point group.

A candidate installs into a diffusers ``MiniMaxH3Transformer3DModel`` and is removed again cleanly. The
engine reaches kernels only through this registry, so any package can offer a candidate by declaring an
entry point; tests and plugins register in-process ones with :func:`register`. ``provider`` is built in and
changes nothing: qualifying it is the self-check of the whole tool chain.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

GROUP = "h3gate.candidates"
_registered: dict[str, Callable[..., "Candidate"]] = {}


class CandidateError(ValueError):
    """An unknown candidate or one that misbehaves (fails to install, returns bad output)."""


class Candidate:
    """Base class: a name, an identity, and install/remove into a transformer."""

    name = "candidate"

    def identity(self) -> dict:
        """JSON-ready facts that pin this candidate's arithmetic (name, version, source digest, options)."""
        return {"name": self.name}

    def install(self, transformer):
        """Install into ``transformer``; return a handle whose ``remove()`` undoes it."""
        raise CandidateError(f"candidate {self.name} does not implement install()")

    def with_provider_groups(self, groups) -> "Candidate":
        """This candidate with the op groups ``groups`` run as the provider's ops (for attribution hybrids)."""
        raise CandidateError(f"candidate {self.name} cannot run op groups as the provider (no hybrids)")

    def with_kernel_ops(self, overrides: dict) -> "Candidate":
        """This candidate with some standalone ops replaced (how mutants are made)."""
        raise CandidateError(f"candidate {self.name} does not run through standalone ops that could be replaced")

    def kernel_ops(self) -> dict[str, Callable]:
        """The candidate's standalone ops for the kernel gate (name -> function); none by default."""
        return {}

    @contextlib.contextmanager
    def installed(self, transformer):
        handle = self.install(transformer)
        try:
            yield transformer
        finally:
            handle.remove()


class ProgramCandidate(Candidate):
    """A candidate that is the block program over a table of standalone ops (``kernels``), with any op groups
    run as the provider's instead (``provider_groups``)."""

    def __init__(self, kernels: dict, provider_groups=(), name: str | None = None):
        from h3gate.block_program import OP_GROUPS, PROVIDER_OPS, ops_from_kernels

        unknown = sorted(set(provider_groups) - set(OP_GROUPS))
        if unknown:
            raise CandidateError(f"{name or self.name}: unknown op group(s) {unknown}; groups: {'+'.join(OP_GROUPS)}")
        self.kernels = dict(kernels)
        self.provider_groups = tuple(group for group in OP_GROUPS if group in provider_groups)
        self.ops = ops_from_kernels(self.kernels).mixed(PROVIDER_OPS, self.provider_groups)
        if name is not None:
            self.name = name

    def identity(self) -> dict:
        return {"name": self.name, "provider_groups": list(self.provider_groups)}

    def install(self, transformer):
        from h3gate.block_program import Installation

        return Installation(transformer, self.ops)

    def _derived(self, kernels: dict, provider_groups) -> "ProgramCandidate":
        derived = copy.copy(self)
        ProgramCandidate.__init__(derived, kernels, provider_groups, self.name)
        return derived

    def with_provider_groups(self, groups) -> "ProgramCandidate":
        return self._derived(self.kernels, set(self.provider_groups) | set(groups))

    def with_kernel_ops(self, overrides: dict) -> "ProgramCandidate":
        return self._derived({**self.kernels, **overrides}, self.provider_groups)

    def kernel_ops(self) -> dict[str, Callable]:
        return dict(self.kernels)


class ProviderCandidate(Candidate):
    """The provider itself: the block program over the provider's ops, bitwise the diffusers model (a test
    holds this), so the self-check exposes the same internal taps as any program-based candidate."""

    name = "provider"

    def install(self, transformer):
        from h3gate.block_program import PROVIDER_OPS, Installation

        return Installation(transformer, PROVIDER_OPS)

    def with_provider_groups(self, groups) -> "Candidate":
        return self

    def kernel_ops(self) -> dict[str, Callable]:
        from h3gate.provider_ops import OPS

        return dict(OPS)

    def with_kernel_ops(self, overrides: dict) -> Candidate:
        return ProgramCandidate({**self.kernel_ops(), **overrides}, name="provider-ops")


def source_digest(*roots: Path) -> str:
    """sha256 over the relative paths and bytes of every ``.py`` file under ``roots``: a candidate's code identity."""
    digest = hashlib.sha256()
    for root in roots:
        root = Path(root)
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def register(name: str, factory: Callable[..., Candidate]) -> None:
    """Register an in-process candidate factory (takes the options of the candidate spec)."""
    _registered[name] = factory


def available() -> dict[str, Callable[..., Candidate]]:
    """Every candidate factory: entry points first, in-process registrations over them."""
    found = {ep.name: ep for ep in entry_points(group=GROUP)}
    factories: dict[str, Callable[..., Candidate]] = {name: (lambda ep=ep, **kw: ep.load()(**kw)) for name, ep in found.items()}
    factories.update(_registered)
    return factories


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``name``, ``name:key=value,key=value`` or ``name:variant`` -> (name, options); a bare value is the
    ``variant`` option (``mutant:dropped-key-tile``)."""
    name, _, rest = spec.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            key, value = "variant", item
        if not key or key in options:
            raise CandidateError(f"candidate option {item!r} in {spec!r} is not key=value (or a repeated key)")
        options[key] = value
    return name, options


def _require_options(name: str, factory, options: dict) -> None:
    """Options the candidate does not take are a usage error naming the ones it does, not a TypeError from deep
    inside its constructor."""
    import inspect

    target = factory
    entry = next((ep for ep in entry_points(group=GROUP) if ep.name == name), None)
    if name not in _registered and entry is not None:
        target = entry.load()
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a callable without an inspectable signature: it says for itself
        return
    try:
        signature.bind(**options)
    except TypeError:
        accepted = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        raise CandidateError(
            f"candidate {name!r} takes no option(s) {sorted(set(options) - set(accepted)) or sorted(options)} "
            f"(given as {name}:key=value); its options: {', '.join(accepted) or 'none'}"
        ) from None


def load(spec: str) -> Candidate:
    """The candidate named by ``spec`` (see :func:`parse_spec`)."""
    name, options = parse_spec(spec)
    factories = available()
    if name not in factories:
        raise CandidateError(f"unknown candidate {name!r}; available: {', '.join(sorted(factories)) or 'none'}")
    factory = factories[name]
    _require_options(name, factory, options)
    candidate = factory(**options)
    if not isinstance(candidate, Candidate):
        raise CandidateError(f"candidate {name!r} factory returned {type(candidate).__name__}, not an h3gate Candidate")
    return candidate
