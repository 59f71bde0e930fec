"""What a reviewer relies on beyond the signature: built-in profiles, the candidate lock, evidence consistent with
itself, regular files only, whole keyrings, every signature tried, and signing only what verifies here."""

import base64
import json
import os
import re

import pytest

from evidence_runs import CANDIDATE, edit_statement, make_run, reseal_sums, run_cli, statement_of
from h3gate.cli.evidence import EXIT_CODES
from h3gate.evidence import candidate_lock, profiles, signing
from h3gate.evidence.statement import candidate_digest, subjects, tool, write_sealed
from h3gate.files import FileFormatError

CI_WITHOUT_POWER = profiles.Profile("ci", tuple(r for r in profiles.PROFILES["ci"].requirements if r.gate != "power"))


@pytest.fixture
def keys(tmp_path):
    private, public = signing.keygen(tmp_path / "keys")
    return signing.load_private_key(private), public


def one_line(code_and_text, code):
    found, printed = code_and_text
    assert found == code and printed.count("\n") == 1 and "Traceback" not in printed, printed
    return printed


# 2. a built-in profile name means its built-in requirements --------------------------------------------------------


def test_a_built_in_profile_name_means_its_built_in_requirements(tmp_path, keys):
    """The power gate dropped from both the tests and the recorded ci profile, signed by the real key."""
    key, public = keys
    path = make_run(tmp_path).write(tmp_path, key=key, required=CI_WITHOUT_POWER)
    assert statement_of(path)["predicate"]["h3"]["verdict"] == "PASSED"
    printed = one_line(run_cli("verify", path, "--key", public), EXIT_CODES["incomplete"])
    assert "incomplete for profile ci: power: no test item of this gate ran" in printed
    release = make_run(tmp_path / "release").write(tmp_path / "release", key=key)
    assert "PASSED (profile release, built-in)" in one_line(run_cli("verify", release, "--key", public), 0)
    custom = make_run(tmp_path / "custom")
    path = custom.write(custom.root, key=key, required=profiles.Profile("model-only", (profiles.Requirement("model"),)))
    assert "PASSED (profile model-only, as recorded)" in one_line(run_cli("verify", path, "--key", public), 0)


# 3. the candidate lock ---------------------------------------------------------------------------------------------


def test_the_candidate_lock_binds_identity_and_tool(tmp_path, keys):
    key, public = keys
    run = make_run(tmp_path / "run")
    path = run.write(run.root, key=key)
    lock = tmp_path / "candidate.lock"
    candidate_lock.write(lock, CANDIDATE)
    line = one_line(run_cli("verify", path, "--key", public, "--expect-candidate-lock", lock), 0)
    digest = candidate_digest(CANDIDATE)
    assert f"candidate h3_triton {digest[:16]}" in line and re.search(r"h3gate \S+ source [0-9a-f]{16}", line)
    candidate_lock.write(lock, {**CANDIDATE, "provider_groups": ["attention"]})  # an op group swapped back
    printed = one_line(run_cli("verify", path, "--key", public, "--expect-candidate-lock", lock), EXIT_CODES["mismatch"])
    assert "provider_groups differ" in printed
    candidate_lock.write(lock, {**CANDIDATE, "source_sha256": "00" * 32})  # an edited h3_triton
    assert "source_sha256 differ" in one_line(run_cli("verify", path, "--key", public, "--expect-candidate-lock", lock), 12)
    record = json.loads(candidate_lock.write(lock, CANDIDATE).path.read_text())
    record["tool"]["source_sha256"] = "11" * 32
    lock.write_text(json.dumps(record))
    assert "expects h3gate" in one_line(run_cli("verify", path, "--key", public, "--expect-candidate-lock", lock), 12)
    lock.write_text("{}")
    assert "not a candidate lock" in one_line(run_cli("verify", path, "--key", public, "--expect-candidate-lock", lock), 2)


def test_identity_writes_the_lock_of_a_candidate(tmp_path):
    code, printed = run_cli("identity", "--candidate", "provider", "--lock", tmp_path / "provider.lock")
    assert code == 0, printed
    lock = candidate_lock.read(tmp_path / "provider.lock")
    assert f"provider {candidate_digest(lock.identity)}" in printed and lock.tool == tool()
    assert "--candidate SPEC" in one_line(run_cli("identity", "--lock", tmp_path / "x.lock"), 2)


# 4. evidence inconsistent with itself fails in every mode ------------------------------------------------------------


def _rename_candidate(statement):
    entry = next(e for e in statement["predicate"]["configuration"] if e["annotations"]["role"] == "candidate")
    entry["annotations"]["identity"]["name"] = "provider"


def _other_digest(statement):
    entry = next(e for e in statement["predicate"]["configuration"] if e["annotations"]["role"] == "candidate")
    entry["digest"]["sha256"] = "ee" * 32


@pytest.mark.parametrize("edit, says", [
    (_rename_candidate, "named 'candidate:h3_triton' but its identity names 'provider'"),
    (_other_digest, "the candidate's digest is not the sha256 of its recorded identity"),
])
def test_a_candidate_entry_inconsistent_with_its_identity_is_malformed_in_every_mode(tmp_path, keys, edit, says):
    key, public = keys
    run = make_run(tmp_path)
    path = run.write(tmp_path, key=key)
    statement = statement_of(path)
    edit(statement)
    write_sealed(tmp_path, statement, key)  # re-signed by the real key
    for trust in (["--key", public], ["--allow-unsigned"]):
        assert says in one_line(run_cli("verify", path, *trust, "--thresholds", run.thresholds), EXIT_CODES["malformed"])


# 5. names, file kinds, keyrings, signatures ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("a" * 256 + ".bin", "too long for a file system"),
    ("/".join(["d" * 200] * 21), "too long for a file system"),
    ("a\u2028b.bin", "control character U+2028"),
    ("a\u2029b.bin", "control character U+2029"),
    ("a\x85b.bin", "control character U+0085"),
])
def test_a_subject_name_the_file_system_or_sha256sums_cannot_hold_is_malformed(tmp_path, name, says):
    path = make_run(tmp_path).write(tmp_path)
    edit_statement(path, lambda statement: statement["subject"][0].update(name=name))
    assert says in one_line(run_cli("verify", path, "--allow-unsigned"), EXIT_CODES["malformed"])


def test_the_writer_refuses_a_name_sha256sums_would_split(tmp_path):
    artifact = tmp_path / "a\u2028b.bin"
    artifact.write_bytes(b"x")
    with pytest.raises(FileFormatError, match="control character U\\+2028"):
        subjects([artifact], tmp_path)


def _special(path, kind):
    path.unlink(missing_ok=True)
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "dangling":
        path.symlink_to("nowhere")


KINDS = ["dev-zero", "fifo", "folder", "loop", "dangling", "absent"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which, code", [
    ("evidence.json", "malformed"), ("SHA256SUMS", "digest"), ("redaction.json", "digest"), ("artifact", "digest"),
])
def test_only_regular_files_are_read(tmp_path, which, code, kind):
    run = make_run(tmp_path)
    path = run.write(tmp_path)
    target = run.artifacts[next(iter(run.artifacts))] if which == "artifact" else tmp_path / which
    _special(target, kind)
    evidence_arg = path if which != "evidence.json" or kind != "folder" else tmp_path / "evidence.json"
    found, printed = run_cli("verify", evidence_arg, "--allow-unsigned")
    expected = 2 if which == "evidence.json" and kind in ("absent", "dangling", "loop") else EXIT_CODES[code]
    assert found == expected and printed.count("\n") == 1, printed


def test_a_keyring_with_a_truncated_block_after_a_good_one_is_refused(tmp_path, keys):
    key, public = keys
    path = make_run(tmp_path).write(tmp_path, key=key)
    pem = public.read_text()
    keyring = tmp_path / "keyring.pem"
    keyring.write_text(pem + pem[: len(pem) // 2])
    assert "not a whole public key" in one_line(run_cli("verify", path, "--keyring", keyring), 2)
    keyring.write_text(pem + pem)
    assert one_line(run_cli("verify", path, "--keyring", keyring), 0)


@pytest.mark.parametrize("garbage", ["AAAA", "not base64!"])
def test_every_signature_by_a_trusted_keyid_is_tried(tmp_path, keys, garbage):
    key, public = keys
    path = make_run(tmp_path).write(tmp_path, key=key)
    envelope = json.loads(path.read_text())
    envelope["signatures"].insert(0, {"keyid": envelope["signatures"][0]["keyid"], "sig": garbage})
    path.write_text(json.dumps(envelope))
    reseal_sums(path)
    assert one_line(run_cli("verify", path, "--key", public), 0)
    envelope["signatures"] = envelope["signatures"][:1]
    path.write_text(json.dumps(envelope))
    reseal_sums(path)
    assert "does not verify" in one_line(run_cli("verify", path, "--key", public), EXIT_CODES["signature"])


# 1. signing what verifies here -----------------------------------------------------------------------------------


def test_sign_signs_only_unsigned_evidence_that_verifies_here(tmp_path, keys, monkeypatch):
    key, public = keys
    private = tmp_path / "keys" / signing.PRIVATE_KEY_NAME
    run = make_run(tmp_path / "run")
    path = run.write(run.root)
    checks = ("--thresholds", run.thresholds, "--profile", "release", "--expect-candidate", "h3_triton")
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    assert "no signing key" in one_line(run_cli("sign", path, *checks), 2)
    bounds = run.files[0]
    original = bounds.read_bytes()
    bounds.write_bytes(original.replace(b"e-", b"E-", 1))
    assert one_line(run_cli("sign", path, "--key", private, *checks), EXIT_CODES["lock"])
    bounds.write_bytes(original)
    assert one_line(run_cli("sign", path, "--key", private, *checks, "--profile", "ci"), EXIT_CODES["incomplete"])
    assert json.loads(path.read_text())["signatures"] == []  # nothing was signed
    monkeypatch.setenv(signing.KEY_ENV, private.read_text())
    assert "signed" in one_line(run_cli("sign", path, *checks), 0)
    assert "signature: verified" in one_line(run_cli("verify", path, "--key", public, *checks), 0)
    assert "signed already" in one_line(run_cli("sign", path, *checks), 2)


def test_sign_refuses_evidence_another_h3gate_wrote(tmp_path, keys):
    run = make_run(tmp_path / "run")
    path = run.write(run.root)
    edit_statement(path, lambda statement: statement["predicate"]["h3"]["tool"].update(source_sha256="22" * 32))
    printed = one_line(run_cli("sign", path, "--key", tmp_path / "keys" / signing.PRIVATE_KEY_NAME, "--thresholds",
                               run.thresholds, "--profile", "release"), EXIT_CODES["mismatch"])
    assert "the key vouches only for runs this h3gate judged" in printed
    assert base64.b64decode(json.loads(path.read_text())["payload"])  # left as it was: unsigned
    assert json.loads(path.read_text())["signatures"] == []
