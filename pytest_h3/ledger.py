"""What happened to every gate item of a session, across xdist workers, for the evidence.

Results (the engine's GateResult JSON) exist where an item ran, so workers ship theirs through xdist's
``workeroutput``; outcomes come from the test reports, which xdist forwards to the controller — including
the report it synthesises for an item whose worker died, which is why the controller counts outcomes
itself. A gate item's gate and params ride on its reports, so a skipped or crashed item still names them.
"""

from __future__ import annotations

import json

import pytest

from h3gate.evidence.profiles import SESSION_WIDE, Outcome

INTERRUPTED = "keyboard-interrupt"  # what xdist names a worker's going down on Ctrl-C (its session interrupted)
_RANK = {"passed": 0, "not_claimed": 1, "skipped": 1, "failed": 2, "error": 3}


class Ledger:
    """Registered as a plugin of its session, so its hooks see that session's reports only."""

    def __init__(self):
        self.results: dict[str, dict] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.deselected: dict[str, Outcome] = {}
        self.crashed_workers: list[str] = []
        self.outside_shard: set[str] = set()  # gate items another shard runs: neither run nor deselected here
        self.preempted: dict[str, str] = {}  # node id -> "preempted at step k/N; ...": a signal stopped its generation
        self.finished: set[str] = set()  # every item, gate or not, whose run ended: did a signal leave any unrun?

    def pytest_runtest_logreport(self, report) -> None:
        self.record_report(report)

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.finished.add(nodeid)

    def pytest_deselected(self, items) -> None:
        self.record_deselected([item for item in items if item.nodeid not in self.outside_shard])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        output = getattr(node, "workeroutput", {}).get("h3")
        if output is not None:
            self.merge_worker(output)
        if (error is not None and error != INTERRUPTED) or output is None:  # a Ctrl-C is no crash: its items resume
            self.worker_down(node.gateway.id)

    def record_result(self, nodeid: str, result: dict) -> None:
        self.results[nodeid] = result

    def record_report(self, report) -> None:
        """The worst outcome of a gate item over its setup, call and teardown (``when == "???"``: xdist's
        report for an item whose worker died)."""
        gate = getattr(report, "h3_gate", None)
        crashed = report.when == "???"
        if gate is None and not crashed:
            return
        if crashed:
            outcome = "error"
        elif report.when == "call":
            outcome = "not_claimed" if report.skipped and gate.get("not_claimed") else report.outcome
        elif report.skipped:
            outcome = "skipped"
        elif report.failed:
            outcome = "error"
        else:
            return
        info = gate or {"gate": "unknown", "params": {}}
        previous = self.outcomes.get(report.nodeid)
        if previous is None or _RANK[outcome] > _RANK[previous.outcome]:
            self.outcomes[report.nodeid] = Outcome(outcome, info["gate"], info["params"])

    def record_deselected(self, items) -> None:
        for item in items:
            gate = gate_of(item)
            if gate is not None:
                self.deselected[item.nodeid] = Outcome("deselected", gate["gate"], gate["params"])

    def worker_output(self) -> str:
        return json.dumps({"results": self.results, "preempted": self.preempted,
                           "deselected": {k: [v.gate, v.params] for k, v in self.deselected.items()}})

    def merge_worker(self, data: str) -> None:
        payload = json.loads(data)
        self.results.update(payload["results"])
        self.preempted.update(payload["preempted"])
        for nodeid, (gate, params) in payload["deselected"].items():
            self.deselected[nodeid] = Outcome("deselected", gate, params)

    def worker_down(self, worker: str) -> None:
        self.crashed_workers.append(worker)

    def final_outcomes(self) -> dict[str, Outcome]:
        outcomes = {**self.deselected, **self.outcomes}
        for worker in self.crashed_workers:
            outcomes[f"<xdist worker {worker}>"] = Outcome("error", SESSION_WIDE, {"worker": worker})
        return outcomes


def gate_of(item) -> dict | None:
    """The gate kind and params of a collected item, or None for an ordinary test."""
    marker = item.get_closest_marker("h3_gate")
    if marker is None or not marker.args:
        return None
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params.get("h3_gate", {})) if callspec is not None else {}
    return {"gate": marker.args[0], "params": params}
