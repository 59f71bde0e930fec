"""What this repository's tests share: its paths, the pytester plugin, the embedded model, its contract and its
committed bounds, one torch thread for a module, and each test's start from the session's environment.

At the repository's root, so every test below ``tests/`` sees it (pytest reads ``pytest_plugins`` from the root
conftest only) and ``from conftest import ROOT, THRESHOLDS`` names this one module; keep it the test tree's only
conftest. The plugin never depends on it: the gate suite runs in a repository of its own without it (pytest's
``--noconftest`` runs it so).
"""

import os
from pathlib import Path

import pytest

from h3gate import bounds
from h3gate.model.contract import load_model_contract
from h3gate.model.factory import build_preset

ROOT = Path(__file__).resolve().parent
THRESHOLDS = ROOT / "thresholds"

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def session_environment(request):
    """Each test ends with the environment it started from: what the plugin publishes in ``os.environ`` when a test
    runs its hooks in-process (a controller's GPU list, a worker's pinned GPU, the interpreter switch) would reach the
    pytest subprocesses of whichever tests xdist sends to the same worker later, so a test's outcome would depend on
    its neighbours. Gate items are left alone: they run as in a user's repository, which has no such conftest."""
    saved = None if request.node.get_closest_marker("gate") else dict(os.environ)
    yield
    if saved is None:
        return
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module: the tiny models are overhead-bound, and OpenMP spin-waits make them
    many times slower on a shared 2-core CPU; a generation's run identity records the thread count too."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny():
    return build_preset("tiny")


@pytest.fixture(scope="session")
def tiny_contract():
    return load_model_contract(THRESHOLDS / "tiny" / "model-contract.json")


@pytest.fixture(scope="session")
def tiny_model_bounds(tiny):
    path = bounds.bounds_path(THRESHOLDS, "tiny", "cpu", "model")
    return bounds.load(path, "model", tiny.identity, "cpu")
