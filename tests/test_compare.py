"""Metrics: relative L2 in float64, ULP distance in the tensor's own dtype, non-finite counts."""

import math

import pytest
import torch

from h3gate.compare import compare, relative_l2, ulp_distance


def test_relative_l2_exact_values():
    ref = torch.tensor([3.0, 4.0])
    assert relative_l2(ref, ref) == 0.0
    assert math.isclose(relative_l2(torch.tensor([3.0, 5.0]), ref), 1 / 5)
    assert relative_l2(torch.zeros(2), torch.zeros(2)) == 0.0
    assert relative_l2(torch.ones(2), torch.zeros(2)) == math.inf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ulp_distance_counts_representable_steps(dtype):
    x = torch.tensor([1.0, -1.0, 0.0, 1e-30], dtype=dtype)
    up = torch.nextafter(x, torch.full_like(x, math.inf))
    assert ulp_distance(up, x).tolist() == [1, 1, 1, 1]
    two_up = torch.nextafter(up, torch.full_like(x, math.inf))
    assert ulp_distance(two_up, x).tolist() == [2, 2, 2, 2]
    assert ulp_distance(x, x).tolist() == [0, 0, 0, 0]
    # Across zero: the smallest positive and negative subnormals are two steps apart (+0 and -0 are one point).
    tiny = torch.nextafter(torch.zeros(1, dtype=dtype), torch.ones(1, dtype=dtype))
    assert ulp_distance(tiny, -tiny).item() == 2


def test_ulp_rounds_the_reference_to_the_tensors_dtype():
    ref = torch.tensor([1.0 + 2**-10], dtype=torch.float64)  # not representable in bfloat16
    x = ref.to(torch.bfloat16)
    assert ulp_distance(x, ref).item() == 0


def test_compare_reports_everything():
    ref = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    x = ref.to(torch.bfloat16)
    x[0] = float("nan")
    x[1] = float("inf")
    metrics = compare(x, ref)
    assert metrics["nan"] == 1 and metrics["inf"] == 1
    assert metrics["dtype"] == "bfloat16"
    assert 0.0 < metrics["bitwise_equal_fraction"] <= 1.0
    assert metrics["ulp_max"] >= 0 and metrics["ulp_p99"] <= metrics["ulp_max"]
    with pytest.raises(ValueError, match="shape"):
        compare(torch.zeros(2), torch.zeros(3))


def test_all_zero_flags():
    metrics = compare(torch.zeros(4), torch.ones(4))
    assert metrics["all_zero"] and not metrics["reference_all_zero"]


def test_bias_is_the_error_signed_along_the_reference():
    from h3gate.compare import bias

    ref = torch.randn(10_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    scaled, spread = bias(ref * 1.001, ref)
    assert abs(scaled - 1e-3) < 1e-12 and spread < 1e-5, "a scaling is a bias though ref's mean is about zero"
    assert bias(ref, ref) == (0.0, 0.0) and bias(ref, torch.zeros_like(ref)) == (0.0, 0.0)
    noise = ref + 1e-3 * torch.randn(10_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    value, spread = bias(noise, ref)
    assert abs(value) < 5 * spread and 1e-6 < spread < 1e-4, "unbiased noise stays within a few standard errors"


def test_bias_standard_error_counts_errors_correlated_within_rows():
    """A softmax row's rounded normaliser scales the whole row: unbiased across rows, correlated within one."""
    from h3gate.compare import bias

    generator = torch.Generator().manual_seed(2)
    ref = torch.randn(64, 512, generator=generator, dtype=torch.float64)
    rows = ref * (1 + 1e-3 * torch.randn(64, 1, generator=generator, dtype=torch.float64))
    value, spread = bias(rows, ref)
    assert abs(value) < 3 * spread and spread > 5e-5, "the spread of row scalings, not of single elements"
