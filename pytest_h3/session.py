"""The state one pytest session shares across gate items: options, device, model, candidate, results.

Heavy things (the model, the candidate) are built on first use, once per process, so collecting or
deselecting gates costs nothing. Each gate item becomes a :class:`h3gate.verdict.GateResult`; the session
keeps them and writes ``results.json`` under the output folder when it ends. The options come read and checked in
one :class:`pytest_h3.settings.Settings`.
"""

from __future__ import annotations

import os
import uuid

import pytest

from h3gate import gates as registry
from h3gate.files import WriteError, write_json
from h3gate.verdict import Check, GateResult, Provenance
from pytest_h3 import distribution
from pytest_h3.ledger import Ledger
from pytest_h3.options import CANDIDATE, MODEL, OUT, THRESHOLDS
from pytest_h3.settings import Settings

SESSION_KEY = pytest.StashKey["H3Session"]()
LARGE_FILE = 1 << 26  # bytes from which the header's status uses the digest cache


class H3Session:
    def __init__(self, config, settings: Settings):
        self.config = config
        self.settings = settings
        self.freezing = settings.freeze
        self._device = None
        self.out = settings.out
        self.thresholds = settings.thresholds
        self.ledger = Ledger()
        self.frozen_here: set = set()  # bounds files this (freezing) session wrote
        self.gates_scheduled: dict[str, bool] = {}  # gate kind -> an item of it is among this session's items
        self.summary: list[str] = []
        # One id per test run, shared by its xdist workers: a model gate verdict recorded under it is this run's.
        self.run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
        self.required_recorded: set = set()  # items of required gates whose outcome this process recorded
        self._model = None
        self._candidate = None
        self.sign_key = None  # checked when the session starts (pytest_h3.settings)
        self.started = False
        self.refused = False  # the start refused the session (a usage error): it leaves no results or evidence
        self.interrupted: str | None = None  # the signal that stopped the session (the summary says where)

    @property
    def device(self) -> str:
        """``cpu``, ``cuda`` or ``cuda:N``, resolved on first use (torch is imported only where a GPU may be)."""
        if self._device is None:
            self._device = distribution.resolve_device(self.settings.device)
        return self._device

    # Lazily built shared objects ------------------------------------------------------------------------

    @property
    def model(self):
        if self._model is None:
            from h3gate.model.factory import load_model
            from h3gate.model.identity import ModelError

            try:
                self._model = load_model(self.settings.model, self.settings.model_seed)
            except ModelError as error:
                raise pytest.UsageError(f"{MODEL}: {error}") from None
        return self._model

    @property
    def model_loaded(self) -> bool:
        return self._model is not None

    @property
    def model_name(self) -> str:
        """The model's name (its thresholds folder) without building the model."""
        from h3gate.model.spec import model_name

        return self._model.name if self._model is not None else model_name(self.settings.model)

    def model_ref(self):
        """The model as verdict records name it (:mod:`h3gate.gates.passes`): its source, and its identity once built."""
        from h3gate.gates.passes import ModelRef
        from h3gate.model.spec import model_source

        if self._model is not None:
            return ModelRef(self._model.source, self._model.identity)
        return ModelRef(model_source(self.settings.model, self.settings.model_seed))

    def missing_thresholds(self) -> str:
        """Why the thresholds folder is not there, and how to point at the right one: without --h3-thresholds it is
        ``<rootdir>/thresholds``, and pytest's rootdir is the folder of its configuration file, else of the paths
        given, so a run from a subfolder of a repository without one looks in the subfolder."""
        if self.settings.thresholds_option:
            return f"{self.thresholds} does not exist ({THRESHOLDS})"
        config, root = self.config.inipath, self.config.rootpath
        why = (f"the folder of pytest's configuration {config}" if config else
               "the folder of the paths given, as pytest found no configuration file")
        return (f"{self.thresholds} does not exist: it is <rootdir>/thresholds, and rootdir {root} is {why}; run pytest "
                f"from the folder holding thresholds/, pass {THRESHOLDS}, or set the repository up with h3gate init "
                "(its pytest.ini makes the repository's root the rootdir from every subfolder)")

    def next_after_freezing(self) -> str:
        """What comes after a freeze: the command of the next file the checked gates still miss (first one of the
        gates frozen here, else the news that those are complete), else the command that checks a candidate with
        them (:func:`h3gate.status.check_command`)."""
        from h3gate import status, suite
        from h3gate.evidence.profiles import profile

        settings = self.settings
        gates = {requirement.gate for requirement in profile(status.CHECKED_PROFILE).requirements}
        report = status.status(self.thresholds, settings.model, self.device, gates=gates,
                               shown=settings.thresholds_option)
        todo = [row for row in report.rows if row.state != status.PRESENT]
        written = {path.resolve() for path in self.frozen_here}
        frozen = sorted({row.gate for row in report.rows if (self.thresholds / row.file).resolve() in written})
        todo.sort(key=lambda row: row.gate not in frozen)  # stable: the frozen gates' files first, in order
        done = [gate for gate in frozen if all(row.gate != gate for row in todo)]
        if todo:
            whose = f"{', '.join(done)} gate" + ("s'" if len(done) > 1 else "'s")
            news = f"the {whose} files are all frozen and locked; " if done else ""
            first = todo[0]
            return f"{news}next, {first.file} ({len(todo)} file(s) to go; h3gate status lists them): {first.command}"
        command = status.check_command(suite.recorded(self.thresholds), settings.model,
                                       status.device_option(report.device_class), settings.thresholds_option)
        return f"every file the {', '.join(sorted(gates))} gates read is frozen and locked; next, check a candidate: {command}"

    def thresholds_status(self):
        """The state of the frozen files that the gates of the session's completeness profile read, for its model on
        its device (:mod:`h3gate.status`); large files (release-size captures) are hashed once per size and mtime,
        the lock check at session start hashes all."""
        from h3gate.evidence.profiles import profile
        from h3gate.files import file_digest, sha256_file
        from h3gate.status import status

        def digest(path):
            return file_digest(path) if path.stat().st_size > LARGE_FILE else sha256_file(path)

        gates = {requirement.gate for requirement in profile(self.settings.profile).requirements}
        return status(self.thresholds, self.settings.model, self.device, digest=digest, gates=gates)

    @property
    def candidate(self):
        if self._candidate is None:
            from h3gate.candidates import CandidateError, load

            try:
                self._candidate = load(self.settings.candidate)
            except CandidateError as error:
                raise pytest.UsageError(f"{CANDIDATE}: {error}") from None
        return self._candidate

    def model_config(self) -> dict:
        """The transformer config without loading weights (collection-time checks)."""
        from h3gate.model.spec import transformer_config

        try:
            return transformer_config(self.settings.model)
        except ValueError as error:
            raise pytest.UsageError(f"{MODEL}: {error}") from None

    # Collection -----------------------------------------------------------------------------------------

    def resolve_params(self, kind: str, lists: dict, where: str) -> dict:
        """Validate a marker's kind and list params against the gate's registry entry: a list the gate does not
        take, an empty, duplicate or unknown value is an error naming the test."""
        if kind not in registry.REGISTRY:
            raise ValueError(f"{where}: unknown gate kind {kind!r}; kinds: {', '.join(registry.kinds())}")
        gate = registry.REGISTRY[kind]
        taken = {param.marker: param for param in gate.lists}
        foreign = sorted(set(lists) - set(taken))
        if foreign:
            raise ValueError(f"{where}: the {kind} gate takes {', '.join(taken) or 'no list parameter'}, "
                             f"not {', '.join(foreign)}")
        for key, values in lists.items():
            param = taken[key]
            choices = gate.choices(param, self.model_config)
            if values == "all" and choices is not None:
                values = lists[key] = list(choices)
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"{where}: {key} must be a non-empty list, got {values!r}")
            if any(isinstance(v, bool) or not isinstance(v, param.element) for v in values):
                raise ValueError(f"{where}: {key} must be a list of {param.element.__name__}, got {values!r}")
            duplicates = sorted({v for v in values if list(values).count(v) > 1})
            if duplicates:
                raise ValueError(f"{where}: {key} lists {duplicates} more than once")
            unknown = [v for v in values if choices is not None and v not in choices]
            if unknown:
                raise ValueError(f"{where}: {key} {unknown} are not among the {kind} gate's on this model: "
                                 f"{', '.join(map(str, choices))}")
        return lists

    # Session start and end ------------------------------------------------------------------------------

    def start(self) -> None:
        """Refuse at once what would fail every gate: a tampered thresholds folder, a candidate that cannot be built, an
        --h3-out whose evidence this session's could not join. A refused session writes no results or evidence."""
        if self.started:
            return
        self.started = True
        self.refused = True
        self._start()
        self.refused = False

    def _start(self) -> None:
        import pytest_h3.gate_runner  # noqa: F401  the engine (torch, diffusers), which every gate item needs: paid here,
        import pytest_h3.session_evidence  # noqa: F401  once, not by the first item
        self.share_host_threads()
        self.verify_thresholds()
        if not self.freezing:
            problem = self.candidate.cannot_run(self.model_config())
            if problem:
                raise pytest.UsageError(f"{CANDIDATE}={self.settings.candidate} cannot run {MODEL}="
                                        f"{self.settings.model}: {problem}; qualify it on a model it supports")
            # the controller writes the evidence; a --collect-only session writes none
            if not distribution.is_worker(self.config) and not self.config.option.collectonly:
                from pytest_h3.session_evidence import check_joinable

                check_joinable(self)

    def share_host_threads(self) -> None:
        """A session whose gates run on the CPU computes with one thread (:func:`h3gate.numerics.one_cpu_thread`), so
        one process, its xdist workers and its shards give the same evidence whatever the number of cores or workers,
        and a resumed generation the same bits; one thread a worker also stops workers from oversubscribing the cores.
        On a GPU, each xdist worker computes on its share of the host's cores; a GPU session alone keeps them all."""
        from h3gate import numerics

        if self.device == "cpu":
            numerics.one_cpu_thread()
        elif (share := distribution.host_share(self.config)) is not None:
            numerics.host_threads(share)

    def verify_thresholds(self) -> None:
        from h3gate import bounds as bounds_mod

        if not self.thresholds.is_dir():
            return
        try:
            bounds_mod.verify_lock(self.thresholds)
        except (bounds_mod.BoundsError, ValueError) as error:
            raise pytest.UsageError(str(error)) from None

    def finish(self) -> bool:
        """Worker: hand the results to the controller. Otherwise: write results.json, then the evidence. False when
        either could not be written (the run then fails, the cause in the terminal summary): the results of every
        gate that ran are kept first, so hours of gates are never lost to the last step."""
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput["h3"] = self.ledger.worker_output()
            return True
        outcomes = self.ledger.final_outcomes()
        self.summary += [f"{nodeid}: {line}" for nodeid, line in sorted(self.ledger.preempted.items())]
        if self.interrupted and not self.ledger.preempted:
            self.summary.append(f"stopped by {self.interrupted} after the items that were running: run the same "
                                "command to run the rest")
        self.summary += resumed(self.ledger.results)
        if self.freezing and self.frozen_here:
            self.summary.append(self.next_after_freezing())
        if self.freezing or self.refused or all(outcome.outcome == "deselected" for outcome in outcomes.values()):
            return True  # nothing to add: no gate item ran
        from h3gate.verdict import one_line
        from pytest_h3.session_evidence import write_session_evidence

        results_path = self.out / "results.json"
        try:
            write_json(results_path, {"schema": "h3gate.results/1", "results": self.ledger.results})
        except WriteError as error:  # --h3-out looked writable at the start (os.access) but was not, or no longer
            self.summary.append(f"results NOT written, so neither is the evidence: {error.strerror}, or give "
                                f"{OUT} a folder that can be written")
            return False
        self.summary.append(f"results: {results_path}")
        try:
            self.summary.append(f"evidence: {write_session_evidence(self, results_path, outcomes)}")
        except pytest.UsageError:  # bad input (a damaged checkpoint found when the evidence names the model): exit 4
            raise
        except Exception as error:  # any other cause: the run must not end green without its evidence
            self.summary.append(f"evidence NOT written ({one_line(error)}); the results are kept in {results_path}")
            return False
        return True

    # Gates ----------------------------------------------------------------------------------------------

    def gate(self, kind, params, options, node, record_property, artifacts=dict) -> "GateItem":
        return GateItem(self, kind, params, options, node, record_property, artifacts)


def resumed(results: dict[str, dict]) -> list[str]:
    """A line for each generation of the results that resumed a run an earlier session had cut short: which, and at
    which step (the steps before it were replayed from the run's saved steps)."""
    lines = []

    def walk(nodeid: str, value) -> None:
        if isinstance(value, dict):
            if value.get("resumed_at_step"):
                verified = value.get("verified_step")
                lines.append(f"{nodeid}: resumed {value['run_folder']} at step {value['resumed_at_step']}, the steps "
                             "before it replayed as saved" + ("" if verified is None else
                                                             f", step {verified + 1} recomputed bitwise equal"))
            for child in value.values():
                walk(nodeid, child)

    for nodeid, result in sorted(results.items()):
        walk(nodeid, result.get("context", {}))
    return lines


class GateItem:
    """One gate test item: ``run()`` checks the candidate (or freezes bounds) and records the result."""

    def __init__(self, session: H3Session, kind, params, options, node, record_property, artifacts=dict):
        self.session = session
        self.kind = kind
        self.params = params
        self.options = options
        self.node = node
        self.record_property = record_property
        self.artifacts = artifacts  # () -> {name: {"path", "sha256"}} the test made (generations of h3_generation)

    def run(self) -> GateResult:
        from pytest_h3 import gate_runner
        from pytest_h3.session_evidence import device_facts

        result = gate_runner.run(self)
        made = self.artifacts()
        if made:
            result.context.setdefault("artifacts", {}).update(made)
        if self.session.model_loaded:  # an item that failed before building the model (missing bounds) names none
            result.context.setdefault("model", {"name": self.session.model.name, "identity": self.session.model.identity,
                                                "source": self.session.model.source})
        result.context["device"] = device_facts(self.session.device, distribution.worker_name(self.session.config))
        self.session.ledger.record_result(self.node.nodeid, result.to_json())
        self.record_property("h3_gate", self.kind)
        self.record_property("h3_passed", result.passed)
        self.record_property("h3_summary", result.summary())
        if result.checks:
            self.record_property("h3_worst_ratio", round(max(c.ratio for c in result.checks), 6))
        if result.provenance.bounds_sha256:
            self.record_property("h3_bounds_sha256", result.provenance.bounds_sha256)
        return result

    def gate_run(self):
        """This item as the gate protocol sees it (:class:`h3gate.gates.GateRun`)."""
        from h3gate.gates import GateRun

        session, settings = self.session, self.session.settings
        return GateRun(
            session.model_name, lambda: session.model, session.device, session.thresholds, session.out,
            candidate=None if session.freezing else session.candidate, params=self.params, options=self.options,
            variant_names=settings.variant_names, force_reason=settings.freeze_force,
            kernel_examples=settings.kernel_examples, verify_last_step=settings.verify_last_step,
            required_override=settings.skip_model_gate, progress=self.progress, stream=self.progress_stream(),
            model_spec=settings.model,
        )

    def bounds(self):
        """The frozen bounds this item checks against (what ``h3_bounds`` returns); missing or unusable bounds are a
        :class:`h3gate.bounds.BoundsError` ending in the command that freezes them."""
        from h3gate import bounds as bounds_mod, gates as registry

        module = registry.REGISTRY[self.kind].module
        gate_run = self.gate_run()
        path = module.bounds_file(gate_run)
        if path is None:
            raise bounds_mod.BoundsError(f"the {self.kind} gate freezes no bounds")
        try:
            return module.load_bounds(gate_run)
        except bounds_mod.BoundsError as error:
            raise bounds_mod.BoundsError(f"{error}; freeze them with the {self.kind} gate's test: "
                                         f"{self.freeze_command(self.freezer(path))}") from None

    def freezer(self, path: Path) -> list[str]:
        """The pytest arguments that select the item freezing ``path``: the gate suite's (:mod:`h3gate.suite`); else
        this test, where it is an item of the gate (a team's threshold); else every gate test (a contract of the
        team's own, which no item of the suite names)."""
        from h3gate import status, suite
        from h3gate.model.spec import num_layers

        thresholds = self.session.thresholds
        item = status.freezing_item(path.relative_to(thresholds).as_posix(), self.session.model_name,
                                    path.parent.name, num_layers(self.session.settings.model))
        if item is not None:
            return suite.targets(suite.recorded(thresholds), item)
        marker = self.node.get_closest_marker("h3_gate")
        return [self.node.nodeid] if marker is not None and marker.args[:1] == (self.kind,) else suite.targets(None, "")

    def freeze_command(self, targets: list[str]) -> str:
        from h3gate.commands import freeze_command

        settings = self.session.settings
        return freeze_command(targets, settings.model, settings.device, settings.thresholds_option)

    def missing_bounds(self, error: Exception) -> GateResult:
        """Missing or unusable bounds fail the gate and say exactly how to freeze them (or where the thresholds folder
        was looked for, when it is not there at all)."""
        if not self.session.thresholds.is_dir():
            reason = f"{error}: {self.session.missing_thresholds()}"
        else:
            reason = f"{error}; freeze them with: {self.freeze_command(self.mending(error))}"
        return GateResult(self.kind, self.params, [Check.failed("bounds", "missing", reason)])

    def mending(self, error: Exception) -> list[str]:
        """The pytest arguments whose freeze mends ``error``: this item where its gate freezes the file, else the item
        that does (a power item reads the bounds that the block, model and generation gates freeze)."""
        path = getattr(error, "path", None)
        if path is None or path == registry.REGISTRY[self.kind].module.bounds_file(self.gate_run()):
            return [self.node.nodeid]
        return self.freezer(path)

    def frozen(self, frozen) -> GateResult:
        """The outcome of a freeze item: bounds written (and which cannot discriminate)."""
        detail = {
            "reason": f"froze {len(frozen.bounds)} bounds into {frozen.path} from {', '.join(frozen.sources)}",
            "non_discriminating": frozen.non_discriminating,
        }
        return GateResult(self.kind, self.params, [Check("bounds", "frozen", 0.0, 0.0, True, detail)],
                          provenance=Provenance(bounds_file=str(frozen.path)))

    def progress_stream(self):
        """A text stream to the terminal past pytest's capture, for tqdm bars the engine draws itself (none in an xdist
        worker)."""
        from pytest_h3.progress import terminal

        return terminal(self.session.config)

    def progress(self, total: int | None):
        from pytest_h3.progress import Progress

        return Progress(self.session.config, f"{self.kind} gate", total)

