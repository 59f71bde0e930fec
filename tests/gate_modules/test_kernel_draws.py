"""The kernel gate's draws follow its strategies alone: importing a module full of literals (a user's repository, a
gate's modules imported by an earlier item) leaves the shapes it meets unchanged, where hypothesis' own draws, which
take constants from every local module now and then, change. In a process of its own, whose modules are fixed."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import contextlib, importlib, sys
    from h3gate.gates import kernel

    def draws(pinned):
        seen = []
        pin = kernel._draws_of_the_search_alone
        if not pinned:
            kernel._draws_of_the_search_alone = contextlib.nullcontext
        try:
            kernel._search(kernel.OP_SPECS["swiglu"], kernel.INTERPRETER_LIMITS, (), (), kernel.QK_NORM_GAIN, "float32",
                           True, 60, False, lambda dims, seed: seen.append((sorted(dims.items()), seed)))
        finally:
            kernel._draws_of_the_search_alone = pin
        return seen

    before = draws(True), draws(False)
    sys.path.insert(0, sys.argv[1])
    importlib.import_module("team_constants")
    after = draws(True), draws(False)
    print(before[0] == after[0], before[1] == after[1])
""")


def test_importing_literals_leaves_the_kernel_gates_draws_unchanged(tmp_path):
    # Row counts and widths the strategies allow, as literals of a local module (hypothesis takes integers of 100 and
    # more, from modules of up to 1024 constants).
    (tmp_path / "team_constants.py").write_text("".join(f"C{n} = {n}\n" for n in range(101, 601)))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    pinned_same, hypothesis_same = run.stdout.split()
    assert pinned_same == "True", "the gate's draws changed when a module of literals was imported"
    assert hypothesis_same == "False", "control: hypothesis' own draws take local constants (else this proves nothing)"
