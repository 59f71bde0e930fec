"""Setting a repository up for the gates (``h3gate init``): its gate suite file, pytest's configuration, and the
thresholds folder with its lock and the record of the suite (:mod:`h3gate.suite`).

Run at the repository's root. Nothing is overwritten without ``force``, and every refusal is decided before the
first file is written, so a refused set-up leaves the repository as it was. An existing pytest configuration is
never edited: what it lacks is said instead.

``pytest.ini`` is written where pytest has no configuration yet, for two reasons. The gates record their key metrics
with ``record_property``, which reaches JUnit XML only in the ``xunit1`` family (pytest's default, ``xunit2``, warns
and leaves them out of the schema). And a configuration file makes its folder pytest's rootdir wherever pytest runs
below it, so the default thresholds folder, ``<rootdir>/thresholds``, is this one from every subfolder.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass, field
from pathlib import Path

PYTEST_INI = "pytest.ini"
JUNIT_FAMILY = "xunit1"
INI_TEXT = f"""# Written by h3gate init.
# junit_family: the gates record their key metrics with record_property, which reaches JUnit XML only in the
# xunit1 family. This file also makes its folder pytest's rootdir from every subfolder, so the thresholds folder
# (<rootdir>/thresholds) is the same wherever pytest runs.
[pytest]
junit_family = {JUNIT_FAMILY}
"""


class SetupError(ValueError):
    """The repository cannot be set up as asked; the message names the file and the fix."""


def pytest_config(root: Path) -> Path | None:
    """The file of ``root`` that configures pytest, in pytest's order of precedence, or None."""
    for name in (PYTEST_INI, ".pytest.ini"):
        if (root / name).is_file():
            return root / name
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and _pyproject_table(pyproject) is not None:
        return pyproject
    for name, section in (("tox.ini", "pytest"), ("setup.cfg", "tool:pytest")):
        if (root / name).is_file() and _ini_section(root / name, section) is not None:
            return root / name
    return None


def _pyproject_table(path: Path) -> dict | None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own TOML reader
        import tomli as tomllib

    try:
        tool = tomllib.loads(path.read_text()).get("tool", {}).get("pytest")
    except tomllib.TOMLDecodeError as error:
        raise SetupError(f"{path} is not valid TOML ({error}): fix it first") from None
    if tool is None:
        return None
    return tool.get("ini_options", tool)


def _ini_section(path: Path, section: str) -> dict | None:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path)
    except configparser.Error as error:
        raise SetupError(f"{path} cannot be read as an ini file ({error}): fix it first") from None
    return dict(parser[section]) if parser.has_section(section) else None


def junit_family(config: Path) -> str | None:
    """The ``junit_family`` a pytest configuration file sets, or None."""
    if config.name == "pyproject.toml":
        return (_pyproject_table(config) or {}).get("junit_family")
    section = {"tox.ini": "pytest", "setup.cfg": "tool:pytest"}.get(config.name, "pytest")
    return (_ini_section(config, section) or {}).get("junit_family")


@dataclass
class Plan:
    """What ``h3gate init`` writes (path -> (text, what it is for)) and what it only says (about an existing pytest
    configuration)."""

    files: dict[Path, tuple[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def plan(root: Path, suite_path: str, thresholds: Path, force: bool) -> Plan:
    """The files that set ``root`` up: the suite at ``suite_path`` (relative to ``root``), pytest.ini where pytest has
    no configuration, and the record of the suite in ``thresholds``. Existing files are refused unless ``force``,
    all of them named at once."""
    from h3gate import suite
    from h3gate.generation.default_contracts import GENERATIONS

    name = Path(suite_path).name
    if Path(suite_path).is_absolute() or not (name.startswith("test_") or name.endswith("_test.py")) \
            or not name.endswith(".py"):
        raise SetupError(f"--suite {suite_path}: give a path inside the repository named test_*.py, a file pytest "
                         "collects by default")
    written = Plan()
    seeds = {key: value["seeds"] for key, value in GENERATIONS.items()}
    written.files[root / suite_path] = (suite.text(suite_path, seeds["generation"], seeds["generation-preflight"]),
                                        "the gate suite (kernel, block, model and generation gates)")
    config = pytest_config(root)
    if config is None:
        written.files[root / PYTEST_INI] = (INI_TEXT, f"junit_family = {JUNIT_FAMILY} (the gates' metrics reach JUnit "
                                            "XML only there), and this folder as pytest's rootdir from every subfolder")
    elif junit_family(config) != JUNIT_FAMILY:
        written.notes.append(f"pytest is configured by {config.name} here, so no {PYTEST_INI} was written; add "
                             f"junit_family = {JUNIT_FAMILY} to it (the gates' key metrics reach JUnit XML only in "
                             "that family)")
    ignore = thresholds / ".gitignore"
    if not ignore.exists():  # the lock's lock file, which locking leaves beside LOCK.json
        written.files[ignore] = ("*.flock\n", "keeps the lock's own lock file (LOCK.json.flock) out of version control")
    if suite.recorded(thresholds) != Path(suite_path).as_posix():
        written.files[thresholds / suite.RECORD] = (suite.record_text(suite_path),
                                                    "the record of the gate suite, whose tests the commands name")
    existing = [path for path in written.files if path.exists()]
    if existing and not force:
        names = ", ".join(str(path.relative_to(root) if path.is_relative_to(root) else path) for path in existing)
        one = len(existing) == 1
        raise SetupError(f"{names} exist{'s' if one else ''}: init overwrites nothing; pass --force to replace "
                         f"{'it' if one else 'them'} with what init writes")
    return written


def write(thresholds: Path, written: Plan) -> dict[Path, str]:
    """Write the planned files (each atomically) and the thresholds folder's lock where it has none; returns every
    file written with what it is for."""
    from h3gate.bounds import LOCK_NAME, lock_files
    from h3gate.files import write_atomic

    for path, (text, _) in written.files.items():
        write_atomic(path, text)
    done = {path: what for path, (_, what) in written.files.items()}
    if not (thresholds / LOCK_NAME).is_file():
        lock_files(thresholds, [])
        done[thresholds / LOCK_NAME] = "the lock of the frozen files (bounds and contracts), empty"
    return done
