"""The session's evidence digests every file its results name, wherever in a result's context they are named, and the
command it prints to verify that evidence names the thresholds as the session had them."""

from pytest_h3.session_evidence import _artifacts


def test_the_generation_gates_workflow_artifacts_are_evidence(tmp_path):
    """The generation gate names each workflow's videos, audio and arrays under ``context["workflows"]``; the model
    gate names its own under ``context["artifacts"]``. Files that no longer exist are not evidence."""
    files = {name: tmp_path / name for name in ("results.json", "hist.png", "p.mp4", "c.mp4", "c.safetensors")}
    for path in files.values():
        path.write_bytes(b"x")
    entry = {"path": str(files["c.safetensors"]), "sha256": "0" * 64}
    results = {
        "model": {"context": {"artifacts": {"histogram": str(files["hist.png"])}}},
        "generation": {"context": {"workflows": {"fl2va": {"artifacts": {
            "provider": {"video.mp4": {"path": str(files["p.mp4"]), "sha256": "0" * 64}},
            "candidate": {"video.mp4": {"path": str(files["c.mp4"]), "sha256": "0" * 64}, "arrays": entry,
                          "gone.wav": {"path": str(tmp_path / "gone.wav"), "sha256": "0" * 64}},
        }}}}},
        "unrelated": {"context": {"bounds_file": str(files["hist.png"].with_name("bounds.json"))}},
    }
    assert _artifacts(results, [files["results.json"]]) == sorted(files.values())


def test_the_printed_verify_command_names_the_thresholds_as_the_session_had_them(tmp_path, monkeypatch):
    """Relative where they lie under the working folder, absolute elsewhere: the command pastes as it is there, and a
    folder outside it reads as the one the user named, not as ``../../tmp/...``."""
    import shlex
    from types import SimpleNamespace

    from pytest_h3.session_evidence import verify_command

    work = tmp_path / "repo"
    (work / "thresholds").mkdir(parents=True)
    monkeypatch.chdir(work)
    statement = {"predicate": {"h3": {"profile": {"name": "ci"}}}}

    def command(thresholds):
        session = SimpleNamespace(thresholds=thresholds, sign_key=None, settings=SimpleNamespace(sign_key=None))
        return shlex.split(verify_command(session, work / "h3-out" / "evidence.json", statement))

    assert "--thresholds=thresholds" in command(work / "thresholds")
    assert f"--thresholds={tmp_path / 'elsewhere'}" in command(tmp_path / "elsewhere")
    assert "--allow-unsigned" in command(work / "thresholds")
