"""Evidence a reviewer cannot be fooled by: conformance to in-toto, names that stay inside the folder, hostile
JSON, sidecars that must agree with the envelope, the uploaded bundle, and a fuzz of ``verify`` over forgeries."""

import base64
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from evidence_runs import ENVIRONMENT, HOME, ITEMS, edit_statement, make_run, reseal_sums, run_cli, statement_of
from h3gate.cli.evidence import EXIT_CODES
from h3gate.evidence import signing
from h3gate.evidence.redaction import REDACTION_NAME, redact_xml
from h3gate.evidence.signing import EvidenceError
from h3gate.evidence.statement import SUMS_NAME, candidate_digest, name_problem, subjects
from h3gate.evidence.verify import verify
from h3gate.files import FileFormatError

MODEL_TEST = "tests/gates/test_model.py::test_model"
DOCUMENTED = {0, 2, *EXIT_CODES.values()}


@pytest.fixture
def keys(tmp_path):
    private, public = signing.keygen(tmp_path / "keys")
    return signing.load_private_key(private), public


# 6. in-toto conformance ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome, result, verdict", [
    ({}, "PASSED", "PASSED"),
    ({MODEL_TEST: "failed"}, "FAILED", "FAILED"),
    ({MODEL_TEST: "skipped"}, "FAILED", "INCOMPLETE"),
    ({MODEL_TEST: "error"}, "FAILED", "INCOMPLETE"),
])
def test_the_statement_conforms_to_the_in_toto_test_result_predicate(tmp_path, outcome, result, verdict):
    run = make_run(tmp_path, outcome={k: v for k, v in outcome.items() if v != "failed"},
                   failing=tuple(k for k, v in outcome.items() if v == "failed"))
    raw = statement_of(run.write(tmp_path))
    statement = Statement(
        [ResourceDescriptor(s["name"], digest=s["digest"]).pb for s in raw["subject"]],
        raw["predicateType"],
        raw["predicate"],
    )
    statement.validate()
    assert raw["_type"] == statement.pb.type
    predicate = json_format.ParseDict(raw["predicate"], test_result_pb2.TestResult(), ignore_unknown_fields=True)
    assert predicate.result == result and predicate.result in ("PASSED", "WARNED", "FAILED")
    for descriptor in predicate.configuration:
        ResourceDescriptor.copy_from_pb(descriptor).validate()
    assert raw["predicate"]["h3"]["verdict"] == verdict
    if MODEL_TEST in outcome and outcome[MODEL_TEST] in ("failed", "error"):
        assert MODEL_TEST in predicate.failed_tests  # crashed items are failed tests to the predicate


# 2. what wrote the evidence, and when ------------------------------------------------------------------------


def test_the_statement_names_the_h3gate_that_wrote_it_and_when(tmp_path):
    h3 = statement_of(make_run(tmp_path).write(tmp_path))["predicate"]["h3"]
    assert h3["tool"]["name"] == "h3gate" and re.fullmatch(r"[0-9a-f]{64}", h3["tool"]["source_sha256"])
    assert h3["tool"]["version"] and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", h3["created"])


# 5. subject names ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, says", [
    ("../outside.bin", "'..' component"),
    ("a/\x1b[2Kb.bin", "control character U+001B"),
    ("/etc/passwd", "not a relative POSIX path"),
    ("a/\u202eb.bin", "control character U+202E"),
])
def test_unsafe_subject_names_are_refused(tmp_path, name, says):
    assert says in name_problem(name)
    run = make_run(tmp_path / "run")
    path = run.write(run.root)
    edit_statement(path, lambda statement: statement["subject"][0].update(name=name))
    with pytest.raises(EvidenceError, match=re.escape(says)) as error:
        verify(path)
    assert error.value.kind == "malformed"


def test_an_artifact_outside_the_evidence_folder_is_refused_when_writing(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x")
    with pytest.raises(FileFormatError, match="'..' component: .*write artifacts under the evidence folder"):
        subjects([outside], tmp_path / "out")


def test_printed_text_is_escaped(tmp_path):
    run = make_run(tmp_path)
    path = run.write(tmp_path)

    def rename(statement):
        for entry in statement["predicate"]["configuration"]:
            if entry["annotations"]["role"] == "candidate":
                entry["annotations"]["identity"]["name"] = "\x1b[1A\x1b[2KPASSED\u202e"
                entry["name"] = "candidate:" + entry["annotations"]["identity"]["name"]
                entry["digest"]["sha256"] = candidate_digest(entry["annotations"]["identity"])

    edit_statement(path, rename)
    code, printed = run_cli("verify", path, "--allow-unsigned", "--expect-candidate", "h3_triton")
    assert code == 12 and "\x1b" not in printed and "\u202e" not in printed and "\\x1b[1A" in printed
    assert printed.count("\n") == 1


# 8. hostile JSON -----------------------------------------------------------------------------------------------

HOSTILE = {"long integer": "1" * 5000, "deep nesting": "[" * 100_000 + "]" * 100_000}


@pytest.mark.parametrize("where", ["envelope", "payload"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_json_is_malformed_not_a_traceback(tmp_path, keys, where, kind):
    path = tmp_path / "evidence.json"
    if where == "envelope":
        path.write_text('{"payloadType": "application/vnd.in-toto+json", "signatures": [], "payload": %s}' % HOSTILE[kind])
    else:
        payload = base64.b64encode(HOSTILE[kind].encode()).decode()
        path.write_text(json.dumps({"payloadType": signing.PAYLOAD_TYPE, "payload": payload, "signatures": []}))
    for command in (["verify", path, "--allow-unsigned"], ["report", path]):
        code, printed = run_cli(*command)
        assert code == EXIT_CODES["malformed"] and printed.count("\n") == 1, printed
        assert str(path) in printed


def test_a_lock_with_a_huge_integer_is_named(tmp_path):
    run = make_run(tmp_path)
    path = run.write(tmp_path)
    lock = run.thresholds / "LOCK.json"
    lock.write_text(lock.read_text().replace("{", '{"junk": %s,' % ("9" * 5000), 1))
    code, printed = run_cli("verify", path, "--allow-unsigned", "--thresholds", run.thresholds)
    assert code == EXIT_CODES["lock"] and f"{lock}: not valid JSON" in printed and printed.count("\n") == 1


# 4. SHA256SUMS and redaction.json ------------------------------------------------------------------------------


def test_sha256sums_must_agree_with_the_evidence(tmp_path, keys):
    key, public = keys
    run = make_run(tmp_path)
    path = run.write(tmp_path, key=key)
    sums = tmp_path / SUMS_NAME
    original = sums.read_text()
    sums.write_text(original + f"{'0' * 64}  extra.bin\n")
    assert run_cli("verify", path, "--key", public)[0] == EXIT_CODES["digest"]
    first = original.splitlines()[0]
    sums.write_text(original.replace(first, "f" * 64 + first[64:]))
    code, printed = run_cli("verify", path, "--key", public)
    assert code == EXIT_CODES["digest"] and "SHA256SUMS" in printed
    sums.write_text(original)
    assert run_cli("verify", path, "--key", public)[0] == 0


def test_redaction_json_must_be_the_one_signed(tmp_path, keys):
    key, public = keys
    run = make_run(tmp_path)
    path = run.write(tmp_path, key=key)
    redaction = tmp_path / REDACTION_NAME
    record = json.loads(redaction.read_text())
    record["fields"] = {}
    redaction.write_text(json.dumps(record))
    code, printed = run_cli("verify", path, "--key", public)
    assert code == EXIT_CODES["digest"] and "redaction.json differs" in printed


# 3. the CI bundle, 7. JUnit -------------------------------------------------------------------------------------


def test_the_bundle_verifies_as_downloaded(tmp_path, keys):
    key, public = keys
    run = make_run(tmp_path / "run")
    run.write(run.root, key=key)
    (run.root / "scratch.bin").write_bytes(b"not evidence")
    code, printed = run_cli("bundle", run.root, "-o", tmp_path / "bundle")
    assert code == 0, printed
    shutil.rmtree(run.root / "artifacts")  # the downloaded bundle is all a reviewer has
    files = sorted(p.relative_to(tmp_path / "bundle").as_posix() for p in (tmp_path / "bundle").rglob("*") if p.is_file())
    listed = sorted(line.split("  ", 1)[1] for line in (tmp_path / "bundle" / "SHA256SUMS").read_text().splitlines())
    assert files == sorted([*listed, "SHA256SUMS"]) and len(files) == len(ITEMS) + 3
    code, printed = run_cli("verify", tmp_path / "bundle", "--key", public, "--thresholds", run.thresholds)
    assert code == 0, printed
    assert run_cli("bundle", run.root, "-o", tmp_path / "bundle")[0] == 2  # never into an existing folder


def test_junit_is_redacted_like_the_statement(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        f'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite hostname="{ENVIRONMENT["hostname"]}" '
        f'name="pytest"><testcase file="{HOME}/h3/tests/gates/test_model.py" name="test_model">'
        f'<failure message="boom">{HOME}/h3/src/h3gate/gates/model.py:10: AssertionError</failure>'
        "</testcase></testsuite></testsuites>"
    )
    redact_xml(junit, ENVIRONMENT)
    text = junit.read_text()
    assert "gpu-node" not in text and HOME not in text
    assert 'hostname="&lt;host&gt;"' in text and "~/h3/src/h3gate/gates/model.py:10" in text


# 1, 5, 8: verify over forgeries ---------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


class Genuine(tuple):
    """(folder, envelope text, public key) of a signed run; its repr stays short in hypothesis' reports."""

    def __repr__(self):
        return "<the genuine signed run>"


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    root = tmp_path_factory.mktemp("genuine")
    run = make_run(root)
    private, public = signing.keygen(root / "keys")
    path = run.write(root, key=signing.load_private_key(private))
    return Genuine((root, path.read_text(), public))


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, (*prefix, index))


NAMES = st.text(max_size=12) | st.builds(
    lambda part, count, sep: sep.join([part * count] * 2), st.sampled_from(["a", "\u00e9", "\u2028", "..", "\x85"]),
    st.integers(1, 3000), st.sampled_from(["/", "", "\n"]),
)
KINDS = ("regular", "dev-zero", "fifo", "folder", "loop", "dangling", "absent")


@st.composite
def forgeries(draw, genuine_text: str) -> tuple[str, bool]:
    """(the genuine envelope with one edit, whether the edit leaves the statement inconsistent with its folder): a
    value of the envelope or of its statement replaced or deleted, a subject renamed (any length, any character),
    the payload's bytes cut or flipped, the file's text cut or padded (a cut file that still parses is the genuine one)."""
    envelope = json.loads(genuine_text)
    statement = json.loads(base64.b64decode(envelope["payload"]))
    where = draw(st.sampled_from(["statement", "envelope", "payload bytes", "file text", "subject name", "padding"]))
    if where == "file text":
        return genuine_text[: draw(st.integers(0, len(genuine_text) - 1))], False
    if where == "padding":
        return genuine_text + " " * draw(st.integers(0, 1 << 16)), False
    if where == "payload bytes":
        payload = bytearray(base64.b64decode(envelope["payload"]))
        index = draw(st.integers(0, len(payload) - 1))
        payload[index] ^= draw(st.integers(1, 255))
        envelope["payload"] = base64.b64encode(bytes(payload)).decode()
        return json.dumps(envelope), False
    if where == "subject name":
        subject = statement["subject"][draw(st.integers(0, len(statement["subject"]) - 1))]
        name = draw(NAMES.filter(lambda name: name != subject["name"]))
        subject["name"] = name
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        return json.dumps(envelope), True
    target = statement if where == "statement" else envelope
    path = draw(st.sampled_from([p for p in _paths(target) if p]))
    parent = target
    for step in path[:-1]:
        parent = parent[step]
    if draw(st.booleans()):
        parent[path[-1]] = draw(JSON)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    if where == "statement":
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps(envelope), False


def _make_kind(path: Path, kind: str) -> None:
    """Replace the file ``path`` by a file of another kind (a device, a FIFO, a folder, a symlink loop, ...)."""
    if kind == "regular":
        return
    path.unlink()
    {"dev-zero": lambda: path.symlink_to("/dev/zero"), "fifo": lambda: os.mkfifo(path), "folder": path.mkdir,
     "loop": lambda: path.symlink_to(path.name), "dangling": lambda: path.symlink_to("nowhere"),
     "absent": lambda: None}[kind]()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_verify_over_forged_evidence(genuine, data):
    """Every outcome is a documented exit code and one line, never a traceback; a forgery never exits 0 with the
    key, nothing exits 0 without one, and evidence inconsistent with its folder (a renamed subject, a cut file, a
    sidecar or artifact that is no regular file) never exits 0 or 11. The forgery lies in a copy of the genuine
    folder whose SHA256SUMS names the forged envelope, so the checks past the sums see it too."""
    root, text, public = genuine
    forged, inconsistent = data.draw(forgeries(text))
    victim = data.draw(st.sampled_from(sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                                              if p.is_file() and p.parent.name != "keys" and "thresholds" not in p.parts
                                              and p.name != "evidence.json")))
    kind = data.draw(st.sampled_from(KINDS))
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "run"
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("keys"))
        path = copy / "evidence.json"
        path.write_text(forged)
        reseal_sums(path)
        _make_kind(copy / victim, kind)
        inconsistent |= kind != "regular"
        try:
            unchanged = json.loads(forged) == json.loads(text) and not inconsistent
        except ValueError:
            unchanged = False
        for trust in (["--key", public], ["--allow-unsigned"]):
            code, printed = run_cli("verify", path, *trust)
            assert code in DOCUMENTED and printed.count("\n") == 1, printed
            assert code != 0 or (trust[0] == "--key" and unchanged), printed
            assert not (inconsistent and code in (0, EXIT_CODES["untrusted"])), printed
        if data.draw(st.booleans()):  # the report draws plots: a share of the examples keeps the test short
            code, printed = run_cli("report", path, "-o", Path(folder) / "report.md")
            assert code in DOCUMENTED and printed.count("\n") == 1, printed
