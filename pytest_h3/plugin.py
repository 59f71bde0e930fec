"""pytest-h3: MiniMax-H3 kernel qualification gates as pytest tests.

Thin glue over the engine (:mod:`h3gate`): options, the ``gate`` and ``h3_gate(kind, **params)`` markers,
parametrization of gate params (``seeds=[42, 43]`` -> items ``[seed42]``, ``[seed43]``), the ``h3_gate``
fixture that runs the engine for the marked gate, JUnit properties, and the session's results file.
"""

from __future__ import annotations

import contextlib
import functools

import itertools
import os
import signal
import sys

import pytest

from h3gate import gates as registry
from h3gate import quiet
from pytest_h3 import distribution, options
from pytest_h3.ledger import gate_of
from pytest_h3.options import DEVICE, FREEZE, FREEZE_FORCE, VARIANTS, WORKERS_PER_GPU
from pytest_h3.session import SESSION_KEY, H3Session
from pytest_h3.settings import Settings, validate

MARKER_HELP = (
    f"h3_gate(kind, **params): a qualification gate of kind {', '.join(registry.kinds())}; list params "
    "(seeds=[...], blocks=[...] or 'all', ops=[...] with dtypes=[...]) become one test item per value"
)


def pytest_addoption(parser):
    options.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Turn Triton's interpreter on for a CPU run before anything imports triton.

    Triton decides at decoration time whether a function is interpreted, its own standard library
    included, and diffusers imports triton: conftest files importing the engine would freeze it
    uninterpreted. This hook runs before any conftest is loaded.
    """
    option = getattr(early_config.known_args_namespace, options.dest(DEVICE))
    per_gpu = getattr(early_config.known_args_namespace, options.dest(WORKERS_PER_GPU))
    if per_gpu < 1:
        raise pytest.UsageError(f"{WORKERS_PER_GPU}={per_gpu}: give at least 1")
    distribution.check_device_option(option)
    distribution.prepare(option, per_gpu)
    if distribution.cpu_run(option) and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "gate: a qualification gate (select the gate suite with -m gate)")
    config.addinivalue_line("markers", MARKER_HELP)
    for line in quiet.pytest_filters():
        config.addinivalue_line("filterwarnings", line)
    settings = Settings.read(config)
    if settings.freeze:
        if distribution.is_worker(config) or _xdist_workers(config):
            raise pytest.UsageError(
                f"{FREEZE} refuses to run under xdist: freezing writes one bounds file and its lock; run it without -n"
            )
    elif settings.freeze_force or settings.variants:
        raise pytest.UsageError(f"{FREEZE_FORCE} and {VARIANTS} only apply together with {FREEZE}")
    distribution.check_pinned(config, settings.device)
    h3 = config.stash[SESSION_KEY] = H3Session(config, settings)
    if not distribution.is_worker(config):  # the controller checks; its workers inherit good settings
        h3.sign_key = validate(settings, getattr(config.option, "numprocesses", None))
        if _xdist_workers(config):
            distribution.check_paths(config)
    config.pluginmanager.register(h3.ledger, f"h3-ledger-{id(config)}")


def _xdist_workers(config) -> bool:
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) and numprocesses != 0


def pytest_sessionstart(session):
    """Under xdist the controller collects nothing: it checks the thresholds and builds the candidate before any
    worker starts when the run selects the gates (``-m gate``); each worker checks again once it collected."""
    config = session.config
    if _xdist_workers(config) and "gate" in (config.getoption("markexpr", "") or ""):
        config.stash[SESSION_KEY].start()


def pytest_collection_finish(session):
    """Before the first gate item: a tampered thresholds folder or a candidate that cannot be built stops the run.
    A session without gate items pays for neither (nor for importing torch)."""
    if any(item.get_closest_marker("h3_gate") is not None for item in session.items):
        session.config.stash[SESSION_KEY].start()


def pytest_itemcollected(item):
    if item.get_closest_marker("h3_gate") is not None:
        item.add_marker(pytest.mark.gate)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    h3 = config.stash[SESSION_KEY]
    spec = h3.settings.shard
    if spec:
        kept, dropped = distribution.shard(items, spec)
        items[:] = kept
        h3.ledger.outside_shard.update(item.nodeid for item in dropped)
    compiled = not distribution.cpu_run(h3.settings.device)
    order = _gate_order(under_xdist=distribution.is_worker(config), compiled=compiled)
    items.sort(key=functools.partial(_rank, order=order))
    scheduled = {(gate_of(item) or {}).get("gate") for item in items}
    h3.gates_scheduled = {kind: kind in scheduled for kind in registry.kinds()}


def _gate_order(under_xdist: bool, compiled: bool = False) -> list[str]:
    """In one process, cheap before expensive (the registry's order: kernel, block, model, generation, ...), so a
    broken kernel is reported in seconds. Over xdist workers, which take items in this order, the expensive gates
    first, so the many short kernel items fill every worker's end instead of one worker finishing a long item alone
    (longest-processing-time-first scheduling); the gates others wait for (the model gate, which the generation
    gate requires) lead, and a gate that waits comes after the next one that does not: xdist hands each worker its
    first items in runs of this order, and a worker whose first item waits idles until the verdict.

    Where kernels are ``compiled`` (a GPU run, not the interpreter), the kernel gate's items follow the gates waited
    for: each compiles its op's kernels for every example class, once for the node (:mod:`pytest_h3.compile_once`),
    while the power items that meet the same ops and examples start beside them and load what they compiled
    instead of compiling it all again alone, which made the power item of attention a cold run's longest pole."""
    kinds = list(registry.kinds())
    if not under_xdist:
        return kinds
    waited_for, waits = registry.required(), registry.waiting()
    order, held = [k for k in kinds if k in waited_for], []
    if compiled:
        order.append("kernel")
    for kind in reversed(kinds):
        if kind in order:
            continue
        if kind in waits:
            held.append(kind)
        else:
            order += [kind, *held]
            held = []
    return order + held


def _rank(item, order: list[str]) -> int:
    """Other tests before gate items, gate items in ``order``."""
    gate = gate_of(item)
    return 0 if gate is None else 1 + order.index(gate["gate"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    gate = gate_of(item)
    if gate is not None:
        from pytest_h3.gate_runner import NOT_CLAIMED

        if report.when == "call" and NOT_CLAIMED in item.stash:
            gate = {**gate, "not_claimed": True}
        report.h3_gate = gate  # rides to the xdist controller with the report
        if gate["gate"] in registry.required():
            _record_unrun(item, gate["gate"], report)
    return report


def _record_unrun(item, kind: str, report) -> None:
    """An item of a required gate that ended without its runner recording an outcome (skipped, a setup error, a test
    body that never ran the gate) records one here: items waiting for it must not wait in vain."""
    h3 = item.config.stash[SESSION_KEY]
    if h3.freezing or item.nodeid in h3.required_recorded or report.when == "teardown":
        return
    if report.when == "setup" and report.passed:
        return
    from h3gate.gates import passes
    from pytest_h3.gate_runner import record

    lines = [line for line in report.longreprtext.strip().splitlines() if line.strip()]
    if report.passed:
        reason = "the test passed without running the model gate"
    else:
        what = "skipped" if report.skipped else ("setup error" if report.when == "setup" else report.outcome)
        reason = f"{what}: {lines[-1].strip()}" if lines else what
    try:
        record(h3, kind, item.nodeid, passes.DID_NOT_RUN, reason)
    except Exception as error:  # never turn a report into a crash of the run
        h3.summary.append(f"could not record the {kind} gate's outcome for {item.nodeid}: {error}")


def pytest_report_header(config):
    """One line: the state of the frozen files the session's model and device need (``h3gate status`` lists them)."""
    h3 = config.stash.get(SESSION_KEY, None)
    if h3 is None:
        return None
    if not h3.thresholds.is_dir():
        return f"h3 thresholds: {h3.missing_thresholds()}"
    try:
        status = h3.thresholds_status()
    except Exception as error:  # a header never stops a run; the gates say what is wrong
        return f"h3 thresholds: unknown ({type(error).__name__}: {error})"
    hint = "" if status.ok else f" (h3gate status --model {h3.settings.model} --device {h3.device} " \
        f"--thresholds {h3.thresholds} lists them, with the commands that make them)"
    return f"h3 thresholds: {status.line()}{hint}"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return distribution.auto_workers(config.getoption(DEVICE), config.getoption(WORKERS_PER_GPU))  # before configure


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    h3 = config.stash.get(SESSION_KEY, None)
    if h3 is not None and h3.summary:
        terminalreporter.write_sep("-", "pytest-h3")
        for line in h3.summary:
            terminalreporter.write_line(line)


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("h3_gate")
    if marker is None:
        return
    if not marker.args:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: h3_gate needs a kind, e.g. @pytest.mark.h3_gate('model')")
    fixture = "h3_threshold" if marker.args[0] == "threshold" else "h3_gate"
    if fixture not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: a test marked h3_gate({marker.args[0]!r}) must take "
                                f"the {fixture} fixture")
    h3 = metafunc.config.stash[SESSION_KEY]
    kind = marker.args[0]
    lists = {key: value for key, value in marker.kwargs.items() if key in _list_markers()}
    try:
        lists = h3.resolve_params(kind, lists, where=metafunc.definition.nodeid)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    if not lists:
        return
    # One item per combination (the kernel gate's ops x dtypes), ids joined with '-': test_kernel[attention-float32].
    taken = {param.marker: param for param in registry.REGISTRY[kind].lists}
    combinations = itertools.product(*([(taken[key], value) for value in values] for key, values in lists.items()))
    params, ids = [], []
    for combination in combinations:
        params.append({param.param: value for param, value in combination})
        ids.append("-".join(f"{param.prefix}{value}" for param, value in combination))
    metafunc.parametrize("h3_gate", params, ids=ids, indirect=True)


def _list_markers() -> set[str]:
    """The marker keywords that are list params of some registered gate (the others are the gate's options)."""
    return {param.marker for gate in registry.REGISTRY.values() for param in gate.lists}


@pytest.fixture
def h3_session(request) -> H3Session:
    """The session's model, candidate, device, thresholds and results."""
    return request.config.stash[SESSION_KEY]


@pytest.fixture
def h3_gate(request, h3_session, record_property):
    """The gate of this test's ``h3_gate`` marker, ready to ``run()`` (check, or freeze under --h3-freeze)."""
    marker = request.node.get_closest_marker("h3_gate")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses the h3_gate fixture but has no h3_gate marker")
    params = dict(getattr(request, "param", {}) or {})
    options = {key: value for key, value in marker.kwargs.items() if key not in _list_markers()}
    return h3_session.gate(marker.args[0], params, options, request.node, record_property)


# Fixtures for a team's own checks ----------------------------------------------------------------------------

GENERATIONS = pytest.StashKey[list]()  # the generations a test made through h3_generation


def _made(node) -> dict:
    """The artifacts of the generations ``node`` made, keyed ``<role>.<workflow>.seed<k>.<file>``."""
    return {f"{g.role}.{g.workflow}.seed{g.seed}.{name}": artifact
            for g in node.stash.get(GENERATIONS, []) for name, artifact in g.artifacts.items()}


@pytest.fixture
def h3_generation(request, h3_session):
    """``generation(seed, role="candidate", *, contract="generation", workflow=None)``: the session model's
    generation of ``seed`` under ``thresholds/<model>/<contract>-contract.json`` by ``role`` ("candidate",
    "provider" or a provider variant's name), an :class:`h3gate.gates.generation.Generation` (video, audio, folder,
    artifacts, identity in its run folder). Reused from the gate's run store under --h3-out when finished, resumed
    bit-exactly when partly saved, generated otherwise; its artifacts enter the result and the evidence of the
    test's ``h3_threshold`` check."""
    from h3gate import numerics
    from h3gate.gates import generation
    from h3gate.gates.threshold import CANDIDATE
    from h3gate.generation import contract as generation_contract
    from h3gate.generation.contract import SUFFIX
    from pytest_h3.gate_runner import failing_in_one_line
    from pytest_h3.progress import terminal

    made = request.node.stash.setdefault(GENERATIONS, [])

    def generate(seed: int, role: str = CANDIDATE, *, contract: str = "generation", workflow: str | None = None):
        if role == CANDIDATE and h3_session.freezing:
            raise pytest.UsageError(f"h3_generation: the candidate does not run under {FREEZE} (freezing measures "
                                    "the provider and its variants only)")
        with failing_in_one_line():
            loaded = generation_contract.load(h3_session.thresholds / h3_session.model_name / f"{contract}{SUFFIX}")
            provider = role in (CANDIDATE, numerics.PROVIDER.name)
            mode = numerics.PROVIDER if provider else numerics.get(role, h3_session.device)
            result = generation.run_generation(
                h3_session.model, loaded, seed, h3_session.device, h3_session.out, workflow=workflow, mode=mode,
                candidate=h3_session.candidate if role == CANDIDATE else None, progress=terminal(request.config),
            )
        made.append(result)
        return result

    return generate


@pytest.fixture
def h3_threshold(request, h3_session, record_property):
    """``threshold(name, measure, *, margin=0.5) -> GateResult``: a team's own metric as a gate
    (:mod:`h3gate.gates.threshold`); the test carries ``@pytest.mark.h3_gate("threshold")``. ``measure(role)``
    scores the output of ``role`` ("provider", a variant's name or "candidate") as a number or ``{key: number}``.
    Under --h3-freeze it freezes and locks the bounds from the provider variants; otherwise it checks the
    candidate, recorded in the results, JUnit properties and evidence like every gate: one threshold per test."""
    marker = request.node.get_closest_marker("h3_gate")
    if marker is None or marker.args[:1] != ("threshold",):
        raise pytest.UsageError(f"{request.node.nodeid} uses h3_threshold: mark it @pytest.mark.h3_gate('threshold')")
    called = []

    def threshold(name: str, measure, *, margin: float | None = None):
        from h3gate.gates.threshold import DEFAULT_MARGIN

        if called:
            raise pytest.UsageError(f"{request.node.nodeid}: one h3_threshold per test ({called[0]!r} ran already); "
                                    "give a threshold several keys with a measure that returns a dict")
        called.append(name)
        options = {"name": name, "measure": measure, "margin": DEFAULT_MARGIN if margin is None else margin}
        item = h3_session.gate("threshold", {}, options, request.node, record_property,
                               artifacts=lambda: _made(request.node))
        return item.run()

    return threshold


@pytest.fixture
def h3_bounds(request, h3_session, record_property):
    """``bounds(gate, **params)``: the frozen bounds an item of ``gate`` checks against (``bounds("block", block=0)``,
    ``bounds("generation", seed=42, contract="generation-preflight")``), or a BoundsError naming the freeze command."""
    list_params = {param.param for gate in registry.REGISTRY.values() for param in gate.lists}

    def bounds(gate: str, **params):
        if gate not in registry.REGISTRY:
            raise pytest.UsageError(f"h3_bounds: unknown gate {gate!r}; gates: {', '.join(registry.kinds())}")
        options = {key: value for key, value in params.items() if key not in list_params}
        items = {key: value for key, value in params.items() if key in list_params}
        from pytest_h3.gate_runner import failing_in_one_line

        with failing_in_one_line():
            return h3_session.gate(gate, items, options, request.node, record_property).bounds()

    return bounds


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """A worker's collection stopped by a usage error hands it to the controller (:mod:`pytest_h3.distribution`)."""
    try:
        return (yield)
    except pytest.UsageError as error:
        distribution.keep_usage_error(session, error)
        raise


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    distribution.note_usage_errors(node)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """A Ctrl-C (or a scheduler's SIGTERM) ends a session in one line of its summary for each generation it preempted,
    "preempted at step k/N; run the same command to resume": not pytest's KeyboardInterrupt banner, nor xdist's
    traceback of its controller's wait. A preempted item is skipped and stops its session (:mod:`pytest_h3.gate_runner`),
    which pytest and xdist end as interrupted. Under xdist the first signal is held (:func:`pytest_h3.distribution.
    first_signal_held`): a worker outside a generation stops after its current item, and the controller ends when its
    workers have. In one process a SIGTERM outside a generation stops the item it meets, as a Ctrl-C does
    (:func:`pytest_h3.distribution.signals_noted`), and the summary says so. A signal that comes once every item has
    run (a time limit met as the session ends) stops nothing: the exit status is the session's own."""
    h3 = session.config.stash.get(SESSION_KEY, None)
    worker = distribution.is_worker(session.config)

    def stop_after_the_item(signum):
        session.shouldstop = f"stopped by {signal.Signals(signum).name}"

    holding = worker or _xdist_workers(session.config)
    with distribution.first_signal_held(stop_after_the_item if worker else None) if holding \
            else distribution.signals_noted() as received:
        try:
            result = yield
            distribution.raise_usage_errors(session.config)
            return result
        except KeyboardInterrupt:  # a worker's goes on to its controller, which xdist tells by the exit status
            distribution.raise_usage_errors(session.config)  # a worker stopped by one stops its controller
            if h3 is None or worker or not (h3.ledger.preempted or received):
                raise
            name = signal.Signals(received[0]).name if received else "a signal"
            if h3.ledger.preempted or len(h3.ledger.finished) < session.testscollected:
                h3.interrupted = name
            else:  # a scheduler's stop as the session ended: the session is whole, and its exit status says how it went
                h3.summary.append(f"{name} came after every item had run: nothing is left to run")
            return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In one process, a preempted generation ends the session once its skip is reported, as a Ctrl-C ends it
    (:func:`pytest_runtestloop` takes it); a worker stops through ``session.shouldstop`` instead."""
    result = yield
    h3 = item.config.stash.get(SESSION_KEY, None)
    if h3 is not None and item.nodeid in h3.ledger.preempted and not distribution.is_worker(item.config):
        raise KeyboardInterrupt(h3.ledger.preempted[item.nodeid])
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The results and evidence, written whole: a Ctrl-C or SIGTERM that comes meanwhile (a time limit met as the
    session ends) waits for them, where it would kill the process with the results of hours of gates unwritten; a
    second stop, a second or more later, stops at once (:func:`pytest_h3.distribution.first_signal_held`)."""
    h3 = session.config.stash.get(SESSION_KEY, None)
    if h3 is None:
        return
    with distribution.first_signal_held() as received:
        written = h3.finish()
    if received:
        h3.summary.append(f"{signal.Signals(received[0]).name} came as the session wrote its results and evidence: "
                          "they were written first")
    if not written:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    elif h3.interrupted:
        session.exitstatus = pytest.ExitCode.INTERRUPTED
