"""The CI trust model: the job that installs and runs the code under test never has the signing key in reach; a job
on the base branch's code verifies what that run produced and signs it."""

import re

import yaml

from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
KEY = "H3GATE_SIGN_KEY"
BASE_REF = "${{ github.event.repository.default_branch }}"


def _load(path) -> dict:
    workflow = yaml.safe_load(path.read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as true
    return workflow


def key_exposures(workflow: dict) -> list[str]:
    """Where ``workflow`` puts the signing key in reach of code it did not take from the base branch: a job that names
    the key must run only on workflow_run (whose workflow file is the default branch's), check out the default branch
    alone, and unpack what it downloads outside its checkout."""
    triggers = set(workflow["on"]) if isinstance(workflow["on"], (dict, list)) else {workflow["on"]}
    found = [f"workflow-level env names {KEY}"] if KEY in yaml.safe_dump(workflow.get("env", {})) else []
    for name, job in workflow["jobs"].items():
        if KEY not in yaml.safe_dump(job):
            continue
        if triggers != {"workflow_run"}:
            found.append(f"job {name} holds the key in a workflow run on {sorted(triggers)}, with the code under test")
        if "environment" not in job:
            found.append(f"job {name} holds the key outside a protected environment")
        for step in job["steps"]:
            uses, given = step.get("uses", ""), step.get("with", {})
            if uses.startswith("actions/checkout") and given.get("ref") != BASE_REF:
                found.append(f"job {name} checks out {given.get('ref', 'the triggering ref')}, not the base branch")
            if uses.startswith("actions/download-artifact") and not str(given.get("path", "")).startswith("${{ runner.temp }}"):
                found.append(f"job {name} unpacks an artifact of the run inside its checkout")
    return found


def test_the_signing_key_is_never_in_a_job_that_installs_or_runs_the_code_under_test():
    workflows = {path.name: _load(path) for path in sorted(WORKFLOWS.glob("*.yml"))}
    assert {name: key_exposures(workflow) for name, workflow in workflows.items()} == {name: [] for name in workflows}
    signing = [name for name, workflow in workflows.items() if KEY in yaml.safe_dump(workflow)]
    assert signing == ["gpu-evidence-sign.yml"]


def test_the_check_finds_the_key_beside_the_code_under_test():
    """The design it replaces: the gate job of a pull_request workflow held the key while running the PR's code."""
    exposed = {
        "on": {"pull_request": {"types": ["labeled", "synchronize"]}},
        "jobs": {"gates": {"env": {KEY: "${{ secrets.H3GATE_SIGN_KEY }}"},
                           "steps": [{"uses": "actions/checkout@v4"}, {"run": "python3 -m pip install -e ."}]}},
    }
    found = key_exposures(exposed)
    assert any("pull_request" in line for line in found) and any("checks out the triggering ref" in line for line in found)
    unpacked = _load(WORKFLOWS / "gpu-evidence-sign.yml")
    next(s for s in unpacked["jobs"]["sign"]["steps"] if "download-artifact" in s.get("uses", ""))["with"]["path"] = "b"
    assert key_exposures(unpacked) == ["job sign unpacks an artifact of the run inside its checkout"]


def test_the_bundle_the_gates_made_is_the_one_signed_verified_and_uploaded():
    gates = _load(WORKFLOWS / "gpu-gates.yml")["jobs"]["gates"]["steps"]
    script = next(step["run"] for step in gates if "h3gate bundle" in step.get("run", ""))
    bundle = re.search(r"h3gate bundle h3-out -o (\S+)", script).group(1)
    unsigned = next(step for step in gates if step.get("with", {}).get("name") == "h3-evidence-unsigned")
    assert unsigned["with"]["path"].rstrip("/") == bundle and "h3gate verify" not in script
    sign = _load(WORKFLOWS / "gpu-evidence-sign.yml")["jobs"]["sign"]["steps"]
    download = next(step for step in sign if "download-artifact" in step.get("uses", ""))
    assert download["with"]["name"] == "h3-evidence-unsigned"
    folder = download["with"]["path"].replace("${{ runner.temp }}", "$RUNNER_TEMP")
    script = next(step["run"] for step in sign if "h3gate sign" in step.get("run", ""))
    for command in ("sign", "verify"):
        line = next(line for line in script.splitlines() if f"h3gate {command}" in line)
        assert f'"{folder}"' in line and "--thresholds thresholds --profile ci" in line, line
    assert re.search(r"h3gate verify \S+ --key ", script)
    upload = next(step for step in sign if step.get("with", {}).get("name") == "h3-evidence")
    assert upload["with"]["path"].rstrip("/") == download["with"]["path"]
    merge = (ROOT / "examples" / "slurm" / "merge.sbatch").read_text()
    assert re.search(r"h3gate verify \S+ --key ", merge)
