"""Synthetic gate runs and their evidence, for the tests of writing, verifying, merging and attacking evidence: a
locked copy of the committed thresholds, the release gates' items with results and artifacts, and edits of a sealed
envelope that leave the check under test standing alone."""

import base64
import contextlib
import io
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from conftest import THRESHOLDS
from h3gate.cli import main
from h3gate.evidence import profiles, signing
from h3gate.evidence.profiles import Outcome
from h3gate.evidence.statement import SUMS_NAME, statement_of as statement_in, write_evidence
from h3gate.files import sha256_file
from h3gate.verdict import Check, GateResult

HOME = "/home/alice"
MODEL_ONLY = profiles.Profile("model-only", (profiles.Requirement("model"),))
ENVIRONMENT = {
    "python": "3.11.7",
    "platform": "Linux-x86_64",
    "torch": "2.13.0",
    "cuda": "12.8",
    "driver": "570.86.15",
    "triton": "3.9.0",
    "diffusers": "0.42.1",
    "gpus": [{"index": 0, "name": "NVIDIA H200", "pci_bus_id": "00000000:3B:00.0"}],
    "hostname": "gpu-node-17.cluster",
    "user": "alice",
    "home": HOME,
}
MODEL = {"name": "tiny", "identity": "ab" * 32, "source": "/scratch/alice/checkpoints/h3"}
CANDIDATE = {"name": "h3_triton", "source_sha256": "cd" * 32, "triton": "3.9.0"}
ITEMS = {
    "tests/gates/test_kernel.py::test_kernel": ("kernel", {}),
    "tests/gates/test_block.py::test_block[block0]": ("block", {"block": 0}),
    "tests/gates/test_model.py::test_model": ("model", {}),
    **{f"tests/gates/test_generation.py::test_generation[seed{s}]": ("generation", {"seed": s}) for s in (42, 43, 44)},
}


def gate_result(gate: str, params: dict, failing: bool = False, timing: float = 1.0) -> dict:
    checks = [
        Check(f"nodes.transformer_blocks.{i}.attn", "relative_l2", 0.004 * (i + 1), 0.02, True, {"max_abs": 0.1})
        for i in range(3)
    ]
    if failing:
        checks.append(Check("nodes.proj_out", "relative_l2", 0.5, 0.02, False, {"max_abs": 3.0}))
    metrics = {}
    if gate == "generation":
        seed = params["seed"]
        metrics = {
            "fixed": {
                "psnr": 38.0 + seed / 100,
                "ssim": 0.97,
                "psnr_per_frame": [38.0, 37.5, 36.9],
                "ssim_per_frame": [0.98, 0.97, 0.96],
            },
            "audio": {"relative_l2": 0.011},
        }
    context = {
        "bounds_file": f"{HOME}/h3/thresholds/tiny/cpu/{gate}-bounds.json",
        "bounds_sha256": "ef" * 32,
        "non_discriminating": [],
    }
    return GateResult(gate, params, checks, context, metrics, {"candidate": timing}).to_json()


@dataclass
class Run:
    """A synthetic run of the release gates: thresholds (locked), artifacts, results, outcomes."""

    root: Path
    thresholds: Path
    outcomes: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)  # nodeid -> artifact path

    @property
    def files(self) -> list[Path]:
        return [
            self.thresholds / "tiny" / "cpu" / "model-bounds.json",
            self.thresholds / "tiny" / "model-contract.json",
        ]

    def write(self, out: Path, nodeids=None, key=None, required=profiles.PROFILES["release"], **identity) -> Path:
        """The evidence of ``nodeids`` in ``out``; a shard's folder gets a copy of its artifacts, as a shard's
        --h3-out holds its own."""
        nodeids = list(self.outcomes) if nodeids is None else nodeids
        artifacts = [self.artifacts[n] for n in nodeids if n in self.artifacts]
        if Path(out).resolve() != self.root.resolve():
            (Path(out) / "artifacts").mkdir(parents=True, exist_ok=True)
            artifacts = [Path(shutil.copy(a, Path(out) / "artifacts" / a.name)) for a in artifacts]
        return write_evidence(
            out,
            {n: self.results[n] for n in nodeids if n in self.results},
            {n: self.outcomes[n] for n in nodeids if n in self.outcomes},
            required,
            artifacts,
            self.thresholds,
            self.files,
            identity.get("model", MODEL),
            identity.get("candidate", CANDIDATE),
            ENVIRONMENT,
            key,
        )[0]


def make_run(root: Path, timing: float = 1.0, outcome: dict | None = None, failing: tuple = ()) -> Run:
    """Every release gate item passed, unless ``outcome`` (nodeid -> outcome) or ``failing`` says otherwise;
    skipped, deselected and errored items have no result and no artifact."""
    thresholds = root / "thresholds"
    if not thresholds.exists():
        shutil.copytree(THRESHOLDS, thresholds, ignore=shutil.ignore_patterns("*.flock"))
    run = Run(root, thresholds)
    for index, (nodeid, (gate, params)) in enumerate(ITEMS.items()):
        state = (outcome or {}).get(nodeid, "failed" if nodeid in failing else "passed")
        run.outcomes[nodeid] = Outcome(state, gate, params)
        if state in ("passed", "failed"):
            run.results[nodeid] = gate_result(gate, params, nodeid in failing, timing)
            artifact = root / "artifacts" / f"{gate}-{index}.bin"
            artifact.parent.mkdir(parents=True, exist_ok=True)
            artifact.write_bytes(f"{gate} {params} output".encode())
            run.artifacts[nodeid] = artifact
    return run


def statement_of(path: Path) -> dict:
    return statement_in(signing.open_envelope(path))


def rewrite_payload(path: Path, edit) -> None:
    """Apply ``edit`` (bytes -> bytes) to the envelope's payload, keeping the envelope otherwise as it was."""
    envelope = json.loads(path.read_text())
    payload = edit(base64.b64decode(envelope["payload"]))
    envelope["payload"] = base64.b64encode(payload).decode()
    path.write_text(json.dumps(envelope))


def reseal_sums(path: Path) -> None:
    """Point SHA256SUMS's line of the envelope at the envelope as it is now, so an edited statement meets the check
    under test and not the sums' (which would name the edited envelope first)."""
    sums = path.parent / SUMS_NAME
    digest = sha256_file(path)
    sums.write_text(re.sub(r"(?m)^[0-9a-f]{64}(?=  evidence\.json$)", digest, sums.read_text()))

HALVES = (list(ITEMS)[::2], list(ITEMS)[1::2])


def run_cli(*args) -> tuple[int, str]:
    """``h3gate ARGS`` in-process: its exit code and everything it printed. A traceback fails the calling test."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main([str(arg) for arg in args])
    return code, out.getvalue()


def edit_statement(path: Path, edit) -> None:
    """Apply ``edit`` (statement dict -> None) to the envelope's statement; SHA256SUMS, which would name the
    edited envelope first, is resealed so the check under test stands alone."""

    def rewrite(payload: bytes) -> bytes:
        statement = json.loads(payload)
        edit(statement)
        return json.dumps(statement).encode()

    rewrite_payload(path, rewrite)
    reseal_sums(path)
