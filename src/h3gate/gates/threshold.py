"""The ``threshold`` gate: a user's own metric, frozen from the provider variants and checked like a built-in gate.

A team's check the gates do not have (a perceptual score of the video, a lip-sync score of the audio, a bound on one
tap) is a function ``measure(role)`` of the role whose output it scores: ``"provider"``, a provider variant's name
(:func:`h3gate.numerics.variants`) or ``"candidate"``. It returns a finite number or a flat ``{key: number}``.

The rule, for any metric whatever its scale or direction, in the spirit of the ensemble rule: what a candidate may
change is what legitimate provider arithmetic changes. Freezing measures the provider and every variant; per key the
bound is ``(1 + margin) x`` the largest ``|variant - provider|``; a key no variant moves is refused (its bound would
demand bitwise equality). Checking measures the provider and the candidate and requires ``|candidate - provider|``
within the bound. The bounds file (``thresholds/<model>/<device class>/threshold-<name>-bounds.json``, locked like
every bounds file) records each variant's value and the digest of ``measure``'s source: a changed measure must be
frozen again.

Items come from the plugin's ``h3_threshold`` fixture, whose test carries ``@pytest.mark.h3_gate("threshold")``;
the run's options hold ``name``, ``measure`` and ``margin``.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
from pathlib import Path

from h3gate import bounds as bounds_mod
from h3gate import numerics
from h3gate.gates import ItemError
from h3gate.verdict import Check, GateResult, Provenance

GATE = "threshold"
PROVIDER, CANDIDATE = "provider", "candidate"
DEFAULT_MARGIN = 0.5
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


class ThresholdBounds(bounds_mod.Bounds):
    """Frozen bounds of a user's metric: the bounds file format, with this gate's rule."""

    @property
    def non_discriminating(self) -> list[str]:
        return []  # every bound is a finite deviation above zero: a candidate can always exceed it

    def to_json(self) -> dict:
        return {**super().to_json(), "rule": {
            "metric": "|value - provider's value| of the user's measure",
            "bound": "(1 + margin) x the largest deviation of a provider variant",
            "margin": self.provenance["margin"],
        }}


def _options(run) -> tuple[str, object, float]:
    name, measure = run.options.get("name"), run.options.get("measure")
    margin = run.options.get("margin", DEFAULT_MARGIN)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ItemError(f"threshold name {name!r}: give 1-64 characters of a-z, 0-9, '.', '_', '-' (it names a file)")
    if not callable(measure):
        raise ItemError(f"threshold {name!r}: measure must be a function of the role, got {measure!r}")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < math.inf:
        raise ItemError(f"threshold {name!r}: margin must be a finite number >= 0, got {margin!r}")
    return name, measure, float(margin)


def _source_digest(measure) -> str:
    try:
        source = inspect.getsource(measure)
    except (OSError, TypeError):
        source = getattr(measure, "__qualname__", repr(measure))
    return hashlib.sha256(source.encode()).hexdigest()


def _values(name: str, measure, role: str) -> dict[str, float]:
    """``measure(role)`` as ``{key: float}``, every value finite (a bare number is the key ``value``)."""
    raw = measure(role)
    table = raw if isinstance(raw, dict) else {"value": raw}
    if not table:
        raise ValueError(f"threshold {name!r}: measure({role!r}) returned an empty dict")
    values = {}
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
            raise ValueError(f"threshold {name!r}: measure({role!r})[{key!r}] is {value!r}, not a number")
        values[str(key)] = float(value)
        if not math.isfinite(values[str(key)]):
            raise ValueError(f"threshold {name!r}: measure({role!r})[{key!r}] is {value!r}: finite numbers only")
    return values


def items(run) -> list[dict]:
    return [{}]


def bounds_file(run) -> Path:
    name, _, _ = _options(run)
    return bounds_mod.bounds_path(run.thresholds, run.model_name, run.device_class, f"{GATE}-{name}")


def load_bounds(run) -> ThresholdBounds:
    name, measure, _ = _options(run)
    loaded = bounds_mod.load(bounds_file(run), f"{GATE}:{name}", run.model.identity, run.device_class)
    if loaded.provenance.get("measure_sha256") != _source_digest(measure):
        raise bounds_mod.BoundsError(f"{loaded.path or bounds_file(run)} was frozen for another measure of {name!r} "
                                     "(its source changed); freeze it again")
    return ThresholdBounds(**{key: value for key, value in vars(loaded).items()})


def freeze_item(run) -> ThresholdBounds:
    name, measure, margin = _options(run)
    path = bounds_file(run)
    bounds_mod.refuse_overwrite(path, run.force_reason)
    variants = run.variant_names if run.variant_names is not None else [m.name for m in numerics.variants(run.device)]
    if not variants:
        raise bounds_mod.BoundsError(f"threshold {name!r}: calibrating needs at least one provider variant")
    reference = _values(name, measure, PROVIDER)
    deviations = {}
    for variant in variants:
        values = _values(name, measure, variant)
        if set(values) != set(reference):
            raise ValueError(f"threshold {name!r}: measure({variant!r}) has keys {sorted(values)}, the provider's "
                             f"{sorted(reference)}")
        deviations[variant] = {key: abs(values[key] - reference[key]) for key in reference}
    table, providers = {}, []
    for key in reference:
        worst = max(variants, key=lambda variant: deviations[variant][key])
        if deviations[worst][key] == 0:
            raise bounds_mod.BoundsError(
                f"threshold {name!r}: no variant of {variants} moved {key!r} from the provider's "
                f"{reference[key]!r}; the bound would demand bitwise equality: calibrate with variants that change "
                f"the arithmetic (here: {', '.join(m.name for m in numerics.variants(run.device))})")
        table[key] = (1 + margin) * deviations[worst][key]
        if worst not in providers:
            providers.append(worst)
    frozen = ThresholdBounds(
        gate=f"{GATE}:{name}", model_identity=run.model.identity, device_class=run.device_class, bounds=table,
        errors=deviations, sources=list(variants), providers=providers, duplicates_dropped={},
        provenance=bounds_mod.provenance({"model_source": run.model.source, "margin": margin,
                                          "measure_sha256": _source_digest(measure), "provider_values": reference}),
    )
    bounds_mod.save(frozen, path, run.thresholds, run.force_reason)
    return frozen


def check_item(run, frozen: ThresholdBounds) -> GateResult:
    name, measure, _ = _options(run)
    reference = _values(name, measure, PROVIDER)
    values = _values(name, measure, CANDIDATE)
    if set(values) != set(frozen.bounds):
        raise ValueError(f"threshold {name!r}: measure('candidate') has keys {sorted(values)}, the frozen bounds "
                         f"{sorted(frozen.bounds)}")
    checks = [Check(key, "deviation from the provider", abs(values[key] - reference[key]), frozen.bounds[key],
                    abs(values[key] - reference[key]) <= frozen.bounds[key],
                    {"candidate": values[key], "provider": reference[key]})
              for key in frozen.bounds]
    return GateResult(GATE, run.params, checks, {"threshold": name}, provenance=Provenance.of(frozen))
