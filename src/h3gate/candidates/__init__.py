"""Candidates: what a gate qualifies, found through the ``h3gate.candidates`` entry-point group.

A candidate installs into a diffusers ``MiniMaxH3Transformer3DModel`` and is removed again cleanly. The
engine reaches kernels only through this registry, so any package can offer a candidate by declaring an
entry point; tests and plugins register in-process ones with :func:`register`. ``provider`` is built in and
changes nothing: qualifying it is the self-check of the whole tool chain.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import importlib.metadata
import inspect
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

GROUP = "h3gate.candidates"
_registered: dict[str, Callable[..., "Candidate"]] = {}


class CandidateError(ValueError):
    """An unknown candidate or one that misbehaves (fails to install, returns bad output)."""


class Candidate:
    """Base class: a name, an identity, and install/remove into a transformer."""

    name = "candidate"
    # What it declares it runs (:data:`SUPPORTS` keys: dtypes, head_dim); a model outside it is refused when a session
    # starts (:meth:`cannot_run`), and ``h3gate candidates`` lists it.
    supports: dict = {}

    def cannot_run(self, config: dict) -> str | None:
        """Why this candidate cannot run a transformer of ``config`` (its diffusers config), by what it declares it
        supports, or None: told before any gate runs, not by a failed freeze or check."""
        head_dims = self.supports.get("head_dim")
        found = config.get("attention_head_dim")
        if head_dims and found not in head_dims:
            return (f"candidate {self.name} supports head_dim {', '.join(map(str, head_dims))}, and the model's "
                    f"attention has head_dim {found}")
        return None

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

    def unclaimed(self, op: str, dtype: str) -> str | None:
        """Why the kernel gate should not qualify ``op`` at ``dtype`` for this candidate (None: it claims it). A
        candidate claims every op it offers by default, so one that offers the provider's op is held to it."""
        return None

    def launch_paths(self) -> "LaunchPaths | None":
        """How the launches of this candidate's kernels say which code path they take
        (:mod:`h3gate.candidates.launch_paths`); None: they say nothing, and the kernel gate reports the model's path
        classes by its model-shaped examples."""
        return None

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
        from h3gate.block_program import OP_GROUPS

        unknown = sorted(set(provider_groups) - set(OP_GROUPS))
        if unknown:
            raise CandidateError(f"{name or self.name}: unknown op group(s) {unknown}; groups: {'+'.join(OP_GROUPS)}")
        self.kernels = dict(kernels)
        self.provider_groups = tuple(group for group in OP_GROUPS if group in provider_groups)
        if name is not None:
            self.name = name

    def _program_kernels(self, kernels: dict) -> dict:
        """The standalone ops the block program calls: ``kernels`` themselves (a subclass may wrap them)."""
        return kernels

    def identity(self) -> dict:
        return {"name": self.name, "provider_groups": list(self.provider_groups)}

    def install(self, transformer):
        """The block program over the kernels, the first call of each held to the op contract
        (:mod:`h3gate.candidates.op_invariants`): a breach is a :class:`CandidateError` naming the op, a verdict of the gate."""
        from h3gate.block_program import PROVIDER_OPS, Installation, ops_from_kernels
        from h3gate.candidates.op_invariants import first_calls_checked
        from h3gate.op_registry import provider_ops

        def breach(op: str, problem: str):
            raise CandidateError(f"candidate {self.name}: {op} broke the op contract on its first call of the run: "
                                 f"{problem}; the kernel gate shows where (pytest -m gate -k {op})")

        provider = provider_ops()
        own = {op: kernel for op, kernel in self.kernels.items() if kernel is not provider[op]}  # the provider's keep it
        kernels = self._program_kernels({**self.kernels, **first_calls_checked(own, provider, breach)})
        return Installation(transformer, ops_from_kernels(kernels).mixed(PROVIDER_OPS, self.provider_groups))

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
        from h3gate.op_registry import provider_ops

        return provider_ops()

    def with_kernel_ops(self, overrides: dict) -> Candidate:
        return ProgramCandidate({**self.kernel_ops(), **overrides}, name="provider-ops")


def source_digest(*roots: Path) -> str:
    """sha256 over the relative paths and bytes of every ``.py`` file under ``roots`` (a root may be one module
    file): a candidate's code identity."""
    digest = hashlib.sha256()
    for root in roots:
        root = Path(root)
        paths = [root] if root.is_file() else sorted(root.rglob("*.py"))
        for path in paths:
            digest.update(path.relative_to(root.parent if root.is_file() else root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _wrapped_chain(fn: Callable) -> list[Callable]:
    """``fn`` and every function it names through ``__wrapped__`` (an adapter of another package's kernel sets it)."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__") and len(chain) < 32:
        chain.append(chain[-1].__wrapped__)
    return chain


def package_identity(fn: Callable) -> dict:
    """The top-level package that defines ``fn``: its distribution (name and version, None when it is not installed
    as one) and the source digest of the package, so a candidate's identity pins the code it installs."""
    top = (getattr(fn, "__module__", None) or "").partition(".")[0]
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if path is None:
        raise CandidateError(f"op function {fn!r} comes from no importable module file; define it in a module")
    root = Path(path).parent if Path(path).name == "__init__.py" else Path(path)
    distributions = importlib.metadata.packages_distributions().get(top, [])
    version = importlib.metadata.version(distributions[0]) if distributions else None
    return {"package": top, "distribution": distributions[0] if distributions else None, "version": version,
            "source_sha256": source_digest(root)}


_PARSERS = {
    bool: lambda text: {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}[text.lower()],
    int: int,
    float: float,
    str: str,
}


@dataclass(frozen=True)
class Option:
    """A typed option of a :func:`replace` candidate: given as ``name:key=value`` on the command line, parsed to
    ``type`` (bool, int, float or str), listed with its help by ``h3gate candidates``."""

    type: type
    default: Any
    help: str

    def __post_init__(self):
        if self.type not in _PARSERS:
            raise TypeError(f"option type {self.type.__name__}: use one of bool, int, float, str")

    def parse(self, candidate: str, key: str, text: str):
        try:
            return _PARSERS[self.type](text)
        except (KeyError, ValueError):
            raise CandidateError(
                f"candidate {candidate!r} option {key}={text!r} is not a {self.type.__name__}: {self.help}"
            ) from None


SUPPORTS = ("dtypes", "head_dim")


def _check_ops(name: str, ops: dict) -> None:
    from h3gate import op_registry

    names = [op.name for op in op_registry.OPS]
    unknown = sorted(set(ops) - set(names))
    if unknown or not ops:
        raise CandidateError(f"candidate {name!r} replaces unknown op(s) {unknown or 'none'}; ops: {', '.join(names)}")


def _check_supports(name: str, supports: dict) -> None:
    import torch

    odd = sorted(set(supports) - set(SUPPORTS))
    if odd:
        raise CandidateError(f"candidate {name!r} declares unknown support key(s) {odd}; keys: {', '.join(SUPPORTS)}")
    dtypes = supports.get("dtypes")
    if dtypes is not None and (isinstance(dtypes, str) or not dtypes or not all(
            isinstance(getattr(torch, d, None), torch.dtype) for d in dtypes)):
        raise CandidateError(f"candidate {name!r} supports dtypes {dtypes!r}: give a list of torch dtype names, "
                             "e.g. ['bfloat16', 'float32']")
    head_dims = supports.get("head_dim")
    if head_dims is not None and (not isinstance(head_dims, (list, tuple)) or not head_dims or not all(
            isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in head_dims)):
        raise CandidateError(f"candidate {name!r} supports head_dim {head_dims!r}: give a list of head sizes, "
                             "e.g. [64, 128]")


class Replacement:
    """A candidate factory from a partial op table: what :func:`replace` returns, registered or named by an entry
    point. Called with the spec's options (strings), it builds the candidate."""

    def __init__(self, name: str, ops, supports: dict, options: dict[str, Option], paths=None):
        if isinstance(ops, dict):
            _check_ops(name, ops)
        _check_supports(name, supports)
        if paths is not None and not (callable(getattr(paths, "recording", None))
                                      and callable(getattr(paths, "planning", None))):
            raise CandidateError(f"candidate {name!r} paths {paths!r}: give an object with recording() and planning() "
                                 "context managers (and optionally left_out), as h3_triton.paths is")
        self.name, self.ops, self.supports, self.options, self.paths = name, ops, dict(supports), dict(options), paths
        self.__signature__ = inspect.Signature(
            [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=o.default) for key, o in options.items()]
        )

    def __call__(self, **given: str) -> "ReplacedCandidate":
        values = {key: option.default for key, option in self.options.items()}
        values.update({key: self.options[key].parse(self.name, key, text) for key, text in given.items()})
        ops = self.ops(**values) if callable(self.ops) else self.ops
        return ReplacedCandidate(self.name, ops, self.supports, values, self.paths)

    def describe(self) -> list[str]:
        """What ``h3gate candidates`` prints under the name: ops (an options-dependent table's at the defaults),
        supports, options with their help."""
        if isinstance(self.ops, dict):
            ops = ", ".join(self.ops)
        else:
            try:
                ops = ", ".join(self.ops(**{key: option.default for key, option in self.options.items()}))
                ops += " (at the default options)"
            except CandidateError as error:
                ops = f"none at the default options ({error})"
        lines = [f"ops: {ops}", f"supports: {_supported(self.supports)}"]
        lines += [f"option {key} ({o.type.__name__}, default {o.default!r}): {o.help}" for key, o in self.options.items()]
        return lines


def _supported(supports: dict) -> str:
    return "; ".join(f"{key}={'+'.join(map(str, value))}" for key, value in supports.items()) or "everything"


class ReplacedCandidate(ProgramCandidate):
    """The provider with some ops replaced: the kernel gate qualifies those ops only, at the dtypes declared. In the
    model, block and generation gates each replaced op runs counted (:mod:`h3gate.candidates.coverage`), so an op that
    declines every call (returns ``NotImplemented``) is caught as a kernel that never ran."""

    def __init__(self, name: str, ops: dict, supports: dict, options: dict, paths=None):
        from h3gate.candidates.coverage import Coverage
        from h3gate.candidates.launch_paths import LaunchPaths
        from h3gate.op_registry import provider_ops

        _check_ops(name, ops)
        self.replaced, self.supports, self.options = dict(ops), supports, options
        self.coverage = Coverage(self.replaced)
        self.paths = None if paths is None else LaunchPaths(paths.recording, paths.planning, self.replaced,
                                                            getattr(paths, "left_out", LaunchPaths.left_out))
        super().__init__({**provider_ops(), **ops}, name=name)

    def _program_kernels(self, kernels: dict) -> dict:
        from h3gate.op_registry import provider_ops

        provider = provider_ops()
        counted = {op: self.coverage.counted(op, kernels[op], provider[op]) for op in self.replaced}
        return {**kernels, **counted}

    @functools.cached_property
    def packages(self) -> list[dict]:
        """The packages of the installed functions and of the functions they name through ``__wrapped__``, digested
        once (a large package's source takes a second)."""
        found = {}
        for fn in self.replaced.values():
            for link in _wrapped_chain(fn)[1:] or [fn]:  # an adapter stands for what it wraps, all the way down
                package = package_identity(link)
                found[package["package"]] = package
        return [found[key] for key in sorted(found)]

    def identity(self) -> dict:
        return {**super().identity(), "replaced_ops": sorted(self.replaced), "supports": self.supports,
                "options": self.options, "packages": self.packages}

    def unclaimed(self, op: str, dtype: str) -> str | None:
        if op not in self.replaced:
            return f"not claimed: candidate {self.name} does not replace {op} (the provider's op runs)"
        if dtype not in self.supports.get("dtypes", (dtype,)):
            return f"not claimed: candidate {self.name} supports {op} in {'+'.join(self.supports['dtypes'])} only"
        return None

    def launch_paths(self) -> "LaunchPaths | None":
        return self.paths


def replace(name: str, ops, *, supports: dict | None = None, options: dict[str, Option] | None = None,
            paths=None) -> Replacement:
    """A candidate that replaces some ops of the provider (:mod:`h3gate.op_registry`) and keeps the rest.

    ``ops`` maps op names to functions in the registry's signatures, or is a function of the typed ``options``
    returning that map; ``supports={"dtypes": ("bfloat16",)}`` says where the kernels apply, so the kernel gate
    qualifies exactly that. Register the result (:func:`register`) or name it by an ``h3gate.candidates`` entry
    point; its identity pins the distribution, version and source of every package whose functions it installs.

    An op function may decline a call by returning ``NotImplemented`` (a shape or dtype its kernel does not take):
    the provider's op then runs on the same arguments. The model, block and generation gates count per op the calls
    it served and those it handed back (``context["coverage"]`` of their results) and fail an op that served none:
    ``coverage.<op>: kernel never ran``. The kernel gate records a shape an op declines and qualifies the others.

    ``paths``: how your kernels' launches say which code path they take, an object with ``recording()`` and
    ``planning()`` context managers yielding the list each launch inside appends its path to (``planning`` launches
    nothing), and optionally ``left_out(op, args, autograd)``
    (:class:`h3gate.candidates.launch_paths.LaunchPaths`). The kernel gate then plans the model's calls through them
    and fails a path the model launches that no example reached; without, it reports the model's path classes by its
    model-shaped examples.
    """
    return Replacement(name, ops, supports or {}, options or {}, paths)


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


def _target(name: str, factory):
    """What the factory of ``name`` calls: the loaded entry point, or the registered factory itself."""
    entry = next((ep for ep in entry_points(group=GROUP) if ep.name == name), None)
    return entry.load() if name not in _registered and entry is not None else factory


def describe(name: str, factory) -> list[str]:
    """Lines about candidate ``name`` for ``h3gate candidates``: a :func:`replace` candidate's ops, supports and
    options; a class's first docstring paragraph, supports and the options of its constructor."""
    target = _target(name, factory)
    if isinstance(target, Replacement):
        return target.describe()
    paragraph = (inspect.getdoc(target) or "(undocumented)").split("\n\n")[0]
    lines = [" ".join(paragraph.replace("``", "").split())]  # the docstring's markup left out
    lines.append(f"supports: {_supported(getattr(target, 'supports', {}))}")
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # a callable without an inspectable signature
        return lines
    return lines + [f"option {p.name}" + ("" if p.default is inspect.Parameter.empty else f" (default {p.default!r})")
                    for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _require_options(name: str, factory, options: dict) -> None:
    """Options the candidate does not take are a usage error naming the ones it does, not a TypeError from deep
    inside its constructor."""
    target = _target(name, factory)
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
