"""The evidence commands of ``h3gate``: keygen, verify (one exit code per failure kind), report, merge."""

import json
import re
import subprocess
import sys

import pytest

from evidence_runs import HALVES, ITEMS, MODEL_ONLY, make_run, reseal_sums, rewrite_payload
from h3gate.cli import main
from h3gate.cli.evidence import EXIT_CODES
from h3gate.evidence import signing

MODEL_TEST = "tests/gates/test_model.py::test_model"


@pytest.fixture
def keys(tmp_path):
    assert main(["keygen", str(tmp_path / "keys")]) == 0
    return tmp_path / "keys" / signing.PRIVATE_KEY_NAME, tmp_path / "keys" / signing.PUBLIC_KEY_NAME


@pytest.fixture
def signed(tmp_path, keys):
    run = make_run(tmp_path / "run")
    return run, run.write(run.root, key=signing.load_private_key(keys[0]))


def verify(capsys, *args) -> tuple[int, str, str]:
    code = main(["verify", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_codes_are_distinct_and_documented(capsys):
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    help_text = capsys.readouterr().out
    for code in (0, 2, *EXIT_CODES.values()):
        if code != 10:  # merge only
            assert f"\n  {code} " in help_text


def test_keygen_refuses_to_overwrite(tmp_path, keys, capsys):
    assert main(["keygen", str(keys[0].parent)]) == 2
    assert "never overwritten" in capsys.readouterr().err


def test_verify_passes_signed_evidence(signed, keys, capsys):
    run, path = signed
    code, out, err = verify(capsys, path, "--key", keys[1], "--thresholds", run.thresholds)
    assert code == 0, err
    assert re.match(rf"PASSED \(profile release, built-in\); candidate h3_triton [0-9a-f]{{16}}; model tiny {'ab' * 8}; "
                    r"h3gate \S+ source [0-9a-f]{16}; signature: verified", out), out
    assert "6 artifacts match" in out


def test_verify_makes_a_trust_decision(tmp_path, keys, capsys):
    """Without a trusted key nothing exits 0: no decision is a usage error, --allow-unsigned never passes."""
    run = make_run(tmp_path)
    path = run.write(tmp_path)
    code, out, err = verify(capsys, path)
    assert code == 2 and "no trust decision: pass --key PUB or --keyring FILE" in err and out == ""
    code, out, err = verify(capsys, path, "--allow-unsigned")
    assert code == 11 and out == "" and err.count("\n") == 1
    assert err.startswith("h3gate verify: untrusted: PASSED") and "signature: UNSIGNED" in err
    code, _, err = verify(capsys, path, "--key", keys[1])
    assert code == 4 and err.startswith("h3gate verify: unsigned:")


def test_verify_with_a_keyring(tmp_path, keys, capsys):
    run = make_run(tmp_path / "run")
    path = run.write(run.root, key=signing.load_private_key(keys[0]))
    assert main(["keygen", str(tmp_path / "other")]) == 0
    other = tmp_path / "other" / signing.PUBLIC_KEY_NAME
    keyring = tmp_path / "trusted.pem"
    keyring.write_bytes(other.read_bytes() + keys[1].read_bytes())
    capsys.readouterr()
    code, out, err = verify(capsys, path, "--keyring", keyring)
    assert code == 0 and "signature: verified" in out, err
    code, _, err = verify(capsys, path, "--keyring", other)
    assert code == 3 and "no signature by a trusted key" in err
    code, _, err = verify(capsys, path, "--key", keyring)
    assert code == 2 and "holds 2 public keys; pass a file of several as --keyring" in err


def test_verify_binds_the_candidate_and_the_model(signed, keys, capsys):
    run, path = signed
    trust = ("--key", keys[1])
    assert verify(capsys, path, *trust, "--expect-candidate", "h3_triton", "--expect-model", "ab" * 32)[0] == 0
    code, _, err = verify(capsys, path, *trust, "--expect-candidate", "provider")
    assert code == 12 and "qualifies candidate 'h3_triton', not 'provider'" in err
    code, _, err = verify(capsys, path, *trust, "--expect-model", "cd" * 32)
    assert code == 12 and f"qualifies model model:tiny {'ab' * 32}, not identity {'cd' * 32}" in err
    code, _, err = verify(capsys, path, *trust, "--expect-model", "tiny")
    assert code == 2 and "is not a model identity (64 hex digits" in err


def tamper_statement(run, path):
    rewrite_payload(path, lambda payload: payload.replace(b'"candidate":1.0', b'"candidate":1.5', 1))


def tamper_artifact(run, path):
    artifact = run.artifacts[MODEL_TEST]
    artifact.write_bytes(artifact.read_bytes()[:-1] + b"!")


def tamper_bounds(run, path):
    bounds = run.files[0]
    bounds.write_bytes(bounds.read_bytes().replace(b"e-", b"E-", 1))


def tamper_envelope(run, path):
    path.write_text(path.read_text().replace('"payload": "', '"payload": "%', 1))


@pytest.mark.parametrize(
    "tamper, code, reason",
    [
        (tamper_statement, 3, "signature: .* does not verify"),
        (tamper_artifact, 5, "digest: artifact artifacts/model-2.bin has sha256"),
        (tamper_bounds, 6, "lock: .*model-bounds.json does not match its digest"),
        (tamper_envelope, 9, "malformed: .* not valid base64"),
    ],
    ids=["statement", "artifact", "bounds", "envelope"],
)
def test_verify_names_what_was_tampered_with(signed, keys, capsys, tamper, code, reason):
    run, path = signed
    tamper(run, path)
    found, out, err = verify(capsys, path, "--key", keys[1], "--thresholds", run.thresholds)
    assert found == code
    assert out == "" and err.count("\n") == 1
    assert re.search(reason, err), err


def test_verify_exit_codes_of_the_verdict(tmp_path, capsys):
    failed = make_run(tmp_path / "failed", failing=(MODEL_TEST,))
    code, _, err = verify(capsys, failed.write(failed.root), "--allow-unsigned")
    assert code == 8 and f"1 gate test(s) failed: {MODEL_TEST}" in err
    incomplete = make_run(tmp_path / "incomplete", outcome={MODEL_TEST: "skipped"})
    code, _, err = verify(capsys, incomplete.write(incomplete.root), "--allow-unsigned")
    assert code == 7 and f"model: {MODEL_TEST} was skipped" in err


def test_verify_profile_option_asks_for_more_than_recorded(tmp_path, capsys):
    run = make_run(tmp_path)
    path = run.write(tmp_path, nodeids=[MODEL_TEST], required=MODEL_ONLY)
    assert verify(capsys, path, "--allow-unsigned")[0] == 11
    code, _, err = verify(capsys, path, "--allow-unsigned", "--profile", "release")
    assert code == 7 and "incomplete for profile release: kernel" in err
    missing = [line.partition(":")[0] for line in err.partition("release: ")[2].split("; ")]
    assert missing == ["kernel", "block", "generation[seed=42]", "generation[seed=43]", "generation[seed=44]"], err


def test_verify_usage_errors(tmp_path, keys, capsys):
    code, _, err = verify(capsys, tmp_path / "absent.json", "--allow-unsigned")
    assert code == 2 and "absent.json does not exist" in err
    run = make_run(tmp_path)
    path = run.write(tmp_path)
    code, _, err = verify(capsys, path, "--allow-unsigned", "--profile", "nightly")
    assert code == 2 and "profiles: checkpoint, ci, model-block, release" in err
    code, _, err = verify(capsys, path, "--key", keys[0])  # the private key where the public one goes
    assert code == 2 and "holds no PEM public key" in err


def test_verify_artifacts_relative_to_root(tmp_path, capsys):
    run = make_run(tmp_path / "run")
    path = run.write(run.root)
    moved = tmp_path / "elsewhere" / "evidence.json"
    moved.parent.mkdir()
    path.rename(moved)
    assert verify(capsys, moved, "--allow-unsigned")[0] == 5
    assert verify(capsys, moved, "--allow-unsigned", "--root", run.root)[0] == 11


def test_console_script_exit_status(tmp_path):
    run = make_run(tmp_path, failing=(MODEL_TEST,))
    path = run.write(tmp_path)
    done = subprocess.run([sys.executable, "-m", "h3gate.cli", "verify", str(path), "--allow-unsigned"],
                          capture_output=True, text=True)
    assert done.returncode == 8, done.stderr
    assert done.stderr.startswith("h3gate verify: failed: 1 gate test(s) failed")


def test_report_writes_markdown_and_plots(signed, capsys):
    run, path = signed
    out = run.root / "summary.md"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    text = out.read_text()
    assert text.startswith("# H3 qualification: PASSED")
    plots = sorted((run.root / "summary-plots").glob("*.png"))
    assert len(plots) == len(ITEMS) + 1  # one per gate test, plus the per-frame curves
    for plot in plots:
        assert f"](summary-plots/{plot.name})" in text


def test_report_of_malformed_evidence(tmp_path, capsys):
    (tmp_path / "evidence.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 9
    assert "malformed" in capsys.readouterr().err


def test_merge_signs_and_verifies(tmp_path, keys, capsys):
    run = make_run(tmp_path)
    key = signing.load_private_key(keys[0])
    shards = [str(run.write(tmp_path / f"shard-{i}", nodeids=half, key=key)) for i, half in enumerate(HALVES)]
    assert main(["merge", *shards, "-o", str(tmp_path), "--key", str(keys[0])]) == 0
    assert "merged 2 shards" in capsys.readouterr().out
    code, out, err = verify(capsys, tmp_path / "evidence.json", "--key", keys[1], "--thresholds", run.thresholds)
    assert code == 0, err
    assert "PASSED" in out and "verified" in out


def test_merge_without_a_key_is_unsigned(tmp_path, keys, capsys, monkeypatch):
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    run = make_run(tmp_path)
    key = signing.load_private_key(keys[0])
    shards = [str(run.write(tmp_path / f"shard-{i}", nodeids=half, key=key)) for i, half in enumerate(HALVES)]
    assert main(["merge", *shards, "-o", str(tmp_path)]) == 0
    assert "UNSIGNED" in capsys.readouterr().out
    assert json.loads((tmp_path / "evidence.json").read_text())["signatures"] == []
    assert verify(capsys, tmp_path, "--key", keys[1])[0] == 4


def test_merge_refusal_names_the_difference(tmp_path, capsys):
    run = make_run(tmp_path)
    first = run.write(tmp_path / "a", nodeids=HALVES[0])
    second = run.write(tmp_path / "b", nodeids=HALVES[1], candidate={"name": "h3_triton", "source_sha256": "00" * 32})
    assert main(["merge", str(first), str(second), "-o", str(tmp_path)]) == 10
    err = capsys.readouterr().err
    assert err.startswith("h3gate merge: conflict: candidate candidate:h3_triton: sha256") and err.count("\n") == 1
    assert not (tmp_path / "evidence.json").exists()


def test_a_statement_edit_is_caught_only_by_the_signature(signed, capsys):
    """The statement tamper above keeps a well-formed, consistent statement: exit 3 is detection, not luck."""
    run, path = signed
    tamper_statement(run, path)
    reseal_sums(path)
    code, out, err = verify(capsys, path, "--allow-unsigned", "--thresholds", run.thresholds)
    assert code == 11 and "signature: NOT CHECKED" in err
