"""Bounds: the ensemble rule's arithmetic, bounds files, and the lock that refuses quiet edits."""

import json
import math

import pytest

from h3gate import bounds
from h3gate.bounds import BoundsError, ensemble


def test_ensemble_rule_and_floors():
    table, kept, providers, dropped = ensemble(
        {
            "provider": {"nodes.a": 0.010, "nodes.a.grad": 0.020, "outputs.video": 0.0},
            "sdpa-math": {"nodes.a": 0.012, "nodes.a.grad": 0.015, "outputs.video": 0.0},
        }
    )
    assert math.isclose(table["nodes.a"], 1.5 * 0.012 + 1e-3)
    assert math.isclose(table["nodes.a.grad"], 1.5 * 0.020 + 5e-3)
    assert table["outputs.video"] == 1e-3
    assert providers == ["sdpa-math", "provider"]
    assert dropped == {} and list(kept) == ["provider", "sdpa-math"]


def test_only_exact_duplicates_are_dropped():
    base = {"nodes.a": 0.01}
    _, kept, _, dropped = ensemble({"provider": base, "threads-1": dict(base), "sdpa-math": {"nodes.a": 0.0100001}})
    assert dropped == {"threads-1": "provider"}
    assert list(kept) == ["provider", "sdpa-math"]


def test_input_gradients_get_the_gradient_floor():
    table, *_ = ensemble({"provider": {"input_gradients.hidden_states": 0.0}})
    assert table["input_gradients.hidden_states"] == 5e-3


def test_non_finite_provider_error_is_refused():
    with pytest.raises(BoundsError, match="non-finite error on nodes.a"):
        ensemble({"provider": {"nodes.a": math.inf}})


def _frozen(thresholds, **overrides):
    table, kept, providers, dropped = ensemble({"provider": {"nodes.a": 0.8, "nodes.b": 0.01}})
    frozen = bounds.Bounds("model", "id-1", "cpu", table, kept, ["provider"], providers, dropped, bounds.provenance())
    path = bounds.bounds_path(thresholds, "tiny", "cpu", "model")
    bounds.save(frozen, path, thresholds, **overrides)
    return frozen, path


def test_save_load_round_trip_and_non_discriminating(tmp_path):
    frozen, path = _frozen(tmp_path)
    assert frozen.non_discriminating == ["nodes.a"], "1.5 x 0.8 + floor >= 1 cannot discriminate"
    assert json.loads(path.read_text())["non_discriminating"] == ["nodes.a"]
    loaded = bounds.load(path, "model", "id-1", "cpu")
    assert loaded.bounds == frozen.bounds
    bounds.verify_lock(tmp_path)
    assert len(path.read_text().splitlines()) > 10, "one value per line"


def test_overwrite_needs_a_recorded_reason(tmp_path):
    _frozen(tmp_path)
    with pytest.raises(BoundsError, match="not overwritten.*--h3-freeze-force"):
        _frozen(tmp_path)
    _, path = _frozen(tmp_path, force_reason="diffusers 0.42.2 changed the attention dispatch")
    assert json.loads(path.read_text())["provenance"]["forced"] == "diffusers 0.42.2 changed the attention dispatch"
    bounds.verify_lock(tmp_path)


@pytest.mark.parametrize(
    "field, value, message",
    [("model_identity", "id-2", "model_identity 'id-1', this run needs 'id-2'"), ("device_class", "cuda-nvidia-h200", "device_class 'cpu'")],
)
def test_bounds_for_another_model_or_device_are_refused(tmp_path, field, value, message):
    _, path = _frozen(tmp_path)
    arguments = {"model_identity": "id-1", "device": "cpu"}
    arguments["device" if field == "device_class" else field] = value
    with pytest.raises(BoundsError, match=message):
        bounds.load(path, "model", arguments["model_identity"], arguments["device"])


def test_missing_bounds(tmp_path):
    with pytest.raises(BoundsError, match="no frozen model bounds"):
        bounds.load(tmp_path / "absent.json", "model", "id", "cpu")


def test_one_changed_byte_breaks_the_lock(tmp_path):
    _, path = _frozen(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('"nodes.b": 0.016', '"nodes.b": 0.026', 1))
    assert path.read_text() != text
    with pytest.raises(BoundsError, match="does not match its digest"):
        bounds.verify_lock(tmp_path)


def test_unlocked_and_vanished_files_are_refused(tmp_path):
    _, path = _frozen(tmp_path)
    extra = tmp_path / "tiny" / "generation-contract.json"
    extra.write_text("{}")
    with pytest.raises(BoundsError, match="is not in LOCK.json"):
        bounds.verify_lock(tmp_path)
    extra.unlink()
    path.unlink()
    with pytest.raises(BoundsError, match="in LOCK.json but missing"):
        bounds.verify_lock(tmp_path)


def test_positive_numbers_only(tmp_path):
    _, path = _frozen(tmp_path)
    data = json.loads(path.read_text())
    data["bounds"]["nodes.b"] = "0.1"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="bound of nodes.b must be a positive finite number"):
        bounds.load(path, "model", "id-1", "cpu")
