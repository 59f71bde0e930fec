"""Spreading gate items: one xdist worker per GPU, each pinned to its own GPU, and deterministic shards.

Pinning must happen before anything in the worker touches CUDA (once the driver is initialised,
``CUDA_VISIBLE_DEVICES`` is read no more), so it runs in the worker's earliest hook. A worker takes the
entry of the *caller's* visible-GPU list at its own index — never ``device_count()`` modulo, which sends
every worker to one GPU when the caller had narrowed the list. The controller publishes that list in
``H3GATE_CALLER_GPUS``, and its process id in ``H3GATE_CALLER_PID``, before it starts the workers, which inherit its
environment. A process is a worker only when it is a child of that controller: a pytest that a test on a worker
starts (pytester, a user's own subprocess) inherits ``PYTEST_XDIST_WORKER`` and the list too, and would otherwise pin
itself to a GPU of its parent's run.

``--h3-workers-per-gpu K`` gives each GPU K workers (gw0..gwK-1 share the first): the kernel gate compiles a
kernel for every shape class hypothesis draws, which is CPU-bound, so several compiling processes per GPU
shorten it where one per GPU leaves the host's cores idle.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from pytest_h3.options import DEVICE, SHARD, WORKERS_PER_GPU

CALLER_GPUS = "H3GATE_CALLER_GPUS"
CALLER_PID = "H3GATE_CALLER_PID"
DEVICE_NODES = Path("/dev")  # where an NVIDIA driver puts nvidia0, nvidia1, ...


def caller_gpus() -> list[str]:
    """The GPUs the caller made visible: its CUDA_VISIBLE_DEVICES entries, or every device's index."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch

    return [str(index) for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def check_device_option(option: str) -> None:
    if option not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", option):
        raise pytest.UsageError(f"{DEVICE}={option!r} is not cpu, cuda, cuda:N or auto")


def resolve_device(option: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` for the ``--h3-device`` option (torch is imported only where a GPU may be)."""
    check_device_option(option)
    if cpu_run(option):
        return "cpu"
    import torch

    if option == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise pytest.UsageError(f"{DEVICE}={option} but no CUDA device is visible; use {DEVICE}=cpu")
    return option


def cpu_run(option: str) -> bool:
    """Whether the gates run on CPU, decided without importing torch (a session that runs no gate never needs it):
    ``cpu``, or ``auto`` on a machine without an NVIDIA device node (where torch could see no GPU either)."""
    if option == "cpu":
        return True
    return option == "auto" and not any(DEVICE_NODES.glob("nvidia[0-9]*"))


def is_worker(config) -> bool:
    """Whether this process is an xdist worker: by its config, which xdist gives a ``workerinput``; not by
    ``PYTEST_XDIST_WORKER``, which a pytest started from a worker inherits."""
    return hasattr(config, "workerinput")


def check_paths(config) -> None:
    """Each path given on the command line must exist, as pytest itself checks without xdist.

    Under xdist the controller collects nothing and the workers drop a path they cannot find, so a mistyped path ran
    as "no tests ran" (exit 5) with no error line (pytest-xdist issue #109): the controller checks them before any
    worker starts, with pytest's own words. ``--pyargs`` names modules, not paths, and is left to the workers."""
    if config.option.pyargs or config.args_source != pytest.Config.ArgsSource.ARGS:
        return
    for arg in config.args:
        if not (config.invocation_params.dir / arg.split("::")[0]).exists():
            raise pytest.UsageError(f"file or directory not found: {arg}")


WORKER_USAGE_ERRORS = "h3_usage_errors"  # a worker's workeroutput key: the usage error that stopped its collection
usage_errors_key = pytest.StashKey[list]()


def keep_usage_error(session, error: pytest.UsageError) -> None:
    """Worker: hand the usage error that stopped its collection to the controller, and stop. xdist neither prints nor
    counts one: pytest's "not found" for a node id that names no test of an existing file ended the run as "no tests
    ran" (pytest-xdist issue #109), and a thresholds folder refused once collection finished (the gates selected by
    path, not by ``-m gate``, which the controller checks itself) as an internal error of xdist's about the items it
    had given the worker. A worker that says it stops (``shouldstop``) leaves its items to no one."""
    if is_worker(session.config):
        session.config.workeroutput[WORKER_USAGE_ERRORS] = [str(arg) for arg in error.args]
        session.shouldstop = f"usage error: {error}"


def note_usage_errors(node) -> None:
    """Controller: keep the usage error a worker handed over (:func:`keep_usage_error`), once (every worker collects
    the same arguments)."""
    errors = getattr(node, "workeroutput", {}).get(WORKER_USAGE_ERRORS)
    if errors and not node.config.stash.get(usage_errors_key, None):
        node.config.stash[usage_errors_key] = errors


def raise_usage_errors(config) -> None:
    """Controller, once its workers are down (or have stopped it): stop with the workers' usage error in pytest's words
    and exit status, as pytest without -n does."""
    errors = config.stash.get(usage_errors_key, None)
    if errors:
        raise pytest.UsageError(*errors)


def worker_name(config) -> str:
    """The xdist worker's id (gw0, gw1, ...), or ``main`` for a session of one process."""
    return config.workerinput["workerid"] if is_worker(config) else "main"


def worker_index() -> int | None:
    """The xdist worker's index from its environment, for the steps before a config exists (pinning the GPU); None
    in a process that inherited a worker's environment without being a worker of the controller that published it."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    if not match or os.environ.get(CALLER_PID) != str(os.getppid()):
        return None
    return int(match.group(1))


def prepare(device_option: str, per_gpu: int = 1) -> None:
    """Controller: publish the caller's GPU list. Worker: pin itself to its GPU (before CUDA is touched). Both: compile
    each Triton kernel once for all of them (:mod:`pytest_h3.compile_once`; imported here, past the CPU check, since
    it imports triton, which a CPU run must first switch to its interpreter)."""
    if cpu_run(device_option):
        return
    from pytest_h3 import compile_once

    compile_once.install()
    index = worker_index()
    if index is None:
        os.environ[CALLER_GPUS] = ",".join(caller_gpus())
        os.environ[CALLER_PID] = str(os.getpid())
        return
    gpus = [gpu for gpu in os.environ.get(CALLER_GPUS, "").split(",") if gpu]
    if not gpus:
        return  # the caller saw no GPU: the worker runs on CPU like its controller
    if index >= len(gpus) * per_gpu:
        raise pytest.UsageError(
            f"xdist worker gw{index} has no GPU of its own: the caller sees {len(gpus)} GPU(s) "
            f"({','.join(gpus)}) and gives each {per_gpu} worker(s); run with -n {len(gpus) * per_gpu} or -n auto"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[index // per_gpu]


def check_pinned(config, device_option: str) -> None:
    """A worker of a GPU run has pinned its GPU at start-up (:func:`prepare`) only if it is a child of the controller
    that published the list: one started through a launcher that forks Python rather than executing it cannot tell
    which GPU is its own, and would share the first with every other such worker."""
    if not is_worker(config) or cpu_run(device_option) or worker_index() is not None:
        return
    raise pytest.UsageError(
        f"xdist worker {os.environ.get('PYTEST_XDIST_WORKER')} is not a child of the pytest that started it (pid "
        f"{os.environ.get(CALLER_PID)}; its parent is {os.getppid()}), so it cannot tell which GPU is its own; start "
        "pytest with the Python interpreter itself (python -m pytest), not through a launcher that forks it"
    )


def check_workers(device_option: str, per_gpu: int, workers) -> None:
    """Controller, before any worker starts: each worker past GPUs x ``per_gpu`` would fail at start-up, xdist
    would replace it, and the run would end in "no tests ran" with exit status 0, which CI reads as green."""
    if not isinstance(workers, int) or workers < 1 or cpu_run(device_option):
        return
    gpus = caller_gpus()
    if device_option == "auto" and not gpus:
        return  # no GPU visible: auto runs on CPU, where workers need none
    if workers > len(gpus) * per_gpu:
        raise pytest.UsageError(
            f"-n {workers} with {DEVICE}={device_option}: the caller sees {len(gpus)} GPU(s) "
            f"({','.join(gpus) or 'none'}) and gives each {per_gpu} worker(s) ({WORKERS_PER_GPU}); run with "
            f"-n {len(gpus) * per_gpu or 0} or -n auto, or raise {WORKERS_PER_GPU}"
        )


def auto_workers(device_option: str, per_gpu: int = 1) -> int | None:
    """``-n auto``: ``per_gpu`` workers per visible GPU; None (xdist's own choice) on CPU."""
    if cpu_run(device_option):
        return None
    gpus = caller_gpus()
    return len(gpus) * per_gpu or None


def host_share(config) -> int | None:
    """An xdist worker's share of the host's cores (those this process may run on, over the workers), or None
    outside xdist: a GPU node's workers each compute host-side work on every core otherwise (4 workers on 16 cores
    drove the load average to 51)."""
    if not is_worker(config):
        return None
    return max(1, len(os.sched_getaffinity(0)) // max(1, int(config.workerinput["workercount"])))


def parse_shard(spec: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not match or not 0 <= int(match.group(1)) < int(match.group(2)):
        raise pytest.UsageError(f"{SHARD}={spec!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return int(match.group(1)), int(match.group(2))


def shard(items: list, spec: str) -> tuple[list, list]:
    """(kept, dropped): gate items dealt round-robin by sorted node id; other tests stay in every shard."""
    index, count = parse_shard(spec)
    gates = sorted((item for item in items if item.get_closest_marker("h3_gate")), key=lambda item: item.nodeid)
    dropped = {item.nodeid for position, item in enumerate(gates) if position % count != index}
    return [i for i in items if i.nodeid not in dropped], [i for i in items if i.nodeid in dropped]


# Every SIGINT or SIGTERM a session's process received: a gate item that fails once one came is interrupted, not
# failed (:func:`pytest_h3.gate_runner.run`), since the compilers and subprocesses it started got the signal too.
SIGNALS: list[int] = []


# A signal this soon after the first is the same stop delivered twice: timeout(1) signals its command and then the
# command's process group, so the command gets two SIGTERMs microseconds apart.
SAME_STOP_S = 1.0


def _again(first_at: float, signum: int, restore) -> None:
    """A signal after the first: within :data:`SAME_STOP_S` the same stop, ignored; later, a second stop, delivered to
    the handlers from before ours (``restore()`` sets them back) as if ours had never been set."""
    if time.monotonic() - first_at >= SAME_STOP_S:
        restore()
        signal.raise_signal(signum)


@contextlib.contextmanager
def signals_noted():
    """In one process a Ctrl-C stops the session at once, as pytest's own does, and so does a SIGTERM (a scheduler's
    stop, timeout(1)), which by default would kill the process before it wrote the results of the items that ran: it
    raises KeyboardInterrupt as a Ctrl-C does, and the summary says what stopped the session. Each is noted in
    :data:`SIGNALS`. Yields the SIGTERMs received."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    first_at: list[float] = []

    def noted(signum, frame):
        SIGNALS.append(signum)
        previous[signum](signum, frame)

    def stopped(signum, frame):
        SIGNALS.append(signum)
        if first_at:
            _again(first_at[0], signum, restore)
            return
        first_at.append(time.monotonic())
        received.append(signum)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    ours = {}
    if callable(previous[signal.SIGINT]):
        ours[signal.SIGINT] = noted
    if previous[signal.SIGTERM] == signal.SIG_DFL:  # a handler someone else set keeps its say
        ours[signal.SIGTERM] = stopped

    def restore():
        for signum in ours:
            signal.signal(signum, previous[signum])

    for signum, handler in ours.items():
        signal.signal(signum, handler)
    try:
        yield received
    finally:
        restore()


@contextlib.contextmanager
def first_signal_held(then=None):
    """Under xdist, the first SIGINT or SIGTERM stops nothing at once: a Ctrl-C reaches the controller and every worker
    (one process group). A worker's generation finishes its step and says where it stopped (:mod:`h3gate.generation.
    resume`); otherwise ``then(signum)`` (a worker: stop after the current item) runs. The controller, still listening,
    ends once its workers have (one stopped at once would tear them down before they could say). A second stop (see
    :func:`_again`) stops at once. Yields the signals held. A session writing its results and evidence holds them so
    too, with no ``then``."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    first_at: list[float] = []

    def restore():
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def held(signum, frame):
        if first_at:
            _again(first_at[0], signum, restore)
            return
        first_at.append(time.monotonic())
        received.append(signum)
        SIGNALS.append(signum)
        if then is not None:
            then(signum)

    for signum in previous:
        signal.signal(signum, held)
    try:
        yield received
    finally:
        restore()
