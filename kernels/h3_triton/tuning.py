"""How each kernel's tiling is chosen: Triton's autotuner on a GPU, one fixed tiling under the interpreter.

Every tuned kernel of this package launches through a :class:`Launcher`, which owns its list of tilings.
Triton's ``triton.autotune`` does the timing; the tilings it picks are kept in a :class:`TuningStore`, one JSON
file per GPU name and triton version (:func:`store_path`), so a run does not re-tune what an earlier run on the
same GPU model tuned. Triton's own ``cache_results`` is not used: it keys by GPU architecture, so an H100 and an
H200 sharing ``~/.triton`` would run each other's tilings. A stored tiling is only taken if it is still in the
launcher's list; anything else is tuned afresh.

Every kernel runs the first tiling of its list by default (for attention and the GEMMs the fastest measured at
release shapes on an H200): no timing runs, nothing is read or written, and the tiling, and so the bits of kernels
whose reduction order follows it (attention's key blocks), do not depend on timings a machine happened to measure.
The gates run this way out of the box (tuning every hypothesis-drawn shape afresh costs minutes per op), and so do
the committed benchmarks. ``H3_TRITON_AUTOTUNE=1`` (read at import) tunes each shape instead, for another GPU or
other shapes; ``tests/kernels/test_tilings.py`` runs every tiling of every launcher (:data:`LAUNCHERS`) through
:meth:`Launcher.forcing`, so no tiling the autotuner may pick goes unchecked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Iterator

import torch
import triton
from filelock import FileLock

from h3_triton import paths
from h3_triton.interpret import INTERPRET
from h3_triton.launch import launch
from h3gate.files import write_atomic


def _autotune_setting() -> bool:
    value = os.environ.get("H3_TRITON_AUTOTUNE", "0")
    if value not in ("0", "1"):
        raise ValueError(
            f"H3_TRITON_AUTOTUNE={value!r}: set it to 0 (the first tiling of every kernel, no timing runs: the "
            "default) or 1 (autotune each shape)"
        )
    return value == "1"


AUTOTUNE: bool = _autotune_setting()

LAUNCHERS: list["Launcher"] = []

_KEY_SCALARS = (bool, int, float, str)


def store_path(device_name: str) -> Path:
    """The store of one GPU model and triton version, under ``H3_TRITON_TUNING_DIR`` (read at each call)."""
    root = Path(os.environ.get("H3_TRITON_TUNING_DIR", "~/.cache/h3_triton/tunings")).expanduser()
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    return root / slug / f"triton-{triton.__version__}.json"


def _described(config_kwargs: dict) -> str:
    """A config as everything it passes to the launch (tile sizes, warps, stages...), comparable as a string."""
    return json.dumps(config_kwargs, sort_keys=True)


class TuningStore:
    """Tuned configs in one JSON file: ``{group: [{"key": [...], "config": {...}}, ...]}``.

    A group is one launcher's (:meth:`Launcher.group`); a key is the autotuner's tuning key (the key arguments'
    values, then every tensor argument's dtype as a string); a config is stored as its ``all_kwargs()``, so an
    entry can only ever be read back as that very tiling. pytest-xdist workers share the file: writes lock it,
    merge into what is there and replace it whole, so readers never see half a file and no worker drops
    another's entries.
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def load(self, group: str, configs: list[triton.Config]) -> dict[tuple, triton.Config]:
        """The group's entries whose config is one of ``configs``; the others are left to be tuned again."""
        by_description = {_described(config.all_kwargs()): config for config in configs}
        found = {}
        for entry in self._read().get(group, []):
            config = by_description.get(_described(entry["config"]))
            if config is not None:
                found[tuple(entry["key"])] = config
        return found

    def save(self, group: str, tuned: dict[tuple, triton.Config]) -> None:
        """Adds ``tuned`` to the group, replacing entries of the same keys, under the file's lock."""
        for key in tuned:
            if not all(isinstance(value, _KEY_SCALARS) for value in key):
                raise TypeError(f"tuning key {key!r}: only bool, int, float and str values survive JSON unchanged")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{self.path}.lock"):
            data = self._read()
            entries = {tuple(entry["key"]): entry for entry in data.get(group, [])}
            entries.update({key: {"key": list(key), "config": config.all_kwargs()} for key, config in tuned.items()})
            data[group] = list(entries.values())
            write_atomic(self.path, json.dumps(data, indent=1))

    def _read(self) -> dict[str, list[dict]]:
        try:
            data = json.loads(self.path.read_text())
            if not (isinstance(data, dict) and all(isinstance(entries, list) and all(map(_valid, entries))
                                                   for entries in data.values())):
                raise ValueError("not a mapping of groups to lists of {key, config} entries")
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            raise RuntimeError(f"tuning store {self.path} is unreadable ({error}): delete it (its kernels are "
                               "tuned again)") from error
        return data


def _valid(entry) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("config"), dict) and isinstance(entry.get("key"), list)
            and all(isinstance(value, _KEY_SCALARS) for value in entry["key"]))


class Launcher:
    """Launches ``kernel[grid](*args, **meta)`` (through :func:`h3_triton.launch.launch`) with a tiling from
    ``tilings``.

    ``tilings`` maps the element size of the kernel's argument ``sized_by`` (default: its first; 2: bfloat16, 4:
    float32) to its candidate configs, the preferred first; ``key`` names the arguments the autotuner keys on
    (Triton adds the dtypes).
    Under the interpreter the tiling is ``interpreter`` (the interpreter's cost is per program and per step, not
    per element, so it gets few large tiles).
    """

    def __init__(self, kernel, tilings: dict[int, list[triton.Config]], key: list[str], interpreter: dict,
                 sized_by: str | None = None):
        self.kernel = kernel
        self.tilings = tilings
        self.interpreter = interpreter
        self._forced: triton.Config | None = None
        self._sized_by = sized_by or kernel.arg_names[0]
        self._sized_index = kernel.arg_names.index(self._sized_by)
        self._firsts = {size: rows[0].all_kwargs() for size, rows in tilings.items()}
        self._tuned = None
        self._store: TuningStore | None = None
        if not INTERPRET:
            self._tuned = triton.autotune(
                configs=[c for configs in tilings.values() for c in configs],
                key=key,
                prune_configs_by={
                    "early_config_prune": lambda configs, named_args, **_: self._suiting(named_args[self._sized_by])
                },
            )(kernel)
        LAUNCHERS.append(self)

    @property
    def name(self) -> str:
        return self.kernel.__name__

    @cached_property
    def group(self) -> str:
        """The kernel's name and a digest of its source (with the jit functions it calls) and of its tilings: an
        edited kernel or tiling list is tuned afresh, and two launchers of one kernel (the tiled and the skinny
        GEMM) keep their tunings apart."""
        described = [self.kernel.cache_key, *(_described(c.all_kwargs()) for c in self._tuned.configs)]
        return f"{self.name} {hashlib.sha256(' '.join(described).encode()).hexdigest()[:16]}"

    def _suiting(self, first_tensor) -> list[triton.Config]:
        return self.tilings[first_tensor.element_size()]

    def __call__(self, grid, *args, branches: dict | None = None, **meta):
        """Launches with the tiling :meth:`_tiling` picks, its path noted (:mod:`h3_triton.paths`); ``branches`` are
        the path's runtime conditions, each a value or a function of the launch's options (its tile sizes)."""
        tiling = self._tiling(args)
        if tiling is None:  # the autotuner picks at launch: the path names no tile sizes
            autotuned = {k: "autotuned" if callable(v) else v for k, v in (branches or {}).items()}
            if not paths.skipped(self.kernel, args, {**meta, "tiling": "autotuned"}, autotuned):
                self._tuned_launch(grid, args, meta)
            return
        meta.update(tiling)
        if not paths.skipped(self.kernel, args, meta, branches):
            launch(self.kernel, grid, args, meta)

    def _tiling(self, args) -> dict | None:
        """The launch options of the tiling: the forced one, the interpreter's, the first of the list, or None when
        the autotuner picks."""
        if self._forced is not None:
            return self._forced.all_kwargs()
        if INTERPRET:
            return self.interpreter
        if not AUTOTUNE:
            return self._firsts[args[self._sized_index].element_size()]
        return None

    def _tuned_launch(self, grid, args, meta):
        """The autotuner's launch, its in-memory tunings first seeded from the store and new ones written back.

        The store is opened at the first launch, on the device of its first tensor: by then the GPU is known.
        """
        tunings = self._tuned.cache
        if self._store is None:
            self._store = TuningStore(store_path(torch.cuda.get_device_name(args[0].device)))
            tunings.update(self._store.load(self.group, self._tuned.configs))
        known = set(tunings)
        self._tuned[grid](*args, **meta)
        new = {key: config for key, config in tunings.items() if key not in known}
        if new:
            self._store.save(self.group, new)

    @contextmanager
    def forcing(self, config: triton.Config) -> Iterator[None]:
        """Every launch inside runs ``config``, whatever the tuner or the interpreter would choose."""
        self._forced = config
        try:
            yield
        finally:
            self._forced = None


def configs(rows, names: tuple[str, ...], **fixed) -> list[triton.Config]:
    """Configs from rows of (one size per name in ``names``..., num_warps, num_stages), plus ``fixed`` sizes."""
    return [
        triton.Config({**dict(zip(names, row[:-2])), **fixed}, num_warps=row[-2], num_stages=row[-1]) for row in rows
    ]
