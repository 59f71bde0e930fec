"""The session's evidence digests every file its results name, wherever in a result's context they are named."""

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
