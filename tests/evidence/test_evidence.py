"""Evidence: DSSE signing and verification, tamper detection, completeness, redaction, merging of shards."""

import ast
import base64
import json
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key

from conftest import ROOT
from evidence_runs import (
    CANDIDATE, ENVIRONMENT, HALVES, HOME, ITEMS, MODEL, MODEL_ONLY, make_run, reseal_sums, rewrite_payload,
    statement_of,
)
from h3gate.bounds import lock_files
from h3gate.evidence import environment, profiles, signing
from h3gate.evidence.accumulate import add_session
from h3gate.evidence.merge import merge
from h3gate.evidence.statement import build_statement
from h3gate.evidence.signing import EvidenceError
from h3gate.evidence.verify import verify
from h3gate.files import sha256_bytes, sha256_file


def without_timings(statement: dict) -> dict:
    """The statement less what differs between runs of the same items: timings, the time written, and where
    each artifact lies (its digest stays)."""
    statement = json.loads(json.dumps(statement))
    statement["predicate"]["h3"].pop("created")
    statement["subject"] = sorted(s["digest"]["sha256"] for s in statement["subject"])
    for test in statement["predicate"]["h3"]["tests"].values():
        if test["result"] is not None:
            test["result"].pop("timings")
    return statement


@pytest.fixture
def key():
    return Ed25519PrivateKey.generate()


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path)


# Layering ---------------------------------------------------------------------------------------------------


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_profiles_and_the_plugins_ledger_and_report_load_without_cryptography():
    code = (
        "import sys, h3gate.evidence.profiles, pytest_h3.ledger, pytest_h3.session_evidence; "
        "assert 'cryptography' not in sys.modules, sorted(m for m in sys.modules if m.startswith('h3gate'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_only_signing_imports_cryptography_and_imports_run_one_way():
    importers = sorted(
        path.relative_to(ROOT).as_posix()
        for folder in ("src", "pytest_h3", "kernels")
        for path in (ROOT / folder).rglob("*.py")
        if any(name.split(".")[0] == "cryptography" for name in _imported_modules(path))
    )
    assert importers == ["src/h3gate/evidence/signing.py"]
    package = ROOT / "src" / "h3gate" / "evidence"
    assert not {"h3gate.evidence.signing", "h3gate.evidence.statement"} & _imported_modules(package / "profiles.py")
    assert not {"h3gate.evidence.profiles", "h3gate.evidence.statement"} & _imported_modules(package / "signing.py")


# DSSE ------------------------------------------------------------------------------------------------------


def test_pae_matches_the_dsse_spec_example():
    assert (
        signing.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_pae_counts_bytes_not_characters():
    assert signing.pae("t", "é".encode()) == b"DSSEv1 1 t 2 " + "é".encode()


def test_signed_round_trip(run, key):
    path = run.write(run.root, key=key)
    envelope = json.loads(path.read_text())
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    raw_public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    (signature,) = envelope["signatures"]
    assert signature["keyid"] == sha256_bytes(raw_public)
    payload = base64.b64decode(envelope["payload"])
    # Checked with cryptography directly, over PAE built by hand: what any DSSE verifier does.
    pae = b"DSSEv1 28 application/vnd.in-toto+json %d " % len(payload) + payload
    key.public_key().verify(base64.b64decode(signature["sig"]), pae)

    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    names = [s["name"] for s in statement["subject"]]
    assert names == sorted(names) and len(names) == len(ITEMS)
    for subject in statement["subject"]:
        assert subject["digest"]["sha256"] == sha256_file(run.root / subject["name"])
    predicate = statement["predicate"]
    assert predicate["result"] == "PASSED"
    assert predicate["passedTests"] == sorted(ITEMS) and predicate["failedTests"] == predicate["warnedTests"] == []
    locked = json.loads((run.thresholds / "LOCK.json").read_text())["files"]
    roles = {d["name"]: d for d in predicate["configuration"]}
    assert roles["tiny/cpu/model-bounds.json"]["digest"]["sha256"] == locked["tiny/cpu/model-bounds.json"]
    assert roles["tiny/model-contract.json"]["annotations"]["role"] == "contract"
    assert roles["model:tiny"]["digest"]["sha256"] == MODEL["identity"]
    assert roles["candidate:h3_triton"]["annotations"]["identity"] == CANDIDATE
    h3 = predicate["h3"]
    assert h3["signer"] == signature["keyid"]
    assert h3["tests"]["tests/gates/test_model.py::test_model"]["result"]["checks"][0]["margin"] == pytest.approx(0.016)

    verified = verify(path, [key.public_key()], run.thresholds)
    assert verified.result == "PASSED" and verified.signature.startswith("verified")
    assert verified.artifacts == len(ITEMS)


def test_one_changed_byte_in_the_statement_breaks_the_signature(run, key):
    path = run.write(run.root, key=key)
    rewrite_payload(path, lambda payload: payload.replace(b'"candidate":1.0', b'"candidate":2.0', 1))
    assert json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))  # still a valid statement
    with pytest.raises(EvidenceError, match="does not verify") as error:
        verify(path, [key.public_key()])
    assert error.value.kind == "signature"


def test_signature_by_another_key_is_refused(run, key):
    path = run.write(run.root, key=key)
    with pytest.raises(EvidenceError, match="no signature by a trusted key") as error:
        verify(path, [Ed25519PrivateKey.generate().public_key()])
    assert error.value.kind == "signature"


def test_one_changed_byte_in_an_artifact_is_found(run, key):
    path = run.write(run.root, key=key)
    artifact = run.artifacts["tests/gates/test_model.py::test_model"]
    data = bytearray(artifact.read_bytes())
    data[0] ^= 1
    artifact.write_bytes(bytes(data))
    with pytest.raises(
        EvidenceError, match=f"artifact {artifact.relative_to(run.root).as_posix()} has sha256"
    ) as error:
        verify(path, [key.public_key()])
    assert error.value.kind == "digest"
    artifact.unlink()
    with pytest.raises(EvidenceError, match="model-2.bin: missing"):
        verify(path, [key.public_key()])


def test_one_changed_byte_in_a_bounds_file_fails_the_lock(run, key):
    path = run.write(run.root, key=key)
    bounds = run.files[0]
    bounds.write_bytes(bounds.read_bytes().replace(b"e-", b"E-", 1))
    with pytest.raises(EvidenceError, match="does not match its digest") as error:
        verify(path, [key.public_key()], run.thresholds)
    assert error.value.kind == "lock"
    # Re-locked by hand: the lock verifies, but no longer holds what the evidence was measured against.
    lock_files(run.thresholds, [bounds])
    with pytest.raises(EvidenceError, match="bounds tiny/cpu/model-bounds.json: sha256 .* in the evidence") as error:
        verify(path, [key.public_key()], run.thresholds)
    assert error.value.kind == "lock"


def test_unsigned_evidence_is_reported_unsigned(run, key):
    path = run.write(run.root)
    envelope = json.loads(path.read_text())
    assert envelope["signatures"] == []
    assert statement_of(path)["predicate"]["h3"]["signer"] is None
    verified = verify(path)
    assert verified.signature.startswith("UNSIGNED") and not verified.trusted
    with pytest.raises(EvidenceError, match="unsigned") as error:
        verify(path, [key.public_key()])
    assert error.value.kind == "unsigned"


def test_a_stripped_signature_is_malformed_not_unsigned(run, key):
    path = run.write(run.root, key=key)
    envelope = json.loads(path.read_text())
    envelope["signatures"] = []
    path.write_text(json.dumps(envelope))
    with pytest.raises(EvidenceError, match="names signer") as error:
        verify(path)
    assert error.value.kind == "malformed"


def test_signed_evidence_without_a_key_says_its_signature_was_not_checked(run, key):
    assert verify(run.write(run.root, key=key)).signature.startswith("NOT CHECKED")


def test_an_edited_verdict_in_unsigned_evidence_is_malformed(tmp_path):
    run = make_run(tmp_path, failing=("tests/gates/test_model.py::test_model",))
    path = run.write(tmp_path)

    def pass_it(payload: bytes) -> bytes:
        statement = json.loads(payload)
        statement["predicate"].update(result="PASSED", failedTests=[])
        return json.dumps(statement).encode()

    rewrite_payload(path, pass_it)
    reseal_sums(path)
    with pytest.raises(EvidenceError, match="predicate.result does not follow") as error:
        verify(path)
    assert error.value.kind == "malformed"


@pytest.mark.parametrize("garbage", [b"not json", b'{"payloadType": "text/plain", "payload": "", "signatures": []}'])
def test_garbage_is_malformed(tmp_path, garbage):
    path = tmp_path / "evidence.json"
    path.write_bytes(garbage)
    with pytest.raises(EvidenceError) as error:
        verify(path)
    assert error.value.kind == "malformed"


# Verdict and completeness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["skipped", "deselected", "error"])
def test_a_required_gate_without_a_verdict_gives_incomplete(tmp_path, state):
    nodeid = "tests/gates/test_generation.py::test_generation[seed43]"
    run = make_run(tmp_path, outcome={nodeid: state})
    path = run.write(tmp_path)
    predicate = statement_of(path)["predicate"]
    assert (predicate["result"], predicate["h3"]["verdict"]) == ("FAILED", "INCOMPLETE")  # a gap never reads passed
    assert nodeid not in predicate["passedTests"]
    assert (nodeid in predicate["failedTests"]) == (state == "error")  # the predicate lists crashed items as failed
    problems = predicate["h3"]["completeness"]["problems"]
    assert len(problems) == 1 and nodeid in problems[0]
    with pytest.raises(EvidenceError, match="incomplete for profile release") as error:
        verify(path)
    assert error.value.kind == "incomplete"


def test_a_required_gate_that_never_ran_gives_incomplete(run):
    predicate = statement_of(run.write(run.root, nodeids=list(ITEMS)[:-1]))["predicate"]
    assert (predicate["result"], predicate["h3"]["verdict"]) == ("FAILED", "INCOMPLETE")
    assert predicate["h3"]["completeness"]["problems"] == [
        "generation[seed=44]: no test item of this gate ran (not collected or not recorded)"
    ]


def test_a_skipped_gate_the_profile_does_not_require_leaves_ci_passed(tmp_path):
    run = make_run(tmp_path, outcome={"tests/gates/test_kernel.py::test_kernel": "skipped"})
    path = run.write(tmp_path, required=MODEL_ONLY)
    assert statement_of(path)["predicate"]["result"] == "PASSED"
    with pytest.raises(
        EvidenceError, match="profile release: kernel: tests/gates/test_kernel.py::test_kernel was skipped"
    ):
        verify(path, required=profiles.PROFILES["release"])


def test_a_checkpoint_whose_kernels_another_run_qualified_passes_the_checkpoint_profile(tmp_path):
    """Block, model and generation gates on a checkpoint, without its kernel gate: PASSED for the checkpoint profile,
    INCOMPLETE for release, which needs the kernel gate too."""
    kernel = "tests/gates/test_kernel.py::test_kernel"
    run = make_run(tmp_path)
    path = run.write(tmp_path, nodeids=[n for n in ITEMS if n != kernel], required=profiles.PROFILES["checkpoint"])
    assert verify(path).result == "PASSED"
    with pytest.raises(EvidenceError, match="incomplete for profile release: kernel: no test item"):
        verify(path, required=profiles.PROFILES["release"])
    missing_seed = [n for n in ITEMS if n != kernel and not n.endswith("[seed44]")]
    with pytest.raises(EvidenceError, match="incomplete for profile checkpoint: generation.seed=44."):
        verify(run.write(tmp_path / "short", nodeids=missing_seed, required=profiles.PROFILES["checkpoint"]))


def test_a_crash_of_any_gate_item_is_incomplete_even_when_not_required(tmp_path):
    run = make_run(tmp_path, outcome={"tests/gates/test_kernel.py::test_kernel": "error"})
    predicate = statement_of(run.write(tmp_path, required=MODEL_ONLY))["predicate"]
    assert (predicate["result"], predicate["h3"]["verdict"]) == ("FAILED", "INCOMPLETE")
    assert predicate["failedTests"] == ["tests/gates/test_kernel.py::test_kernel"]


def test_a_failed_gate_gives_failed(tmp_path):
    nodeid = "tests/gates/test_model.py::test_model"
    run = make_run(tmp_path, failing=(nodeid,))
    path = run.write(tmp_path)
    predicate = statement_of(path)["predicate"]
    assert predicate["result"] == "FAILED" and predicate["failedTests"] == [nodeid]
    with pytest.raises(EvidenceError, match=f"1 gate test\\(s\\) failed: {nodeid}") as error:
        verify(path)
    assert error.value.kind == "failed"


def test_non_discriminating_bounds_are_warned_and_still_pass(run):
    nodeid = "tests/gates/test_model.py::test_model"
    run.results[nodeid]["context"]["non_discriminating"] = ["nodes.proj_out.grad"]
    predicate = statement_of(run.write(run.root))["predicate"]
    assert predicate["warnedTests"] == [nodeid] and nodeid not in predicate["passedTests"]
    assert predicate["result"] == "PASSED"


def test_a_result_without_an_outcome_is_refused(run):
    run.outcomes.pop("tests/gates/test_model.py::test_model")
    with pytest.raises(ValueError, match="test_model has a gate result but no outcome"):
        run.write(run.root, nodeids=list(run.results))


def test_the_ci_profile_requires_every_gate_the_tiny_suite_runs():
    kinds = set()
    for path in (ROOT / "tests" / "gates").glob("test_*.py"):
        kinds |= set(re.findall(r"h3_gate\(\s*[\"'](\w+)[\"']", path.read_text()))
    assert kinds and {r.gate for r in profiles.PROFILES["ci"].requirements} == kinds


def test_unknown_profile_names_the_profiles():
    with pytest.raises(ValueError, match="profiles: checkpoint, ci, model-block, release"):
        profiles.profile("nightly")


# Redaction, sums, JSON safety ------------------------------------------------------------------------------


def test_home_host_and_user_are_redacted_and_only_their_fields_listed(run):
    nodeid = "tests/gates/test_model.py::test_model"
    run.results[nodeid]["checks"][0]["name"] = "nodes.alice_proj"  # not a path component: left alone
    path = run.write(run.root)
    text = base64.b64decode(json.loads(path.read_text())["payload"]).decode()
    assert HOME not in text and "gpu-node-17" not in text and "/alice/" not in text
    statement = json.loads(text)
    h3 = statement["predicate"]["h3"]
    (environment,) = h3["environments"].values()
    assert (environment["hostname"], environment["user"], environment["home"]) == ("<host>", "<user>", "~")
    result = h3["tests"][nodeid]["result"]
    assert result["context"]["bounds_file"] == "~/h3/thresholds/tiny/cpu/model-bounds.json"
    assert result["checks"][0]["name"] == "nodes.alice_proj"
    index, model = next(
        (i, d) for i, d in enumerate(statement["predicate"]["configuration"]) if d["name"] == "model:tiny"
    )
    assert model["annotations"]["source"] == "/scratch/<user>/checkpoints/h3"

    redaction = json.loads((run.root / "redaction.json").read_text())
    assert redaction["fields"] == h3["redacted"]
    key = next(iter(h3["environments"]))
    pointer = "/predicate/h3/tests/" + nodeid.replace("/", "~1") + "/result/context/bounds_file"
    assert redaction["fields"][pointer] == ["home"]
    assert redaction["fields"][f"/predicate/h3/environments/{key}/hostname"] == ["host"]
    assert redaction["fields"][f"/predicate/configuration/{index}/annotations/source"] == ["user"]
    raw = (run.root / "redaction.json").read_text()
    assert "alice" not in raw and "gpu-node" not in raw


def test_sha256sums_is_coreutils_format_and_checks_out(run):
    run.write(run.root)
    lines = (run.root / "SHA256SUMS").read_text().splitlines()
    names = [line.split("  ", 1)[1] for line in lines]
    assert names == sorted(names) and {"evidence.json", "redaction.json"} <= set(names)
    assert len(names) == len(ITEMS) + 2
    if shutil.which("sha256sum"):
        checked = subprocess.run(
            ["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=run.root, capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_non_finite_metrics_become_strict_json(run):
    nodeid = "tests/gates/test_model.py::test_model"
    run.results[nodeid]["metrics"] = {"relative_l2": float("inf"), "max_abs": float("nan")}
    payload = base64.b64decode(json.loads(run.write(run.root).read_text())["payload"])

    def refuse(constant):
        raise AssertionError(f"non-standard JSON constant {constant}")

    statement = json.loads(payload, parse_constant=refuse)
    assert statement["predicate"]["h3"]["tests"][nodeid]["result"]["metrics"] == {
        "relative_l2": "Infinity",
        "max_abs": "NaN",
    }


# Keys -------------------------------------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path, monkeypatch):
    private, public = signing.keygen(tmp_path)
    assert private.stat().st_mode & 0o777 == 0o600
    key = signing.load_private_key(private)
    assert signing.keyid(key.public_key()) == signing.keyid(signing.load_public_key(public))
    with pytest.raises(FileExistsError, match="never overwritten"):
        signing.keygen(tmp_path)
    monkeypatch.setenv(signing.KEY_ENV, private.read_text())
    assert signing.keyid(signing.load_private_key().public_key()) == signing.keyid(key.public_key())
    monkeypatch.setenv(signing.KEY_ENV, str(private))
    with pytest.raises(signing.SigningKeyError, match="PEM text .* not a path"):
        signing.load_private_key()
    monkeypatch.delenv(signing.KEY_ENV)
    assert signing.load_private_key() is None


def test_a_key_of_another_algorithm_is_refused(tmp_path):
    rsa = generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "rsa.pem"
    path.write_bytes(
        rsa.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(signing.SigningKeyError, match="signed with Ed25519; create one with `h3gate keygen DIR`"):
        signing.load_private_key(path)


# Merging ----------------------------------------------------------------------------------------------------



def test_merged_shards_equal_the_single_run(tmp_path, key):
    single = make_run(tmp_path / "single")
    sharded = make_run(tmp_path / "sharded", timing=7.0)
    expected = statement_of(single.write(single.root, key=key))
    shards = [sharded.write(sharded.root / f"shard-{i}", nodeids=half, key=key) for i, half in enumerate(HALVES)]
    for shard in shards:
        assert statement_of(shard)["predicate"]["h3"]["verdict"] == "INCOMPLETE"  # each half alone lacks gates
    merged = merge(shards, sharded.root, key)
    statement = statement_of(merged)
    assert statement != expected  # the timings differ ...
    assert without_timings(statement) == without_timings(expected)  # ... and nothing else
    assert verify(merged, [key.public_key()], sharded.thresholds).result == "PASSED"
    assert (sharded.root / "redaction.json").read_text() == (single.root / "redaction.json").read_text()


def test_merge_rebases_artifact_names_onto_the_output_folder(tmp_path):
    shards = []
    for i, half in enumerate(HALVES):
        run = make_run(tmp_path / f"task-{i}")
        shards.append(run.write(run.root, nodeids=half))
    merged = merge(shards, tmp_path)
    names = [s["name"] for s in statement_of(merged)["subject"]]
    assert names and all(name.startswith(("task-0/artifacts/", "task-1/artifacts/")) for name in names)
    assert verify(merged).signature.startswith("UNSIGNED")
    with pytest.raises(ValueError, match="outside the merge folder: merge into a folder that holds every shard"):
        merge(shards, tmp_path / "merged")


@pytest.mark.parametrize(
    "identity, difference",
    [
        ({"model": {**MODEL, "identity": "00" * 32}}, "model model:tiny: sha256 0000"),
        ({"candidate": {**CANDIDATE, "source_sha256": "11" * 32}}, "candidate candidate:h3_triton: sha256"),
    ],
)
def test_merge_refuses_shards_of_another_model_or_candidate(run, identity, difference):
    first = run.write(run.root / "a", nodeids=HALVES[0])
    second = run.write(run.root / "b", nodeids=HALVES[1], **identity)
    with pytest.raises(EvidenceError, match=difference) as error:
        merge([first, second], run.root)
    assert error.value.kind == "conflict"


@pytest.mark.parametrize("which", [0, 1], ids=["bounds", "contract"])
def test_merge_refuses_shards_of_other_bounds_or_contracts(run, which):
    first = run.write(run.root / "a", nodeids=HALVES[0])
    edited = run.files[which]
    edited.write_text(edited.read_text().replace("\n}", ',\n "edited": 1\n}'))
    second = run.write(run.root / "b", nodeids=HALVES[1])
    role = ("bounds tiny/cpu/model-bounds.json", "contract tiny/model-contract.json")[which]
    with pytest.raises(EvidenceError, match=f"{role}: sha256"):
        merge([first, second], run.root)


def test_merge_refuses_a_test_in_two_shards(run):
    first = run.write(run.root / "a", nodeids=HALVES[0])
    second = run.write(run.root / "b", nodeids=HALVES[0][:1] + HALVES[1])
    with pytest.raises(EvidenceError, match=f"test {HALVES[0][0]} is in both"):
        merge([first, second], run.root)


def test_merge_refuses_another_profile(run):
    first = run.write(run.root / "a", nodeids=HALVES[0])
    second = run.write(run.root / "b", nodeids=HALVES[1], required=MODEL_ONLY)
    with pytest.raises(EvidenceError, match="profile model-only in .*, release in"):
        merge([first, second], run.root)


def test_a_signing_merge_refuses_unsigned_or_foreign_shards(run, key):
    signed = run.write(run.root / "a", nodeids=HALVES[0], key=key)
    unsigned = run.write(run.root / "b", nodeids=HALVES[1])
    with pytest.raises(EvidenceError) as error:
        merge([signed, unsigned], run.root, key)
    assert error.value.kind == "unsigned"
    foreign = run.write(run.root / "c", nodeids=HALVES[1], key=Ed25519PrivateKey.generate())
    with pytest.raises(EvidenceError) as error:
        merge([signed, foreign], run.root, key)
    assert error.value.kind == "signature"


# Accumulating the sessions of one folder -------------------------------------------------------------------


def session(run, nodeids, **identity) -> dict:
    """The statement a session of ``nodeids`` builds in the run's folder, its artifacts in place."""
    return build_statement(
        {n: run.results[n] for n in nodeids if n in run.results}, {n: run.outcomes[n] for n in nodeids},
        profiles.PROFILES["release"], [run.artifacts[n] for n in nodeids if n in run.artifacts], run.root,
        run.thresholds, run.files, identity.get("model", MODEL), identity.get("candidate", CANDIDATE), ENVIRONMENT)


def test_sessions_into_one_folder_join_as_one_session_of_every_item(run, key):
    single = session(run, list(ITEMS))
    add_session(run.root, session(run, HALVES[0]), key, run.thresholds)
    path, joined = add_session(run.root, session(run, HALVES[1]), key, run.thresholds)
    assert without_timings(joined) == without_timings(single), "redacted fields included, indexed as one session's"
    assert verify(path, [key.public_key()], run.thresholds).result == "PASSED"


def test_an_item_run_again_joins_with_the_artifact_its_session_wrote(run, key):
    """A rerun on another machine or CPU kind writes other bytes into its item's artifact (an error table of other
    numerics): the earlier evidence no longer digests that file, but the joined evidence holds the session's digest
    of it, and the earlier files the session left alone are still checked."""
    add_session(run.root, session(run, list(ITEMS)), key, run.thresholds)
    rerun, kept = HALVES[0][0], HALVES[1][0]
    run.artifacts[rerun].write_bytes(b"another CPU's numbers")
    path, joined = add_session(run.root, session(run, [rerun]), key, run.thresholds)
    assert verify(path, [key.public_key()], run.thresholds).result == "PASSED"
    good = path.read_bytes()
    run.artifacts[kept].write_bytes(b"edited since")
    with pytest.raises(EvidenceError, match="no longer matches its files"):
        add_session(run.root, session(run, [rerun]), key, run.thresholds)
    assert path.read_bytes() == good


def test_a_session_without_a_verdict_on_an_item_keeps_the_earlier_verdict(tmp_path, key):
    model = "tests/gates/test_model.py::test_model"
    good = make_run(tmp_path)
    add_session(tmp_path, session(good, list(ITEMS)), key, good.thresholds)
    crashed = make_run(tmp_path, outcome={model: "error"})
    _, joined = add_session(tmp_path, session(crashed, [model]), key, crashed.thresholds)
    assert joined["predicate"]["h3"]["tests"][model]["outcome"] == "passed"
    assert joined["predicate"]["h3"]["verdict"] == "PASSED"
    failed = make_run(tmp_path, failing=(model,))
    path, joined = add_session(tmp_path, session(failed, [model]), key, failed.thresholds)
    assert joined["predicate"]["h3"]["tests"][model]["outcome"] == "failed", "a verdict is a finding: the newest wins"
    with pytest.raises(EvidenceError, match=f"1 gate test\\(s\\) failed: {model}"):
        verify(path, [key.public_key()])


def test_a_lost_worker_of_an_earlier_session_does_not_carry_over(tmp_path, key):
    """A crashed xdist worker leaves an entry of its session (its item is recorded besides): the next session's
    evidence is not incomplete for ever because of it."""
    crashed = make_run(tmp_path)
    crashed.outcomes["<xdist worker gw0>"] = profiles.Outcome("error", profiles.SESSION_WIDE, {"worker": "gw0"})
    _, joined = add_session(tmp_path, session(crashed, list(crashed.outcomes)), key, crashed.thresholds)
    assert joined["predicate"]["h3"]["verdict"] == "INCOMPLETE"
    path, joined = add_session(tmp_path, session(make_run(tmp_path), []), key, crashed.thresholds)
    assert "<xdist worker gw0>" not in joined["predicate"]["h3"]["tests"]
    assert verify(path, [key.public_key()]).result == "PASSED"


def test_a_session_that_cannot_join_leaves_the_folders_evidence_as_it_was(run, key):
    path, _ = add_session(run.root, session(run, HALVES[0]), key, run.thresholds)
    good = path.read_bytes()
    other = {**CANDIDATE, "source_sha256": "11" * 32}
    for statement, signer, message in [
        (session(run, HALVES[1]), None, "is signed .* and this session has no key"),
        (session(run, HALVES[1]), Ed25519PrivateKey.generate(), "no signature by a trusted key|signed by"),
        (session(run, HALVES[1], candidate=other), key, "candidate candidate:h3_triton: sha256"),
    ]:
        with pytest.raises(EvidenceError, match=message):
            add_session(run.root, statement, signer, run.thresholds)
        assert path.read_bytes() == good
    run.artifacts[HALVES[0][0]].write_bytes(b"changed since")
    with pytest.raises(EvidenceError, match="no longer matches its files"):
        add_session(run.root, session(run, HALVES[1]), key, run.thresholds)
    assert path.read_bytes() == good


# Environment ------------------------------------------------------------------------------------------------


def test_environment_names_host_user_home_and_versions():
    facts = environment.collect()
    assert facts["hostname"] == socket.gethostname() and facts["home"] == str(Path.home())
    assert facts["torch"] == torch.__version__ and facts["python"] == platform.python_version()
    assert facts["diffusers"].startswith("0.42")


@pytest.mark.parametrize(
    "line",
    [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16)",
    ],
)
def test_driver_version_from_the_kernel_module(tmp_path, monkeypatch, line):
    (tmp_path / "version").write_text(line + "\nGCC version:  gcc version 12.2.0\n")
    monkeypatch.setattr(environment, "DRIVER_FILE", tmp_path / "version")
    assert environment.driver_version() == "550.54.15"
    monkeypatch.setattr(environment, "DRIVER_FILE", tmp_path / "absent")
    assert environment.driver_version() is None


def test_gpus_with_names_and_pci_bus_ids(monkeypatch):
    props = SimpleNamespace(
        name="NVIDIA H200", pci_domain_id=0, pci_bus_id=0x3B, pci_device_id=0, uuid="GPU-1234",
        total_memory=150 << 30, major=9, minor=0,
    )  # fmt: skip
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert environment.gpus() == [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "pci_bus_id": "00000000:3B:00.0",
            "uuid": "GPU-1234",
            "memory_bytes": 150 << 30,
            "compute_capability": "9.0",
        }
    ]
