"""The whole journey in a repository of a user's own: the commands of the README's "In your own repository", run in a
new folder outside this repository, each printed by a command before it, ending in evidence that verifies PASSED."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SECTION = "## In your own repository"


def readme_commands() -> list[str]:
    """The commands of the section's console block, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index(SECTION):]
    block = re.search(r"```console\n(.*?)```", section, re.S)
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_names_the_commands_of_a_journey():
    commands = readme_commands()
    assert commands[0] == "h3gate init" and commands[-1].startswith("h3gate verify ")
    assert not any(str(ROOT) in command or "tests/gates" in command for command in commands)


def test_a_users_repository_from_init_to_verified_evidence(tmp_path):
    """Each README command runs in a new folder; every one after the first must have been printed by one before it,
    and none may name this repository. Kept CPU-cheap through pytest's own PYTEST_ADDOPTS, which leaves the printed
    commands as they are: freezes calibrate from the provider and sdpa-math (the CPU variant that changes the
    arithmetic; compiling the others takes minutes) and the check qualifies the provider itself (h3_triton under
    Triton's interpreter takes minutes a generation; the tiny suite of this repository qualifies its kernels)."""
    repo = tmp_path / "our-repo"
    repo.mkdir()
    assert ROOT not in repo.parents
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "H3GATE_"))}
    environment.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}", CUDA_VISIBLE_DEVICES="")
    printed = ""
    for index, command in enumerate(readme_commands()):
        assert index == 0 or command in printed, f"no command before printed {command!r}; they printed:\n{printed}"
        argv = shlex.split(command)
        extra = {}
        if argv[0] == "pytest":
            extra["PYTEST_ADDOPTS"] = "--h3-variants=sdpa-math" if "--h3-freeze" in argv else "--h3-candidate=provider"
        done = subprocess.run(argv, cwd=repo, env={**environment, **extra}, capture_output=True, text=True, timeout=600)
        output = done.stdout + done.stderr
        named = output.replace(sys.prefix, "<environment>")  # where pytest-h3 is installed: this repository's .venv
        assert str(ROOT) not in named and "tests/gates" not in named, f"{command} named this repository:\n{output}"
        if argv[:2] == ["h3gate", "verify"]:
            assert done.returncode == 11, output  # PASSED, and unsigned: nobody vouches for it
            assert "untrusted: PASSED (profile checkpoint, built-in)" in output
        else:
            assert done.returncode == 0, f"{command}:\n{output[-4000:]}"
        printed += done.stdout
