"""Whether two ``make gate`` runs found the same: every verdict, every number, every digest of what they were measured
against, compared between the evidence of a checkout before a change and after it.

Why: a change of the code's shape alone (modules moved and renamed, a settings object, typed result fields) must leave
what the gates measure and decide bitwise as it was. The evidence files themselves always differ between two runs (the
time they were written, each item's durations, the xdist worker an item ran on, the output folder, the digest of the
tool's own source, which such a change edits by definition), so comparing their bytes proves nothing; this compares
everything else in them, exactly:

- the verdict: the predicate's result and its passed, warned and failed tests, the run's verdict, completeness and
  profile;
- every test: its outcome, gate and params, and its result: passed, summary line, every check (value, bound, margin,
  ratio, detail), every metric and the whole context (file paths under the output folder or the checkout made
  relative to them; the worker's device facts and the generation runs' ``costs``, their seconds and the process's
  peak memory, left out);
- the configuration: every bounds and contract file with its sha256, the model's identity and source, the candidate's
  identity and its digest;
- the subjects: every artifact's sha256 by name, except results.json and evidence-junit.xml, which hold timings and
  paths by design (their content is compared above, as the statement's tests);
- the thresholds folders of the two checkouts, file by file.

Left out: ``created``, result ``timings``, ``environments``, ``redacted``, ``signer``, the tool's source digest (shown).

    python benchmarks/compare_gate_evidence.py BEFORE_OUT AFTER_OUT --repos BEFORE_CHECKOUT AFTER_CHECKOUT

compares BEFORE_OUT/evidence.json with AFTER_OUT/evidence.json and the same for every run folder below (``edge``),
prints what it compared and every difference, and exits 0 only when nothing differs.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from pathlib import Path

IGNORED_SUBJECTS = {"results.json", "evidence-junit.xml"}  # timings and paths, by design


def statement(path: Path) -> dict:
    envelope = json.loads(path.read_text())
    return json.loads(base64.b64decode(envelope["payload"]))


def normalised(value, roots: list[tuple[str, str]]):
    """``value`` with every path under one of ``roots`` (prefix, placeholder) written relative to it."""
    if isinstance(value, dict):
        return {key: normalised(item, roots) for key, item in value.items()}
    if isinstance(value, list):
        return [normalised(item, roots) for item in value]
    if isinstance(value, str):
        for prefix, placeholder in roots:
            value = value.replace(prefix, placeholder)
    return value


def differences(before, after, where: str = "") -> list[str]:
    """Every place ``before`` and ``after`` differ, as ``where: before -> after`` (floats compared exactly)."""
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            if key not in after:
                found.append(f"{where}/{key}: only before")
            elif key not in before:
                found.append(f"{where}/{key}: only after")
            else:
                found += differences(before[key], after[key], f"{where}/{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in differences(b, a, f"{where}/{i}")]
    if type(before) is not type(after) or before != after:
        return [f"{where}: {json.dumps(before)[:120]} -> {json.dumps(after)[:120]}"]
    return []


def without_costs(value):
    """``value`` less every ``costs`` entry: how long a step took and the process's peak memory then."""
    if isinstance(value, dict):
        return {key: without_costs(item) for key, item in value.items() if key != "costs"}
    if isinstance(value, list):
        return [without_costs(item) for item in value]
    return value


def compared_results(h3: dict, roots) -> dict:
    tests = {}
    for nodeid, test in h3["tests"].items():
        result = test["result"]
        if result is not None:
            result = {key: value for key, value in result.items() if key != "timings"}
            result["context"] = without_costs({key: value for key, value in result["context"].items() if key != "device"})
        tests[nodeid] = normalised({**{k: v for k, v in test.items() if k != "environment"}, "result": result}, roots)
    return tests


def compare_run(before_dir: Path, after_dir: Path, roots_before, roots_after, out: list[str]) -> int:
    before, after = statement(before_dir / "evidence.json"), statement(after_dir / "evidence.json")
    b_pred, a_pred = before["predicate"], after["predicate"]
    found = []
    for key in ("result", "passedTests", "warnedTests", "failedTests"):
        found += differences(b_pred[key], a_pred[key], f"predicate/{key}")
    for key in ("verdict", "completeness", "profile", "schema"):
        found += differences(b_pred["h3"][key], a_pred["h3"][key], f"h3/{key}")
    b_tests, a_tests = compared_results(b_pred["h3"], roots_before), compared_results(a_pred["h3"], roots_after)
    found += differences(b_tests, a_tests, "h3/tests")
    found += differences(normalised(b_pred["configuration"], roots_before),
                         normalised(a_pred["configuration"], roots_after), "configuration")
    b_subjects = {s["name"]: s["digest"]["sha256"] for s in before["subject"] if s["name"] not in IGNORED_SUBJECTS}
    a_subjects = {s["name"]: s["digest"]["sha256"] for s in after["subject"] if s["name"] not in IGNORED_SUBJECTS}
    found += differences(b_subjects, a_subjects, "subject")
    checks = sum(len(t["result"]["checks"]) for t in b_tests.values() if t["result"])
    metrics = sum(_leaves(t["result"]["metrics"]) for t in b_tests.values() if t["result"])
    bounds = [c for c in b_pred["configuration"] if c["annotations"]["role"] in ("bounds", "contract")]
    out.append(f"## {before_dir} vs {after_dir}")
    out.append(f"verdict: {b_pred['h3']['verdict']} (profile {b_pred['h3']['profile']['name']}) -> "
               f"{a_pred['h3']['verdict']} (profile {a_pred['h3']['profile']['name']})")
    out.append(f"compared: {len(b_tests)} tests ({sum(t['outcome'] == 'passed' for t in b_tests.values())} passed), "
               f"{checks} checks, {metrics} metric values, {len(bounds)} bounds and contract digests, "
               f"{len(b_subjects)} artifact digests ({', '.join(sorted(IGNORED_SUBJECTS))} left out)")
    for entry in b_pred["configuration"]:
        out.append(f"  {entry['name']}: sha256 {entry['digest']['sha256']}")
    out.append(f"tool: h3gate {b_pred['h3']['tool']['version']} source {b_pred['h3']['tool']['source_sha256'][:16]} -> "
               f"{a_pred['h3']['tool']['version']} source {a_pred['h3']['tool']['source_sha256'][:16]} (not compared)")
    out += [f"DIFFERS {line}" for line in found] or ["differences: none"]
    out.append("")
    return len(found)


def _leaves(value) -> int:
    if isinstance(value, dict):
        return sum(_leaves(v) for v in value.values())
    if isinstance(value, list):
        return sum(_leaves(v) for v in value)
    return 1


def compare_thresholds(before: Path, after: Path, out: list[str]) -> int:
    def digests(root: Path) -> dict:
        return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file()}

    found = differences(digests(before), digests(after), "thresholds")
    out.append(f"## thresholds: {before} vs {after}")
    out.append(f"compared: {len(digests(before))} files by sha256")
    out += [f"DIFFERS {line}" for line in found] or ["differences: none"]
    out.append("")
    return len(found)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the output folder of make gate before the change")
    parser.add_argument("after", type=Path, help="the output folder of make gate after it")
    parser.add_argument("--repos", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), required=True,
                        help="the two checkouts the runs were made in (their thresholds are compared too)")
    args = parser.parse_args(argv)
    out, differing = [], 0
    runs = sorted(path.parent.relative_to(args.before) for path in args.before.rglob("evidence.json"))
    for run in runs:
        roots_before = [(str(args.before.resolve()), "<out>"), (str(args.repos[0].resolve()), "<repo>")]
        roots_after = [(str(args.after.resolve()), "<out>"), (str(args.repos[1].resolve()), "<repo>")]
        differing += compare_run(args.before / run, args.after / run, roots_before, roots_after, out)
    differing += compare_thresholds(args.repos[0] / "thresholds", args.repos[1] / "thresholds", out)
    out.append(f"RESULT: {'the same' if not differing else f'{differing} differences'} "
               f"({len(runs)} runs' evidence and the thresholds folders)")
    print("\n".join(out))
    return 0 if not differing else 1


if __name__ == "__main__":
    sys.exit(main())
