"""The reviewer's report of an evidence file: markdown for a pull request or a CI job summary, PNG plots beside it.

The report reads the statement as recorded and says whether it is signed; checking the signature and
digests is ``h3gate verify``'s job. Per gate test it gives every check's margin, the worst taps first, and
the generation metrics per seed; plots show bound against measured value per tap, and per-frame PSNR and
SSIM curves where the metrics hold such series (absent series are simply not plotted). Plots are drawn with
matplotlib through ``matplotlib.figure.Figure``, which renders with Agg without touching pyplot's global
backend or needing a display.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path

from matplotlib.figure import Figure

from h3gate.evidence.profiles import Profile, Requirement, verdict
from h3gate.evidence.signing import open_envelope
from h3gate.evidence.statement import statement_of
from h3gate.files import write_atomic

WORST = 10
FRAME_SERIES = ("psnr_per_frame", "ssim_per_frame")


def number(value) -> float | None:
    """A metric as a float: numbers, and the non-finite strings the statement stores; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return None


def fmt(value) -> str:
    found = number(value)
    return "" if found is None else f"{found:.4g}"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def ratio(check: dict) -> float:
    """How much of the allowance a check uses, above 1 fails: the engine's ratio where recorded, else value /
    bound; NaN, or a nonzero value over a zero bound, is infinitely over."""
    if "ratio" in check:  # the engine's own measure of the allowance used (see h3gate.verdict.Check.ratio)
        return number(check["ratio"])
    value, bound = number(check["value"]), number(check["bound"])
    if math.isnan(value):
        return math.inf
    if not bound:
        return math.inf if value else 0.0
    return value / bound


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]


def flatten(metrics: dict, prefix: str = "") -> dict[str, float]:
    """Scalar metrics under dotted names (series and non-numbers left out)."""
    flat = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif number(value) is not None:
            flat[name] = number(value)
    return flat


def series(metrics: dict, suffix: str, prefix: str = "") -> dict[str, list[float]]:
    """Every list of numbers whose key ends with ``suffix``, under its dotted name."""
    found = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(series(value, suffix, name + "."))
        elif key.endswith(suffix) and isinstance(value, list) and value and all(number(v) is not None for v in value):
            found[name] = [number(v) for v in value]
    return found


# Plots --------------------------------------------------------------------------------------------------


def save(figure: Figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buffer.getvalue())
    return path


def plot_taps(title: str, checks: list[dict], path: Path) -> Path:
    """Measured relative L2 and its bound per tap (log scale), failing taps in red."""
    checks = [c for c in checks if c["kind"] == "relative_l2"]
    figure = Figure(figsize=(max(6.0, min(24.0, 0.18 * len(checks) + 3)), 4))
    axes = figure.add_subplot()
    positions = range(len(checks))
    # Non-finite values are left out of the plot (the tables show them); exact zeros sit at the plot floor.
    measured = [max(number(c["value"]), 1e-12) if math.isfinite(number(c["value"])) else math.nan for c in checks]
    axes.scatter(positions, [number(c["bound"]) for c in checks], marker="_", s=120, color="black", label="bound")
    axes.scatter(
        positions, measured, s=12, color=["tab:blue" if c["passed"] else "tab:red" for c in checks], label="measured"
    )
    axes.set_yscale("log")
    axes.set_ylabel("relative L2 to golden")
    axes.set_title(title)
    if len(checks) <= 40:
        axes.set_xticks(list(positions), [c["name"] for c in checks], rotation=90, fontsize=6)
    else:
        axes.set_xlabel("tap (in check order)")
    axes.legend()
    return save(figure, path)


def plot_frames(title: str, curves: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """One panel per series kind (PSNR, SSIM), one curve per test and metric name."""
    kinds = [kind for kind in FRAME_SERIES if curves.get(kind)]
    figure = Figure(figsize=(7, 3 * len(kinds)))
    for row, kind in enumerate(kinds, start=1):
        axes = figure.add_subplot(len(kinds), 1, row)
        for label, values in sorted(curves[kind].items()):
            axes.plot(range(len(values)), values, label=label, linewidth=1)
        axes.set_ylabel(kind.replace("_per_frame", "").upper())
        axes.set_xlabel("frame")
        axes.legend(fontsize=6)
    figure.suptitle(title)
    return save(figure, path)


# Markdown -----------------------------------------------------------------------------------------------


def header(statement: dict, signatures: list[dict]) -> list[str]:
    predicate = statement["predicate"]
    h3 = predicate["h3"]
    lines = [f"# H3 qualification: {h3['verdict']}", ""]
    if h3["signer"] is None:
        lines.append("**UNSIGNED evidence**: nobody vouches for these numbers; a release needs signed evidence.")
    else:
        keyids = ", ".join(f"`{s['keyid'][:16]}`" for s in signatures)
        lines.append(f"Signed by key {keyids}; check with `h3gate verify EVIDENCE --key PUBLIC.pem`.")
    required = ", ".join(f"`{r.label()}`" for r in Profile.from_json(h3["profile"]).requirements)
    state = "complete" if h3["completeness"]["complete"] else "**INCOMPLETE**"
    lines += ["", f"Profile `{h3['profile']['name']}` ({required}): {state}."]
    lines += [f"- {problem}" for problem in h3["completeness"]["problems"]]
    rows = [
        [d["annotations"]["role"], f"`{d['name']}`", f"`{d['digest'].get('sha256', '')[:16]}`"]
        for d in predicate["configuration"]
    ]
    lines += ["", *table(["measured against", "name", "sha256"], rows)]
    return lines


def overview(tests: dict) -> list[str]:
    rows = []
    for nodeid, test in tests.items():
        checks = test["result"]["checks"] if test["result"] else []
        worst = fmt(max(ratio(c) for c in checks)) if checks else ""
        gate = Requirement(test["gate"], test["params"]).label()
        rows.append([f"`{nodeid}`", gate, verdict(test), str(len(checks)), worst])
    return ["", "## Tests", "", *table(["test", "gate", "verdict", "checks", "worst value/bound"], rows)]


def check_rows(checks: list[dict]) -> list[list[str]]:
    return [
        [
            f"`{c['name']}`",
            c["kind"],
            fmt(c["value"]),
            fmt(c["bound"]),
            fmt(c["margin"]),
            "yes" if c["passed"] else "**NO**",
        ]
        for c in checks
    ]


def gate_section(nodeid: str, test: dict, plots: Path, link: str) -> list[str]:
    result = test["result"]
    lines = ["", f"## `{nodeid}`", "", result["summary"]]
    checks = result["checks"]
    if any(c["kind"] == "relative_l2" for c in checks):
        name = f"{slug(nodeid)}-taps.png"
        plot_taps(nodeid, checks, plots / name)
        lines += ["", f"![bound vs measured per tap]({link}/{name})"]
    columns = ["check", "kind", "value", "bound", "margin", "passed"]
    worst = sorted(checks, key=ratio, reverse=True)
    lines += [
        "",
        f"Worst {min(WORST, len(worst))} checks (value/bound, highest first):",
        "",
        *table(columns, check_rows(worst[:WORST])),
    ]
    if len(checks) > WORST:
        lines += [
            "",
            f"<details><summary>All {len(checks)} checks</summary>",
            "",
            *table(columns, check_rows(checks)),
            "",
            "</details>",
        ]
    if result["metrics"].get("power_table"):
        lines += ["", "Power (subject x gate; **bold**: a gate meant to catch a mutant missed it, or a variant was rejected):",
                  "", result["metrics"]["power_table"]]
    non_discriminating = result["context"].get("non_discriminating") or []
    if non_discriminating:
        lines += ["", f"Non-discriminating bounds (>= 1): {', '.join(f'`{t}`' for t in non_discriminating)}"]
    if result["timings"]:
        lines += ["", "Timings (s): " + ", ".join(f"{k} {fmt(v)}" for k, v in result["timings"].items())]
    return lines


def generation_section(tests: dict, plots: Path, link: str) -> list[str]:
    """Scalar metrics per seed in one table; per-frame PSNR/SSIM curves in one plot."""
    runs = {nodeid: t for nodeid, t in tests.items() if t["gate"] == "generation" and t["result"] is not None}
    if not runs:
        return []
    flat = {nodeid: flatten(t["result"]["metrics"]) for nodeid, t in runs.items()}
    names = sorted({name for metrics in flat.values() for name in metrics})
    rows = [
        [str(runs[n]["params"].get("seed", "")), f"`{n}`", *(fmt(flat[n].get(name)) for name in names)] for n in runs
    ]
    lines = ["", "## Generation metrics per seed", "", *table(["seed", "test", *names], rows)]
    curves = {
        kind: {
            f"seed {runs[n]['params'].get('seed', n)}: {name}": values
            for n in runs
            for name, values in series(runs[n]["result"]["metrics"], kind).items()
        }
        for kind in FRAME_SERIES
    }
    if any(curves.values()):
        plot_frames("per-frame metrics", curves, plots / "generation-frames.png")
        lines += ["", f"![per-frame PSNR and SSIM]({link}/generation-frames.png)"]
    return lines


def environment_section(environments: dict) -> list[str]:
    columns = ["python", "torch", "cuda", "driver", "triton", "diffusers", "platform"]
    rows = []
    for key, env in environments.items():
        gpus = "; ".join(f"{g['name']} ({g['pci_bus_id']})" for g in env.get("gpus", [])) or "none"
        rows.append([f"`{key}`", *(str(env.get(c)) for c in columns), gpus])
    return ["", "## Environment", "", *table(["environment", *columns, "GPUs"], rows)]


def render(statement: dict, signatures: list[dict], plots: Path, link: str) -> str:
    """The markdown report; plots go to ``plots``, linked as ``link``/<name>."""
    tests = statement["predicate"]["h3"]["tests"]
    lines = header(statement, signatures) + overview(tests)
    for nodeid, test in tests.items():
        if test["result"] is not None:
            lines += gate_section(nodeid, test, plots, link)
    lines += generation_section(tests, plots, link)
    lines += environment_section(statement["predicate"]["h3"]["environments"])
    return "\n".join(lines) + "\n"


def write_report(evidence: Path, out: Path) -> Path:
    """Render the report of ``evidence`` to ``out`` (markdown), plots in the folder ``<out stem>-plots`` beside it."""
    envelope = open_envelope(evidence)
    out = Path(out)
    link = f"{out.stem}-plots"
    write_atomic(out, render(statement_of(envelope), envelope.signatures, out.parent / link, link))
    return out
