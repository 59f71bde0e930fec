"""The reviewer's report: tables per gate with every margin, worst checks first, generation metrics per seed, PNGs."""

import json

import pytest
from matplotlib.image import imread

from evidence_runs import MODEL_ONLY, make_run
from h3gate.evidence import review as report, signing
from h3gate.verdict import Check

MODEL_TEST = "tests/gates/test_model.py::test_model"
SEED42 = "tests/gates/test_generation.py::test_generation[seed42]"
SEED43 = "tests/gates/test_generation.py::test_generation[seed43]"


def render(run, nodeids, tmp_path, **write) -> tuple[str, list]:
    path = run.write(run.root, nodeids=nodeids, **write)
    out = report.write_report(path, tmp_path / "report.md")
    return out.read_text(), sorted((tmp_path / "report-plots").glob("*.png"))


def test_every_check_is_tabled_with_its_margin_worst_first(tmp_path):
    run = make_run(tmp_path, failing=(MODEL_TEST,))
    checks = [Check(f"nodes.block.{i}", "relative_l2", 0.001 * i, 0.02, True).to_json() for i in range(15)]
    run.results[MODEL_TEST]["checks"] += checks
    text, plots = render(run, [MODEL_TEST], tmp_path)
    assert text.startswith("# H3 qualification: FAILED")
    assert "**UNSIGNED evidence**" in text
    section = text.split(f"## `{MODEL_TEST}`")[1]
    worst, details = section.split("</details>")[0].split("<details>")
    rows = [line for line in worst.splitlines() if line.startswith("| `")]
    assert len(rows) == report.WORST
    assert rows[0] == "| `nodes.proj_out` | relative_l2 | 0.5 | 0.02 | -0.48 | **NO** |"
    assert rows[1].startswith("| `nodes.block.14` | relative_l2 | 0.014 | 0.02 | 0.006 |")
    assert len([line for line in details.splitlines() if line.startswith("| `")]) == 4 + 15
    assert [p.name for p in plots] == ["tests-gates-test-model-py-test-model-taps.png"]
    assert imread(plots[0]).shape[0] > 100


def test_generation_metrics_per_seed_and_frame_curves(tmp_path):
    run = make_run(tmp_path)
    text, plots = render(run, [SEED42, SEED43], tmp_path)
    table = text.split("## Generation metrics per seed")[1].split("##")[0]
    assert "| seed | test | audio.relative_l2 | fixed.psnr | fixed.ssim |" in table
    assert f"| 42 | `{SEED42}` | 0.011 | 38.42 | 0.97 |" in table
    assert f"| 43 | `{SEED43}` | 0.011 | 38.43 | 0.97 |" in table
    assert "report-plots/generation-frames.png" in text
    assert "generation-frames.png" in [p.name for p in plots]


def test_absent_frame_series_are_not_plotted(tmp_path):
    run = make_run(tmp_path)
    run.results[SEED42]["metrics"] = {"fixed": {"psnr": 40.0, "psnr_per_frame": [], "label": "text"}}
    text, plots = render(run, [SEED42], tmp_path)
    assert "generation-frames.png" not in text and "generation-frames.png" not in [p.name for p in plots]
    assert f"| 42 | `{SEED42}` | 40 |" in text


def test_signed_and_incomplete_evidence_say_so(tmp_path):
    run = make_run(tmp_path, outcome={SEED43: "skipped"})
    key = signing.PrivateKey.generate()
    text, _ = render(run, [MODEL_TEST, SEED43], tmp_path, key=key, required=MODEL_ONLY)
    assert text.startswith("# H3 qualification: PASSED")
    assert f"Signed by key `{signing.keyid(key.public_key())[:16]}`" in text and "UNSIGNED" not in text
    assert f"| `{SEED43}` | generation[seed=43] | skipped | 0 |  |" in text

    text, _ = render(run, [MODEL_TEST, SEED43], tmp_path)
    assert "Profile `release` (`kernel`, `block`, `model`, `generation[seed=42]`" in text and "**INCOMPLETE**" in text
    assert f"- generation[seed=43]: {SEED43} was skipped" in text


def test_non_finite_values_are_tabled_and_left_out_of_the_plot(tmp_path):
    run = make_run(tmp_path)
    run.results[MODEL_TEST]["checks"].append(Check("nodes.broken", "relative_l2", float("inf"), 0.02, False).to_json())
    text, plots = render(run, [MODEL_TEST], tmp_path)
    assert "| `nodes.broken` | relative_l2 | inf | 0.02 | -inf | **NO** |" in text
    assert len(plots) == 1


@pytest.mark.parametrize(
    "metrics, expected",
    [
        ({}, {}),
        ({"a": {"psnr_per_frame": [1, 2]}, "b": {"ssim_per_frame": [0.5]}}, {"a.psnr_per_frame": [1.0, 2.0]}),
        ({"psnr_per_frame": ["x"], "c": {"psnr_per_frame": [1, "NaN"]}}, {"c.psnr_per_frame": [1.0, float("nan")]}),
    ],
)
def test_series_are_found_at_any_depth_and_tolerate_absence(metrics, expected):
    found = report.series(metrics, "psnr_per_frame")
    assert json.dumps(found) == json.dumps(expected)
