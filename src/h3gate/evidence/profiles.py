"""Completeness profiles and verdicts: which gates a run must reach a verdict on, and what its tests add up to.

Kept apart from signing and statement building so the plugin's ledger and report can name outcomes and
profiles without loading a cryptography library. The verdict of a run is computed here and only here, from
its tests: :mod:`h3gate.evidence.statement` records it, and verification recomputes it with the same functions.

A run's verdict is ``PASSED``, ``FAILED`` or ``INCOMPLETE``: INCOMPLETE is a run that lacks a verdict on a gate
its completeness profile requires (skipped, deselected, crashed). The in-toto test-result predicate knows only
PASSED, WARNED and FAILED, so its ``result`` reads FAILED for an incomplete run (a gap must never read as a pass,
and WARNED would say it passed with remarks), and crashed items are among its ``failedTests``; the verdict itself
lives in the tool's own predicate fields. Passes with non-discriminating bounds are listed as warned and still
give PASSED.

An item the candidate does not claim (``not_claimed``: a kernel-gate op it leaves to the provider, a dtype it does
not support) is neither passed nor a gap: it is in no list of the test-result predicate, the completeness names it,
and a required gate of which the candidate claims no item at all leaves the run incomplete. The ops it leaves to
the provider still run in the block, model and generation gates, which judge the candidate as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PASSED, FAILED, INCOMPLETE = "PASSED", "FAILED", "INCOMPLETE"
# The gate of an entry about a session rather than a test: an xdist worker it lost (its items are recorded besides).
SESSION_WIDE = "worker"
OUTCOMES = ("passed", "failed", "skipped", "deselected", "error", "not_claimed")


@dataclass(frozen=True)
class Requirement:
    """A gate the profile requires; a test matches when its gate is ``gate`` and its params include ``params``."""

    gate: str
    params: dict = field(default_factory=dict)

    def matches(self, gate: str, params: dict) -> bool:
        return gate == self.gate and all(params.get(key) == value for key, value in self.params.items())

    def label(self) -> str:
        params = ",".join(f"{key}={value}" for key, value in sorted(self.params.items()))
        return self.gate + (f"[{params}]" if params else "")

    def to_json(self) -> dict:
        return {"gate": self.gate, "params": self.params}


@dataclass(frozen=True)
class Profile:
    name: str
    requirements: tuple[Requirement, ...]
    description: str = field(default="", compare=False)  # what it is for, in the help of --h3-profile and --profile

    def to_json(self) -> dict:
        return {"name": self.name, "required": [r.to_json() for r in self.requirements]}

    @classmethod
    def from_json(cls, data: dict) -> "Profile":
        """A recorded profile; one not of the shape :meth:`to_json` writes is a ValueError (evidence is read
        from files anyone can edit)."""
        required = data.get("required") if isinstance(data, dict) else None
        if not (
            isinstance(data.get("name") if isinstance(data, dict) else None, str)
            and isinstance(required, list)
            and all(isinstance(r, dict) and isinstance(r.get("gate"), str) and isinstance(r.get("params"), dict)
                    for r in required)
        ):
            raise ValueError("not a profile: {name, required: [{gate, params}, ...]} expected")
        return cls(data["name"], tuple(Requirement(r["gate"], r["params"]) for r in required))


_GENERATIONS = tuple(Requirement("generation", {"seed": seed}) for seed in (42, 43, 44))
# ``ci`` is what the tiny gate suite under tests/gates runs; it grows with that suite (a test checks they agree).
PROFILES = {
    "release": Profile("release", (Requirement("kernel"), Requirement("block"), Requirement("model"), *_GENERATIONS),
                       "kernel, block, model and generation seeds 42, 43, 44"),
    "ci": Profile("ci", (Requirement("kernel"), Requirement("block"), Requirement("model"), *_GENERATIONS,
                         Requirement("power")), "release's gates and power"),
    # A checkpoint qualified with kernels that another run qualified (the kernel gate does not depend on the
    # checkpoint's weights): a team's own checkpoint folder in its own repository.
    "checkpoint": Profile("checkpoint", (Requirement("block"), Requirement("model"), *_GENERATIONS),
                          "block, model and generation seeds 42, 43, 44: a checkpoint whose kernels another run "
                          "qualified"),
    # The model and block gates alone, on a model whose kernels were qualified in another run: make gate's run of
    # the edge preset (its kernel gate is tiny's; the kernel gate does not depend on the model).
    "model-block": Profile("model-block", (Requirement("block"), Requirement("model")),
                           "block and model: a model whose kernels another run qualified, as make gate runs edge"),
}


def described() -> str:
    """Every profile with what it requires, for the help of the options that take one."""
    return "; ".join(f"'{name}': {profile.description}" for name, profile in PROFILES.items())


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown completeness profile {name!r}; profiles: {', '.join(sorted(PROFILES))}")
    return PROFILES[name]


@dataclass(frozen=True)
class Outcome:
    """What pytest made of one gate item: ``outcome`` is one of OUTCOMES (``error``: the item errored or its
    worker died), ``gate`` and ``params`` come from the item's marker, so a skipped item still names its gate."""

    outcome: str
    gate: str
    params: dict = field(default_factory=dict)


def verdict(test: dict) -> str:
    """passed, warned or failed when the gate reached a verdict; else skipped, deselected or crashed. A pytest
    failure counts as failed even where the gate's checks passed: the test asserted more than the gate."""
    outcome, result = test["outcome"], test["result"]
    if outcome in ("skipped", "deselected", "not_claimed"):
        return outcome
    if outcome == "error" or result is None:
        return "crashed"
    if outcome == "failed" or not result["passed"]:
        return "failed"
    if result["context"].get("non_discriminating"):
        return "warned"
    return "passed"


def completeness(tests: dict[str, dict], required: Profile) -> dict:
    """Whether every required gate reached a verdict. A crashed item of any gate leaves the run incomplete:
    its verdict is unknown. A skipped or deselected item matters only where the profile requires its gate; items
    not claimed are listed (``not_claimed``, a key present only where there are some, so evidence written before it
    existed still verifies)."""
    verdicts = {nodeid: verdict(test) for nodeid, test in tests.items()}
    problems = [
        f"{nodeid}: crashed without a gate verdict" for nodeid in sorted(tests) if verdicts[nodeid] == "crashed"
    ]
    for requirement in required.requirements:
        matching = sorted(n for n, t in tests.items() if requirement.matches(t["gate"], t["params"]))
        if not matching:
            problems.append(f"{requirement.label()}: no test item of this gate ran (not collected or not recorded)")
        for nodeid in matching:
            if verdicts[nodeid] in ("skipped", "deselected"):
                problems.append(f"{requirement.label()}: {nodeid} was {verdicts[nodeid]}")
        if matching and all(verdicts[nodeid] == "not_claimed" for nodeid in matching):
            problems.append(f"{requirement.label()}: the candidate claims none of its items")
    not_claimed = sorted(nodeid for nodeid, found in verdicts.items() if found == "not_claimed")
    return {"complete": not problems, "problems": problems, **({"not_claimed": not_claimed} if not_claimed else {})}


def tally(tests: dict[str, dict], required: Profile) -> dict:
    """The verdict fields, computed from the tests (never taken from anywhere else): ``result`` and the test
    lists as the test-result predicate has them, ``verdict`` and ``completeness`` as this tool's. A failed test
    outranks a missing verdict: FAILED is a finding about the candidate, INCOMPLETE only a gap in the run."""
    lists = {"passed": [], "warned": [], "failed": []}
    found_failed = False
    for nodeid in sorted(tests):
        found = verdict(tests[nodeid])
        found_failed |= found == "failed"
        if found in lists or found == "crashed":
            lists["failed" if found == "crashed" else found].append(nodeid)
    outcome = completeness(tests, required)
    own = FAILED if found_failed else PASSED if outcome["complete"] else INCOMPLETE
    return {
        "result": PASSED if own == PASSED else FAILED,
        "passedTests": lists["passed"],
        "warnedTests": lists["warned"],
        "failedTests": lists["failed"],
        "verdict": own,
        "completeness": outcome,
    }
