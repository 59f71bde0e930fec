"""Compile once per node: processes that miss the same Triton kernel at the same moment compile it once, the others
load it; a compile that raised leaves no lock behind. Real compiles for an sm_90 target, which Triton's wheel builds
on any host (its ptxas ships with it), each in a process of its own without the interpreter."""

import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from pytest_h3 import compile_once

# Waits at a barrier file until every process is ready, compiles, prints "compiled" or "loaded" (Triton's listener).
COMPILE = textwrap.dedent("""
    import os, sys, time
    import triton, triton.language as tl
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def copy(x, y, n, BLOCK: tl.constexpr):  # two dots: a compile of ~2 s outlasts the processes' start
        i = tl.arange(0, BLOCK)
        a = tl.load(x + i[:, None] * BLOCK + i[None, :]) {broken}
        for _ in tl.static_range(2):
            a = tl.dot(a, a)
        tl.store(y + i[:, None] * BLOCK + i[None, :], a)

    hits = []
    knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
    ready, parties = sys.argv[1], int(sys.argv[2])
    open(os.path.join(ready, str(os.getpid())), "w").close()
    while len(os.listdir(ready)) < parties:
        time.sleep(0.001)
    source = ASTSource(copy, {{"x": "*fp16", "y": "*fp16", "n": "i32", "BLOCK": "constexpr"}}, constexprs={{"BLOCK": 128}})
    for attempt in range(int(sys.argv[3])):
        try:
            triton.compile(source, target=GPUTarget("cuda", 90, 32))
        except Exception as error:
            print("raised", type(error).__name__)
        else:
            print("loaded" if hits[-1] else "compiled")
""")


def _compile_together(tmp_path, parties: int, manager: str | None, broken: str = "", attempts: int = 1) -> list[str]:
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "compile.py"
    script.write_text(COMPILE.format(broken=broken))
    ready = tempfile.mkdtemp(dir=tmp_path)
    env = {key: value for key, value in os.environ.items() if key not in ("TRITON_INTERPRET", compile_once.ENV)}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    if manager:
        env[compile_once.ENV] = manager
    runs = [subprocess.Popen([sys.executable, str(script), ready, str(parties), str(attempts)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(parties)]
    lines = []
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        lines.append(" ".join(out.split("\n")).strip())
    return sorted(lines)


@pytest.mark.parametrize("parties", [3])
def test_processes_that_miss_together_compile_once(tmp_path, parties):
    assert _compile_together(tmp_path / "alone", parties, None) == ["compiled"] * parties  # Triton alone: each
    assert _compile_together(tmp_path / "once", parties, compile_once.MANAGER) == ["compiled"] + ["loaded"] * (parties - 1)


def test_a_compile_that_raised_leaves_no_lock(tmp_path):
    # Each process meets the same broken kernel twice: had a lock outlived the error that ended its compile, the
    # second attempt would wait WAIT_SECONDS (past the timeout of communicate) instead of raising at once.
    lines = _compile_together(tmp_path, 2, compile_once.MANAGER, "+ tl.undefined_name", attempts=2)
    assert lines == ["raised CompilationError raised CompilationError"] * 2


def test_a_manager_the_user_chose_is_kept(monkeypatch):
    monkeypatch.setenv(compile_once.ENV, "team_cache:RemoteCache")
    compile_once.install()
    assert os.environ[compile_once.ENV] == "team_cache:RemoteCache"
    monkeypatch.delenv(compile_once.ENV)
    compile_once.install()
    assert os.environ[compile_once.ENV] == compile_once.MANAGER


def test_a_lock_held_past_the_wait_compiles_here_and_says_so(tmp_path, monkeypatch):
    from filelock import FileLock

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_once, "WAIT_SECONDS", 0.1)
    manager = compile_once.CompileOnce("KEY")
    with FileLock(str(tmp_path / "KEY" / compile_once.LOCK_FILE)):  # another compile of the same key, stuck
        with pytest.warns(UserWarning, match=r"Triton kernel copy: another process has held its compile lock .* 0 s"):
            assert manager.get_group("copy.json") is None
    assert manager._compiling is None, "it compiles without the lock, and releases none"
