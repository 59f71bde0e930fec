"""A team's own checks (``examples/own-checks``): ``h3_threshold`` freezes a metric the gates do not have from the
provider variants and checks it like a gate, on generations ``h3_generation`` reuses; ``h3_bounds`` reads a gate's
frozen bounds. Run through pytester on tiny, as a user runs them."""

import base64
import json
import shutil
from pathlib import Path

import pytest

from h3gate.cli import main
from h3gate.evidence import signing

from conftest import ROOT, THRESHOLDS

EXAMPLE = ROOT / "examples" / "own-checks" / "test_team_metrics.py"
BOUNDS = Path("thresholds") / "tiny" / "cpu" / "threshold-brightness-loudness-bounds.json"
LOUDER = '''
from h3gate import candidates


class Louder(candidates.ProviderCandidate):
    """The provider with the audio head's output 1% larger: a kernel that gets one scale wrong."""

    name = "louder"

    def install(self, transformer):
        return transformer.audio_proj_out.register_forward_hook(lambda module, args, out: out * 1.01)


candidates.register("louder", Louder)
'''


@pytest.fixture
def project(pytester):
    shutil.copytree(THRESHOLDS, pytester.path / "thresholds")
    shutil.copy(EXAMPLE, pytester.path / "test_team_metrics.py")
    pytester.makeconftest(LOUDER)
    return pytester


def _run(project, *args):
    return project.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "-m", "gate", *args)


def test_a_metric_of_ones_own_is_frozen_then_checked_and_signed_in_the_evidence(project, tmp_path):
    missing = _run(project, "--h3-out=missing")  # evidence of its own: a folder's evidence joins one candidate's sessions
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*no frozen threshold bounds at*threshold-brightness-loudness-bounds.json; freeze them "
                                  "with: pytest test_team_metrics.py::test_brightness_and_loudness --h3-freeze*"])
    _run(project, "--h3-freeze", "--h3-variants=sdpa-math").assert_outcomes(passed=1)
    frozen = json.loads((project.path / BOUNDS).read_text())
    assert frozen["sources"] == ["sdpa-math"] and set(frozen["bounds"]) == {"video_mean", "audio_rms_db"}
    assert all(bound > 0 for bound in frozen["bounds"].values()) and frozen["rule"]["margin"] == 0.5

    assert main(["keygen", str(tmp_path / "keys")]) == 0
    _run(project, "--h3-candidate=provider", f"--h3-sign-key={tmp_path / 'keys' / signing.PRIVATE_KEY_NAME}"
         ).assert_outcomes(passed=1)
    (result,) = json.loads((project.path / "h3-out" / "results.json").read_text())["results"].values()
    assert result["gate"] == "threshold" and result["context"]["threshold"] == "brightness-loudness"
    assert {check["name"]: check["value"] for check in result["checks"]} == {"video_mean": 0.0, "audio_rms_db": 0.0}
    envelope = json.loads((project.path / "h3-out" / "evidence.json").read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    names = [subject["name"] for subject in statement["subject"]]
    assert any(name.startswith("generation/tiny/generation-preflight/candidate-provider-") for name in names)
    assert "brightness-loudness" in json.dumps(statement["predicate"])
    public = tmp_path / "keys" / signing.PUBLIC_KEY_NAME
    # signature and artifact digests verified (else 3, 4 or 5); INCOMPLETE, since the run holds none of ci's gates
    assert main(["verify", str(project.path / "h3-out" / "evidence.json"), f"--key={public}"]) == 7

    louder = _run(project, "--h3-candidate=louder", "--h3-out=louder")
    louder.assert_outcomes(failed=1)
    louder.stdout.fnmatch_lines(["*threshold gate FAILED*audio_rms_db: deviation from the provider*> bound*"])


def test_a_variant_set_that_moves_nothing_cannot_freeze_a_bound(project):
    run = _run(project, "--h3-freeze", "--h3-variants=threads-1")
    run.assert_outcomes(failed=1)
    run.stdout.fnmatch_lines(["*the threshold gate did not freeze: threshold 'brightness-loudness': no variant of ?'threads-1'? moved "
                              "'video_mean'*bitwise equality*"])
    assert not (project.path / BOUNDS).exists()


def test_h3_bounds_returns_a_gate_items_frozen_bounds_or_says_how_to_freeze_them(pytester):
    shutil.copytree(THRESHOLDS, pytester.path / "thresholds")
    pytester.makepyfile(test_h3_bounds_fixture='''
import pytest

from h3gate.bounds import BoundsError


def test_reads_what_a_gate_item_checks_against(h3_bounds):
    model = h3_bounds("model")
    assert model.gate == "model" and model.bounds and model.path.name == "model-bounds.json"
    assert h3_bounds("block", block=1).path.name == "block1-bounds.json"
    assert h3_bounds("generation", seed=42, contract="generation-preflight").path.name == (
        "generation-preflight-bounds.json")
    with pytest.raises(BoundsError, match="no frozen generation-preflight-unfrozen bounds.*freeze them with the generation gate's test"):
        h3_bounds("generation", seed=42, contract="generation-preflight-unfrozen")
''')
    contract = pytester.path / "thresholds" / "tiny" / "generation-preflight-contract.json"
    shutil.copy(contract, contract.with_name("generation-preflight-unfrozen-contract.json"))
    assert main(["lock", str(contract.with_name("generation-preflight-unfrozen-contract.json")),
                 f"--thresholds={pytester.path / 'thresholds'}"]) == 0
    pytester.runpytest("-p", "no:cacheprovider", "--h3-device=cpu", "test_h3_bounds_fixture.py").assert_outcomes(passed=1)
