"""The generation gate through the engine: contract validation, freezing from provider variants, and checks
that pass the provider and fail broken, drifting, nondeterministic or unqualified candidates with named reasons."""

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from broken import AudioTakesTextModulation
from h3gate import bounds as bounds_mod, candidates, op_registry
from h3gate.candidates import Candidate, ProviderCandidate, replace, source_digest
from h3gate.files import FileFormatError, sha256_file
from h3gate.gates import generation as gate, passes
from h3gate.generation import contract as generation_contract, resume
from h3gate.generation.pipeline import make_pipeline

from conftest import THRESHOLDS

pytestmark = pytest.mark.usefixtures("one_thread")


COMMITTED = THRESHOLDS / "tiny" / "generation-contract.json"
PREFLIGHT = THRESHOLDS / "tiny" / "generation-preflight-contract.json"
VARIANTS = ["sdpa-math", "threads-1"]  # the CPU variant that changes the arithmetic, and one that does not
FIXED = json.loads(COMMITTED.read_text())["fixed_bounds"]


class RoundsLatents(Candidate):
    """Rounds the video latents to bf16 before the transformer sees them: another start than the provider's."""

    name = "rounds-latents"

    def install(self, transformer):
        def round_latents(module, args, kwargs):
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"].bfloat16().float()}

        return transformer.register_forward_pre_hook(round_latents, with_kwargs=True)


class Noisy(Candidate):
    """The provider plus noise of 1e-6 on the video output projection: a nondeterministic kernel."""

    name = "noisy"

    def install(self, transformer):
        return transformer.proj_out.register_forward_hook(lambda module, args, out: out + 1e-6 * torch.randn_like(out))


class Sourced(ProviderCandidate):
    """The provider, identified by the digest of a source folder (as a kernel package is)."""

    def __init__(self, root, name):
        self.root, self.name = root, name

    def identity(self):
        return {"name": self.name, "source_sha256": source_digest(self.root)}


def write_contract(folder, name="generation", source=COMMITTED, **changes):
    data = {**json.loads(source.read_text()), **changes}
    path = folder / f"{name}-contract.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return path


class Setup:
    """A locked thresholds folder with a two-seed, three-call contract, frozen bounds and a run store."""

    def __init__(self, root, tiny):
        self.root, self.tiny = root, tiny
        self.thresholds, self.out = root / "thresholds", root / "out"
        path = write_contract(self.thresholds / "tiny", num_inference_steps=4, seeds=[42, 43], gating_rule="both")
        bounds_mod.lock_files(self.thresholds, [path])
        self.contract = generation_contract.load(path)
        self.frozen = gate.freeze(tiny, self.contract, "cpu", self.thresholds, VARIANTS, out_dir=self.out)

    def check(self, candidate, seed=42, record=True, **options):
        if record:
            passes.record(self.out, "model", self.tiny, candidate.identity(), bounds_sha256="model-bounds-sha256")
        return gate.check(self.tiny, candidate, self.contract, self.frozen, "cpu", seed, self.out, **options)


@pytest.fixture(scope="module")
def setup(tiny, tmp_path_factory):
    return Setup(tmp_path_factory.mktemp("generation-gate"), tiny)


# The contract -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"workflow": "i2va"}, "unknown workflow 'i2va'"),
        ({"workflow": ["t2va", "i2va"]}, "unknown workflow 'i2va'"),
        ({"workflow": []}, "workflow is an empty list"),
        ({"workflow": ["fl2va", "fl2va"]}, r"workflow lists \['fl2va'\] more than once"),
        ({"seeds": []}, "seeds is empty"),
        ({"seeds": [42, 43, 42]}, r"seeds lists \[42\] more than once"),
        ({"seeds": [42, True]}, "seeds must be non-negative integers"),
        ({"num_frames": 123}, r"num_frames 123 is outside 124\.\.345"),
        ({"num_frames": 362}, r"num_frames 362 is outside 124\.\.345"),
        ({"fps": 30}, "fps 30: MiniMax-H3 generates at 24 fps"),
        ({"num_inference_steps": 1}, "num_inference_steps must be >= 2"),
        ({"height": 0}, "'height' must be >= 1"),
        ({"prompt": " "}, "prompt is empty"),
        ({"gating_rule": "loose"}, "gating_rule 'loose' is not one of"),
        ({"calibration_margin": -0.5}, "calibration_margin must be a finite number >= 0"),
        ({"fixed_bounds": {"video_psnr_min_db": 30.0}}, "fixed_bounds must have exactly the keys"),
        ({"fixed_bounds": {**FIXED, "video_ssim_min": 1.5}}, r"'video_ssim_min'\] must be at most 1 \(SSIM's maximum\)"),
        ({"fixed_bounds": {**FIXED, "audio_relative_l2": 0}}, r"'audio_relative_l2'\] must be a finite number above 0"),
        ({"reference_image_sha256": "0" * 64}, "fl2va starts from the pinned reference keyframe"),
        ({"workflow": "t2va"}, "t2va generates from the prompt alone"),
        ({"schema": "h3gate.generation-contract/0"}, "expected 'h3gate.generation-contract/1'"),
        ({"steps": 8}, r"unknown fields \['steps'\]"),
    ],
)
def test_a_bad_contract_field_is_named(tmp_path, changes, message):
    with pytest.raises(FileFormatError, match=message):
        generation_contract.load(write_contract(tmp_path, **changes))


def test_a_contract_file_name_says_what_it_is(tmp_path):
    path = tmp_path / "generation.json"
    shutil.copy(COMMITTED, path)
    with pytest.raises(FileFormatError, match="named <name>-contract.json"):
        generation_contract.load(path)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"height": 48}, "height 48 is not a multiple of 32, the canvas multiple of this model"),
        ({"num_frames": 125}, "num_frames 125 is not 17 n \\+ 5"),
        ({"audio_sample_rate": 16000}, "audio_sample_rate 16000 differs from this model's audio VAE rate 160"),
    ],
)
def test_a_canvas_the_model_cannot_make_is_refused(tmp_path, tiny, changes, message):
    contract = generation_contract.load(write_contract(tmp_path, **changes))
    components, _ = gate._components(tiny.source, "cpu")
    with pytest.raises(FileFormatError, match=message):
        contract.check_pipeline(make_pipeline(components, tiny.transformer))


def test_the_committed_contracts_load_and_lock(tmp_path):
    main, preflight = generation_contract.load(COMMITTED), generation_contract.load(PREFLIGHT)
    assert (main.name, main.seeds, main.num_frames, main.fps) == ("generation", (42, 43, 44), 124, 24)
    assert main.fixed_bounds == {
        "video_psnr_min_db": 30.0, "video_ssim_min": 0.99, "video_temporal_rmse": 0.01, "audio_relative_l2": 0.05
    }
    assert (preflight.name, preflight.seeds, preflight.transformer_calls) == ("generation-preflight", (42,), 1)
    copies = [shutil.copy(path, tmp_path / path.name) for path in (COMMITTED, PREFLIGHT)]
    bounds_mod.lock_files(tmp_path, copies)
    bounds_mod.verify_lock(tmp_path)
    write_contract(tmp_path, prompt="a dog on a drum")
    with pytest.raises(bounds_mod.BoundsError, match="generation-contract.json does not match its digest"):
        bounds_mod.verify_lock(tmp_path)


# Freezing ---------------------------------------------------------------------------------------------


def test_freezing_calibrates_from_the_variants_and_locks(setup):
    frozen, margin = setup.frozen, setup.contract.calibration_margin
    bounds_mod.verify_lock(setup.thresholds)
    assert frozen.path == setup.thresholds / "tiny" / "cpu" / "generation-bounds.json"
    assert frozen.duplicates_dropped == {"threads-1": "provider"} and frozen.providers == ["sdpa-math"]
    errors = frozen.errors["sdpa-math"]

    def worst(metric, pick):
        return pick(errors[f"fl2va.seed{seed}.{metric}"] for seed in (42, 43))

    assert frozen.bounds["video_psnr_min_db"] == pytest.approx(worst("video_psnr_min_db", min) - 20 * math.log10(1 + margin))
    assert frozen.bounds["video_ssim_min"] == pytest.approx(1 - (1 + margin) * (1 - worst("video_ssim_min", min)))
    for metric in ("video_temporal_rmse", "audio_relative_l2"):
        assert frozen.bounds[metric] == pytest.approx((1 + margin) * worst(metric, max))
    assert 0 < frozen.bounds["audio_relative_l2"] < setup.contract.fixed_bounds["audio_relative_l2"]
    loaded = gate.frozen_bounds(setup.thresholds, setup.tiny, setup.contract, "cpu")
    assert loaded.bounds == frozen.bounds and loaded.non_discriminating == []
    with pytest.raises(bounds_mod.BoundsError, match="exists: frozen bounds are not overwritten"):
        gate.freeze(setup.tiny, setup.contract, "cpu", setup.thresholds, VARIANTS, out_dir=setup.out)


def test_freezing_refuses_variants_that_change_nothing(setup, tmp_path):
    with pytest.raises(bounds_mod.BoundsError, match=r"no variant of \['threads-1'\] changed the generation"):
        gate.freeze(setup.tiny, setup.contract, "cpu", tmp_path, ["threads-1"], out_dir=setup.out)


def test_bounds_of_another_contract_are_refused(setup, tmp_path):
    other = generation_contract.load(write_contract(tmp_path / "tiny", num_inference_steps=4, seeds=[42, 43], prompt="a drum"))
    with pytest.raises(bounds_mod.BoundsError, match="frozen for another contract"):
        gate.check(setup.tiny, ProviderCandidate(), other, setup.frozen, "cpu", 42, setup.out, model_gate_override="test")


# Checking ---------------------------------------------------------------------------------------------


def test_the_provider_passes_both_rules_from_the_cached_provider_run(setup):
    result = setup.check(ProviderCandidate())
    assert result.passed, result.report()
    assert setup.contract.gating_rule == "both", "the test's contract gates on both rules"
    assert [c.name for c in result.checks] == ["fl2va.same_start"] + [
        f"fl2va.{rule}.{name}" for rule in ("fixed", "calibrated") for name in gate.metrics.GATED
    ]
    measured = result.metrics["workflows"]["fl2va"]
    assert all(c["passed"] for rule in measured["rules"].values() for c in rule.values())
    assert measured["values"]["video_psnr_min_db"] == math.inf and measured["values"]["audio_relative_l2"] == 0
    assert result.context["model_gate"]["status"] == "passed" and result.context["contract_sha256"] == setup.contract.digest
    assert result.provenance.bounds_sha256 == sha256_file(setup.frozen.path)
    context = result.context["workflows"]["fl2va"]
    assert context["provider"]["reused"], "freezing generated the provider's seed; the check reuses it"
    assert context["noise_digests"]["provider"] == context["noise_digests"]["candidate"]
    for artifacts in context["artifacts"].values():
        assert {"generation.safetensors", "audio.wav"} <= set(artifacts)
        assert all(sha256_file(a["path"]) == a["sha256"] for a in artifacts.values())


def test_a_finished_seed_is_reused_on_rerun(setup):
    first = setup.check(ProviderCandidate(), seed=43)
    folder = first.context["workflows"]["fl2va"]["candidate_run"]["run_folder"]
    stamps = {p.name: p.stat().st_mtime_ns for p in sorted(Path(folder).glob("step-*"))}
    second = setup.check(ProviderCandidate(), seed=43)
    assert second.passed and second.context["workflows"]["fl2va"]["candidate_run"]["reused"]
    assert {p.name: p.stat().st_mtime_ns for p in sorted(Path(folder).glob("step-*"))} == stamps


def test_a_broken_candidate_fails_naming_metric_bound_margin_and_seed(setup):
    result = setup.check(AudioTakesTextModulation(), seed=43)
    assert not result.passed
    first_line = result.report().splitlines()[0]
    found = re.search(
        r"generation gate \[seed=43\] FAILED \d/9 checks; worst fl2va\.(?:fixed|calibrated)\.(\w+): (?:fixed|calibrated) rule "
        r"([\d.e+-]+) [<>] bound ([\d.e+-]+) "
        r"\(margin -[\d.e+-]+\); bounds sha256 [0-9a-f]{12}",
        first_line,
    )
    assert found, first_line
    assert found[1] in gate.metrics.GATED and float(found[2]) == pytest.approx(result.metrics["workflows"]["fl2va"]["values"][found[1]], rel=1e-3)
    rules = result.metrics["workflows"]["fl2va"]["rules"]
    assert not any(c["passed"] for c in rules["calibrated"].values()), "the calibrated rule fails too"


def test_the_gating_policy_changes_without_refreezing(setup, tmp_path):
    """Bounds measure generations, not policy: a contract differing only in its rule and fixed bounds keeps them.
    Lax fixed bounds pass a broken candidate under the fixed rule alone; gating on both rules rejects it."""
    passes.record(setup.out, "model", setup.tiny, AudioTakesTextModulation().identity(), bounds_sha256="model-bounds-sha256")
    lax = {"video_psnr_min_db": 1.0, "video_ssim_min": 0.01, "video_temporal_rmse": 0.99, "audio_relative_l2": 0.99}
    verdicts = {}
    for rule in ("fixed", "both"):
        path = write_contract(tmp_path / rule / "tiny", source=setup.contract.path, gating_rule=rule, fixed_bounds=lax)
        contract = generation_contract.load(path)
        assert contract.digest != setup.contract.digest and contract.measures_as(setup.frozen.provenance["contract"])
        verdicts[rule] = gate.check(setup.tiny, AudioTakesTextModulation(), contract, setup.frozen, "cpu", 43, setup.out)
    assert verdicts["fixed"].passed, verdicts["fixed"].report()
    assert not all(c["passed"] for c in verdicts["fixed"].metrics["workflows"]["fl2va"]["rules"]["calibrated"].values())
    failed = [c.name for c in verdicts["both"].checks if not c.passed]
    assert failed and all(name.startswith("fl2va.calibrated.") for name in failed), failed


def test_another_start_fails_before_the_candidate_computes(setup):
    result = setup.check(RoundsLatents())
    (check,) = result.checks
    assert (check.name, check.passed) == ("fl2va.same_start", False)
    digests = result.context["workflows"]["fl2va"]["noise_digests"]
    assert digests["candidate"]["hidden_states"] != digests["provider"]["hidden_states"]
    assert f"hidden_states: {digests['candidate']['hidden_states']} (this run) vs {digests['provider']['hidden_states']}" in check.detail["reason"]
    assert digests["candidate"]["audio_hidden_states"] == digests["provider"]["audio_hidden_states"]
    folders = list((setup.out / "generation" / "tiny" / setup.contract.name).glob("candidate-rounds-latents-*/fl2va-seed42"))
    assert folders and not [step for folder in folders for step in folder.glob("step-*")], "no candidate step was computed"


def test_verify_last_step_catches_a_nondeterministic_candidate(setup):
    assert setup.check(Noisy()).passed, "noise of 1e-6 is far inside the bounds"
    result = setup.check(Noisy(), verify_last_step=True)
    failed = result.failures[0]
    assert (failed.name, result.passed) == ("fl2va.determinism", False)
    assert "step 3/3 (step-0002) recomputed differs" in failed.detail["reason"]
    assert setup.check(ProviderCandidate()).passed  # its saved run, whichever test (or xdist worker) came first
    verified = setup.check(ProviderCandidate(), verify_last_step=True)
    assert verified.passed and verified.context["workflows"]["fl2va"]["candidate_run"]["verified_step"] == 2


def test_the_call_peak_is_the_candidates_own_apart_from_calls_holding_an_op_to_its_contract(setup):
    """The first call of a run holds each replaced op to the op contract, running the provider's op beside it: its
    peak is reported apart, and the transformer call's peak is the other calls'."""
    result = setup.check(replace("held-once", {"swiglu": lambda h: op_registry.swiglu(h)})(), seed=43)
    assert result.passed, result.report()
    costs = result.context["workflows"]["fl2va"]["candidate_run"]["costs"]
    assert len(costs["transformer_call_seconds"]) == 3 and costs["transformer_calls_contract_held"] == [0]
    assert costs["transformer_call_peak_memory_bytes"] > 0 and costs["contract_held_call_peak_memory_bytes"] > 0


def test_the_model_gate_must_pass_first(setup):
    candidate = Sourced(Path(passes.__file__).parent, "unrecorded")
    with pytest.raises(passes.NotPassed, match="run the model gate first"):
        setup.check(candidate, record=False)
    result = setup.check(candidate, record=False, model_gate_override="model gate ran on another machine")
    assert result.passed and result.context["model_gate"] == {"status": "overridden", "reason": "model gate ran on another machine"}


def _snapshot(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.name != resume.LOCK_FILE}


def test_a_changed_kernel_source_is_a_new_run_never_mixed(setup, tmp_path):
    (tmp_path / "kernel.py").write_text("SCALE = 1.0\n")
    candidate = Sourced(tmp_path, "edited")
    first = setup.check(candidate)
    old = Path(first.context["workflows"]["fl2va"]["candidate_run"]["run_folder"])
    before = _snapshot(old)
    (tmp_path / "kernel.py").write_text("SCALE = 1.01\n")
    second = setup.check(candidate)
    new = Path(second.context["workflows"]["fl2va"]["candidate_run"]["run_folder"])
    assert new != old and _snapshot(old) == before, "the old run stays, untouched"
    saved = json.loads((old / resume.IDENTITY_FILE).read_text())["candidate"]["source_sha256"]
    assert saved != json.loads((new / resume.IDENTITY_FILE).read_text())["candidate"]["source_sha256"]


def test_a_run_folder_of_another_identity_is_refused_with_the_difference(tiny, tmp_path):
    path = write_contract(tmp_path / "thresholds", source=PREFLIGHT)
    generation = gate.run_generation(tiny, generation_contract.load(path), 42, "cpu", tmp_path / "out")
    record = generation.folder / resume.IDENTITY_FILE
    identity = json.loads(record.read_text())
    identity["contract"]["sha256"] = "0" * 64  # a folder moved or edited by hand
    record.write_text(json.dumps(identity))
    with pytest.raises(resume.IdentityMismatch, match=r"contract\.sha256: '0{64}' -> '[0-9a-f]{64}'"):
        gate.run_generation(tiny, generation_contract.load(path), 42, "cpu", tmp_path / "out")


def test_the_preflight_contract_qualifies_the_product_candidate(tiny, tmp_path):
    """The whole flow on the committed preflight contract: freeze (here from sdpa-math alone), the provider passes
    those bounds; h3_triton (one transformer call under Triton's interpreter, ~15 s) passes both rules against the
    committed CPU bounds, frozen from every CPU variant. sdpa-math alone moves the generation less than h3_triton
    does: bounds calibrated from it reject h3_triton, which the calibrated rule is there to notice."""
    thresholds = tmp_path / "thresholds"
    path = thresholds / "tiny" / PREFLIGHT.name
    path.parent.mkdir(parents=True)
    shutil.copy(PREFLIGHT, path)
    bounds_mod.lock_files(thresholds, [path])
    contract = generation_contract.load(path)
    frozen = gate.freeze(tiny, contract, "cpu", thresholds, ["sdpa-math"], out_dir=tmp_path / "out")
    assert frozen.path.name == "generation-preflight-bounds.json"
    bounds_mod.verify_lock(thresholds)
    committed = gate.frozen_bounds(THRESHOLDS, tiny, generation_contract.load(PREFLIGHT), "cpu")
    verdicts = {}
    for candidate, bounds in ((ProviderCandidate(), frozen), (candidates.load("h3_triton"), committed),
                              (candidates.load("h3_triton"), frozen)):
        passes.record(tmp_path / "out", "model", tiny, candidate.identity(), bounds_sha256="model-bounds-sha256")
        verdicts[candidate.name, bounds is committed] = gate.check(tiny, candidate, contract, bounds, "cpu", 42, tmp_path / "out")
    for key in (("provider", False), ("h3_triton", True)):
        assert verdicts[key].passed, verdicts[key].report()
    values = verdicts["h3_triton", True].metrics["workflows"]["fl2va"]["values"]
    assert 0 < values["audio_relative_l2"], "h3_triton differs from the provider"
    narrow = verdicts["h3_triton", False]
    assert not narrow.passed and all(".calibrated." in c.name for c in narrow.checks if not c.passed), narrow.report()


def test_a_damaged_cached_encoding_is_an_error_naming_what_to_delete(tiny, tmp_path):
    contract = generation_contract.load(write_contract(tmp_path / "thresholds", source=PREFLIGHT))
    first = gate.run_generation(tiny, contract, 42, "cpu", tmp_path / "out")
    cached = Path(first.costs["encoding"]["file"])
    assert first.costs["encoding"]["encoded"] and set(first.costs["decode"]) == {"video", "audio"}
    measured = [first.costs["encoding"]["text_encoder_and_all_encodings"], *first.costs["decode"].values()]
    assert all(part["seconds"] > 0 and part["peak_memory_bytes"] > 0 for part in measured), first.costs
    assert first.costs["transformer_call_peak_memory_bytes"] > 0 and len(first.costs["transformer_call_seconds"]) > 0
    again = gate.run_generation(tiny, contract, 42, "cpu", tmp_path / "out2")
    assert again.first_call_inputs == first.first_call_inputs, "a fresh encoding starts the same generation"
    cached.write_bytes(cached.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(gate.EncodingError, match=f"delete {cached.name} and {cached.stem}.json to encode again"):
        gate.run_generation(tiny, contract, 42, "cpu", tmp_path / "out")


def test_a_text_encoder_built_for_an_encoding_is_dropped_after_it(tiny, tmp_path, monkeypatch):
    """The release preset's components come without their 47 GiB text encoder: one is built only when an encoding
    is missing, encodes every workflow of the contract still missing and is freed after it (tiny's components stand
    in for release's here)."""
    from h3gate.generation.components import build_components

    contract = generation_contract.load(write_contract(tmp_path / "thresholds", source=PREFLIGHT, workflow=["t2va", "fl2va"]))
    reference, _ = gate.encodings(tiny, contract, "t2va", gate._components(tiny.source, "cpu"), "cpu", tmp_path / "ref")
    built = []

    def build(preset, seed, device="cpu", text_encoder=True):
        components = build_components("tiny", seed, device, text_encoder)
        built.append(components.get("text_encoder"))
        return components

    monkeypatch.setattr(gate, "build_components", build)
    parts = build_components("tiny", gate.COMPONENTS_SEED, text_encoder=False)
    components = (parts, "recipe-digest")
    encoded, costs = gate.encodings(tiny, contract, "t2va", components, "cpu", tmp_path / "out")
    assert costs["encoded"] and costs["with"] == ["fl2va", "t2va"] and "text_encoder" not in parts and len(built) == 1
    assert all(param.device.type == "meta" for param in built[0].parameters()), "its storage is freed"
    assert torch.equal(encoded["prompt_embeds"], reference["prompt_embeds"]), "the same encoder, built on demand"
    for workflow in ("t2va", "fl2va"):
        again, costs = gate.encodings(tiny, contract, workflow, components, "cpu", tmp_path / "out")
        assert not costs["encoded"] and len(built) == 1, "a cached encoding builds no text encoder"
    assert again["condition_latents"] is not None and encoded["condition_latents"] is None, "fl2va's keyframe, t2va's none"
