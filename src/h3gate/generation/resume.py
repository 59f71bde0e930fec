"""Resumable generation: every transformer call of a generation saved as it happens and replayed on resume.

A release generation is tens of transformer calls of seconds each per seed, on machines that get preempted. A
run continues where it stopped, and the resumed generation is bitwise the one an uninterrupted run makes: saved
calls are replayed from disk *through the pipeline's own scheduler* - only the transformer's ``forward`` is
replaced (:meth:`Run.intercept`), the pipeline, its blocks and schedulers run as shipped - so every later input is
recomputed, and each replayed call's inputs are checked against the digests saved with it.

One folder per (identity, seed), chosen by the caller::

    run.json               the identity (JSON): everything that made this generation; a folder serves one only
    run.lock               the lock (filelock): one process works in a folder at a time, others wait or refuse
    step-0003.safetensors  the outputs of transformer call 3, counted from 0 (safetensors: exact bytes, no pickle)
    step-0003.json         its sidecar: step, total, sha256 of every input and of all of them, sha256 of the step
                           file, the caller's info (timesteps); written after the step file, so a sidecar means a
                           complete step
    finished.json          written last: the finished generation's artifacts (file name, sha256)

Rules:

- A folder whose ``run.json`` differs from the current identity is refused with every difference named; it is
  never overwritten, mixed or deleted (move it away to generate anew).
- Every file is written atomically (temp, fsync, rename: :func:`h3gate.files.write_atomic`) by background
  threads, so the next call is not stalled by the disk; pending writes are flushed before the run ends, also on
  error. A killed process leaves complete steps or none.
- Background work: a few store threads hash a computed call's inputs, then serialise, hash and write its step
  file (hashlib releases the GIL on large buffers, so they work in parallel, and several step files are in
  flight at once); one writer thread writes the sidecars, in step order, each after its step file. The inputs
  are copied to host memory first, while the device waits (26 MB at release size); their sha256 is computed
  while the transformer runs. The first call and replayed calls hash before going on, since their digests
  decide whether the run may continue.
- On open every step file and artifact is checked against its recorded sha256; a damaged one is named, and so is
  a record that is not what this tool writes (truncated JSON, another schema): :class:`CorruptRun`, never a
  silent new start.
- SIGTERM and SIGINT (handled in the main thread, the only one Python delivers signals to) let the current call
  finish and its step file land; then :class:`Preempted` (a KeyboardInterrupt) says "preempted at step k/N; run
  the same command to resume" (or, once the run finished, that the same command finishes the item from it).
- ``verify_last_step`` recomputes the last saved call instead of replaying it and requires bitwise equality: a
  nondeterministic transformer would make a resumed generation differ from the one it continues.
- One tqdm progress bar per run that computes (steps, ETA) on the stream the caller passes; none without one. A run
  that resumes says so there, and at which step (:attr:`Run.resumed_at`).

Usage::

    with Run(folder, identity, total_calls=N, progress=sys.stderr) as run:
        if run.finished is None:
            with run.intercept(transformer):
                video, audio = generate(pipe, ...)
            run.finish({"generation.safetensors": "<sha256>"})
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import queue
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock, Timeout
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from tqdm import tqdm

from h3gate.files import FileFormatError, read_json, require, sha256_bytes, sha256_file, write_atomic, write_json

STEP_SCHEMA = "h3gate.step/1"
FINISHED_SCHEMA = "h3gate.finished-run/1"
IDENTITY_FILE = "run.json"
FINISHED_FILE = "finished.json"
LOCK_FILE = "run.lock"
# Store threads: hashing inputs (at release two large tensors, 14 and 10 MB, and a few small ones), serialising,
# hashing and writing step files, several steps at once.
STORE_THREADS = min(4, os.cpu_count() or 1)


class ResumeError(RuntimeError):
    """A run folder that cannot be used as it is; the message names the folder or file and what to do."""


class IdentityMismatch(ResumeError):
    """The folder holds a generation of another identity."""


class CorruptRun(ResumeError):
    """A step file, sidecar or artifact does not match what was recorded for it."""


class ReplayMismatch(ResumeError):
    """A replayed call received other inputs than the saved call had."""


class StartMismatch(ResumeError):
    """The first call's inputs differ from the expected ones (another initial noise or conditioning)."""

    def __init__(self, message: str, expected: dict, found: dict):
        super().__init__(message)
        self.expected, self.found = expected, found


class Nondeterministic(ResumeError):
    """The recomputed last saved call differs from its saved output."""

    def __init__(self, message: str, step: int, max_abs: float):
        super().__init__(message)
        self.step, self.max_abs = step, max_abs


class RunBusy(ResumeError):
    """Another process holds the run folder."""


class Preempted(KeyboardInterrupt):
    """SIGTERM or SIGINT stopped the run after a complete step; running the same command resumes it.

    A KeyboardInterrupt, so pytest (which then ends the session, results written) and any caller stop as on Ctrl-C
    instead of going on to the next seed."""

    def __init__(self, step: int, total: int, folder: Path, finished: bool = False):
        super().__init__(f"preempted after its last step ({total}/{total}), the run saved whole; run the same command "
                         "to finish" if finished else f"preempted at step {step}/{total}; run the same command to resume")
        self.step, self.total, self.folder = step, total, folder


def tensor_sha256(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (bitwise identity, any device).

    The bytes are hashed where they lie in host memory, not through a ``bytes`` copy: the main thread hashes every
    call's inputs (26 MB at release size) while the device waits."""
    tensor = tensor.detach().contiguous().cpu()
    digest = hashlib.sha256(f"{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def hash_inputs(inputs: dict, pool: ThreadPoolExecutor, snapshot: bool) -> dict[str, Future]:
    """sha256 per keyword input, as futures of ``pool``: tensors by their bytes (:func:`tensor_sha256`),
    anything else by its repr, taken now. With ``snapshot`` the tensors are first copied to host memory here, so
    the caller may change them in place (the denoising loop does) before they are hashed."""
    futures = {}
    for name, value in sorted(inputs.items()):
        if isinstance(value, torch.Tensor):
            futures[name] = pool.submit(tensor_sha256, value.detach().to("cpu", copy=True) if snapshot else value)
        else:
            futures[name] = pool.submit(sha256_bytes, repr(value).encode())
    return futures


def resolved(futures: dict[str, Future]) -> dict[str, str]:
    """The digests of :func:`hash_inputs`, waiting for each."""
    return {name: future.result() for name, future in futures.items()}


def _combined(digests: dict[str, str]) -> str:
    return sha256_bytes(json.dumps(digests, sort_keys=True).encode())


def start_mismatch(expected: dict, found: dict) -> StartMismatch | None:
    """The error naming every first-call input whose digest differs (``found`` vs ``expected``), or None."""
    lines = [
        f"{name}: {found.get(name, '<absent>')} (this run) vs {expected.get(name, '<absent>')} (reference)"
        for name in sorted(set(found) | set(expected))
        if found.get(name) != expected.get(name)
    ]
    if not lines:
        return None
    return StartMismatch(
        "the first transformer call's inputs differ from the reference run's (another initial noise, conditioning "
        "or layout):\n  " + "\n  ".join(lines),
        expected,
        found,
    )


def step_name(step: int) -> str:
    return f"step-{step:04d}"


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict) and value:
        flat = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def identity_differences(saved: dict, current: dict) -> list[str]:
    """``key: saved -> current`` for every (dotted) key where two identities differ."""
    old, new = _flatten(saved), _flatten(current)
    missing = "<absent>"
    return [
        f"{key}: {old.get(key, missing)!r} -> {new.get(key, missing)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key, missing) != new.get(key, missing)
    ]


class _Writer:
    """One background thread that runs write jobs in order; its first error is raised on the next put/flush.
    Its jobs after an error are skipped."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue(maxsize=2)  # bounded: at most two steps' outputs wait in memory
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="h3gate-step-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    job()
            except BaseException as error:  # handed to the main thread by check()
                self._error = error
            finally:
                self._jobs.task_done()

    def check(self) -> None:
        """Raise the first write error, if any."""
        if self._error is not None:
            raise ResumeError(f"writing a step file failed: {self._error}") from self._error

    def put(self, job: Callable[[], None]) -> None:
        self.check()
        self._jobs.put(job)

    def flush(self) -> None:
        self._jobs.join()
        self.check()

    def close(self) -> None:
        """Finish every pending job and stop the thread (errors stay for :meth:`check`)."""
        self._jobs.put(None)
        self._thread.join()


class Run:
    """One resumable generation in ``folder``; a context manager holding the folder's lock (see module docstring).

    ``identity`` is any JSON value describing what makes the generation; ``total_calls`` the transformer calls it
    makes. ``expected_first_inputs`` (input name -> sha256, e.g. a reference run's :attr:`first_call_inputs`)
    makes the first call refuse other inputs (:class:`StartMismatch`) before anything is computed.
    ``lock_timeout`` is how long to wait for another process holding the folder (0: refuse at once).
    """

    def __init__(
        self,
        folder: str | Path,
        identity: dict,
        total_calls: int,
        *,
        label: str = "generation",
        progress=None,
        lock_timeout: float = 3600.0,
        verify_last_step: bool = False,
        expected_first_inputs: dict | None = None,
    ):
        if total_calls < 1:
            raise ValueError(f"a run needs at least one transformer call, got total_calls={total_calls}")
        self.folder = Path(folder)
        self.identity = json.loads(json.dumps(identity, sort_keys=True))
        self.total = total_calls
        self.label = label
        self.progress = progress
        self.lock_timeout = lock_timeout
        self.verify_last_step = verify_last_step
        self.expected_first_inputs = expected_first_inputs
        self.saved: list[dict] = []  # sidecars of the steps on disk when the run was opened
        self.finished: dict | None = None
        self.first_call_inputs: dict | None = None
        self.calls = 0  # transformer calls made in this process, replayed or computed
        self.verified_step: int | None = None
        self.resumed_at: str | None = None  # "k/N": the step this run went on from, where an earlier one stopped
        self._signal: int | None = None
        self._previous_handlers: dict = {}

    # Opening and closing ----------------------------------------------------------------------------------

    def __enter__(self) -> "Run":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.folder / LOCK_FILE))
        self._acquire()
        try:
            self._open()
        except BaseException:
            self._lock.release()
            raise
        if self.saved:
            self.first_call_inputs = self.saved[0]["inputs"]
        if self.saved and self.finished is None:  # an earlier run was cut short: this one goes on where it stopped
            self.resumed_at = f"{len(self.saved) + 1}/{self.total}"
            if self.progress is not None:
                count = len(self.saved)
                replayed = (f"{count - 1} saved steps replayed and saved step {count} recomputed, to equal it bitwise"
                            if self.verify_last_step else f"{count} saved steps replayed")
                self.progress.write(f"{self.label}: resumed at step {self.resumed_at} ({self.folder}), "
                                    f"the {replayed}\n")
        self._pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="h3gate-store")
        self._writer = _Writer()
        self._bar = tqdm(
            total=self.total,
            initial=len(self.saved),
            desc=self.label,
            unit="step",
            file=self.progress,
            disable=self.progress is None or (self.finished is not None and not self.verify_last_step),
            dynamic_ncols=True,
        )
        self._install_signal_handlers()
        return self

    def __exit__(self, exc_type, exc, traceback) -> bool:
        try:
            self._writer.close()
        finally:
            self._pool.shutdown()
            self._restore_signal_handlers()
            self._bar.close()
            self._lock.release()
        if exc is None:
            self._writer.check()
        if exc is None and self._signal is not None:  # after the last call: the run may have finished already
            raise Preempted(self.calls, self.total, self.folder, finished=self.finished is not None)
        return False

    def _acquire(self) -> None:
        try:
            self._lock.acquire(timeout=0)
            return
        except Timeout:
            pass
        if self.progress is not None and self.lock_timeout > 0:
            self.progress.write(f"{self.label}: waiting for {self.folder}, in use by another process\n")
        try:
            self._lock.acquire(timeout=self.lock_timeout)
        except Timeout:
            raise RunBusy(
                f"{self.folder} is in use by another process (lock {self._lock.lock_file}) and stayed so for "
                f"{self.lock_timeout:g} s: wait for that process to finish or stop it; two processes never share a "
                "run folder"
            ) from None

    def _open(self) -> None:
        """Check what the folder holds. A file of it that this tool would not have written (truncated, foreign,
        hand-edited) is a :class:`CorruptRun` like a damaged step: a bad file of the folder is the folder's damage,
        and its fix is the folder's."""
        try:
            self._check_identity()
            for partial in self.folder.glob(".*.partial"):  # left by a killed writer; never a complete file
                partial.unlink()
            self.saved = self._scan_steps()
            self.finished = self._read_finished()
        except FileFormatError as error:
            raise CorruptRun(f"{error}; move {self.folder} away or delete it to start afresh") from error

    def _check_identity(self) -> None:
        path = self.folder / IDENTITY_FILE
        if not path.exists():
            if any(self.folder.glob("step-*")) or (self.folder / FINISHED_FILE).exists():
                raise CorruptRun(f"{self.folder} holds step files but no {IDENTITY_FILE}: it is not a run folder "
                                 "this tool wrote; move it away")
            write_json(path, self.identity)
            return
        saved = read_json(path, "run identity")
        if saved != self.identity:
            raise IdentityMismatch(
                f"{self.folder} holds a generation of another identity, which is never overwritten or mixed; "
                "differences (saved -> this run):\n  " + "\n  ".join(identity_differences(saved, self.identity))
                + f"\nMove {self.folder} away (or use another output folder) to generate anew."
            )

    def _scan_steps(self) -> list[dict]:
        saved = []
        for index, path in enumerate(sorted(self.folder.glob("step-*.json"))):
            if path.name != step_name(index) + ".json":
                raise CorruptRun(
                    f"{path}: steps are not contiguous ({step_name(index)}.json is missing); move {self.folder} away"
                )
            what = "step sidecar"
            sidecar = read_json(path, what)
            if sidecar.get("schema") != STEP_SCHEMA or require(path, sidecar, "step", int, what) != index:
                raise CorruptRun(f"{path} is not the sidecar of step {index} ({STEP_SCHEMA}); move {self.folder} away")
            for key in ("input_sha256", "file_sha256", "file"):
                require(path, sidecar, key, str, what)
            require(path, sidecar, "inputs", dict, what)
            self._check_file(self.folder / sidecar["file"], sidecar["file_sha256"], f"step {index + 1}/{self.total}")
            saved.append(sidecar)
        if len(saved) > self.total:
            raise CorruptRun(f"{self.folder} holds {len(saved)} steps, more than the {self.total} of this run")
        return saved

    def _check_file(self, path: Path, expected: str, what: str) -> None:
        if not path.is_file():
            raise CorruptRun(f"{path} ({what}) is missing; move {self.folder} away to generate anew")
        found = sha256_file(path)
        if found != expected:
            raise CorruptRun(
                f"{path} ({what}) is damaged: its sha256 {found} differs from the recorded {expected}; move "
                f"{self.folder} away to generate anew (damaged runs are never repaired silently)"
            )

    def _read_finished(self) -> dict | None:
        path = self.folder / FINISHED_FILE
        if not path.exists():
            return None
        data = read_json(path, "finished run record")
        if data.get("schema") != FINISHED_SCHEMA:
            raise FileFormatError(path, f"schema is {data.get('schema')!r}, expected {FINISHED_SCHEMA!r}")
        if len(self.saved) != self.total:
            raise CorruptRun(f"{path} marks the run finished, but only {len(self.saved)}/{self.total} steps are saved")
        artifacts = require(path, data, "artifacts", dict, "finished run record")
        for name, digest in artifacts.items():
            self._check_file(self.folder / name, digest, "artifact")
        return data

    # Signals ----------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; the atomic writes still keep the folder whole
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._signal = signum

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}

    # The transformer call ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def intercept(self, module: torch.nn.Module, compute: Callable | None = None, describe: Callable | None = None):
        """Route ``module``'s calls through this run for the body: saved calls replayed, new ones computed by
        ``compute`` (default: the module's own forward) and saved. ``describe(inputs)`` adds JSON info to a
        step's sidecar. The wrapper keeps the forward's signature (functools.wraps), which callers inspect.

        Forward hooks on ``module`` itself are refused: they would change the outputs after the recorded call, so a
        replay would hand the caller other outputs than the original run did (pre-hooks, and hooks on submodules,
        run before or inside the recorded call and are fine)."""
        if module._forward_hooks or torch.nn.modules.module._global_forward_hooks:
            raise ResumeError(
                f"{type(module).__name__} has forward hooks, which would change its outputs outside the recorded call; "
                "install them into its submodules instead"
            )
        own = module.__dict__.get("forward")
        bound = module.forward
        compute = compute or bound

        @functools.wraps(bound)
        def forward(*args, **kwargs):
            if args:
                raise TypeError(f"{type(module).__name__} was called with positional arguments; a resumable run "
                                "records keyword inputs only")
            return self._call(kwargs, compute, describe)

        module.forward = forward
        try:
            yield module
        finally:
            if own is None:
                del module.forward
            else:
                module.forward = own

    def _call(self, inputs: dict, compute: Callable, describe: Callable | None):
        step = self.calls
        if step >= self.total:
            raise ResumeError(f"the pipeline made more than the {self.total} transformer calls this run expects "
                              f"({self.folder})")
        replay = step < len(self.saved)
        digests = hash_inputs(inputs, self._pool, snapshot=step > 0 and not replay)
        if step == 0:
            self.first_call_inputs = resolved(digests)
            self._check_start(self.first_call_inputs)
        if replay:
            outputs = self._replay(step, resolved(digests), inputs, compute)
        else:
            outputs = compute(**inputs)
            self._save(step, digests, outputs, describe(inputs) if describe else {})
            self._bar.update(1)
        self.calls += 1
        if self._signal is not None:
            self._writer.flush()
            raise Preempted(self.calls, self.total, self.folder)
        return outputs

    def _check_start(self, digests: dict) -> None:
        if self.expected_first_inputs is not None:
            mismatch = start_mismatch(self.expected_first_inputs, digests)
            if mismatch is not None:
                raise mismatch

    def _replay(self, step: int, digests: dict, inputs: dict, compute: Callable):
        sidecar = self.saved[step]
        if sidecar["input_sha256"] != _combined(digests):
            changed = sorted(name for name in set(digests) | set(sidecar["inputs"])
                             if digests.get(name) != sidecar["inputs"].get(name))
            raise ReplayMismatch(
                f"{self.folder}: replayed step {step + 1}/{self.total} ({step_name(step)}) received other inputs than "
                f"the saved call ({', '.join(changed)}): this generation no longer reproduces the saved one; move the "
                "folder away to generate anew"
            )
        path = self.folder / sidecar["file"]
        data = path.read_bytes()
        if sha256_bytes(data) != sidecar["file_sha256"]:
            raise CorruptRun(f"{path} changed on disk since the run was opened; move {self.folder} away")
        device = next((value.device for value in inputs.values() if isinstance(value, torch.Tensor)), "cpu")
        tensors = load_tensors(data)
        outputs = tuple(tensors[f"output.{i}"].to(device) for i in range(len(tensors)))
        if self.verify_last_step and step == len(self.saved) - 1:
            self._verify(step, outputs, compute(**inputs))
            self.verified_step = step
        return outputs

    def _verify(self, step: int, saved: tuple, recomputed) -> None:
        recomputed = list(_output_tensors(recomputed).values())
        for i, old in enumerate(saved):
            new = recomputed[i].detach() if i < len(recomputed) else None
            if new is not None and tensor_sha256(old) == tensor_sha256(new):
                continue
            comparable = new is not None and new.shape == old.shape
            max_abs = float((old.double() - new.to(old.device).double()).abs().max()) if comparable else float("inf")
            raise Nondeterministic(
                f"step {step + 1}/{self.total} ({step_name(step)}) recomputed differs from its saved output "
                f"(output {i}: max abs difference {max_abs:.3g}): the transformer is not deterministic, so a "
                "resumed generation would not be the one it continues",
                step,
                max_abs,
            )

    def _save(self, step: int, digests: dict[str, Future], outputs, info: dict) -> None:
        """Have a store thread serialise, hash and write the step file (its inputs' digests may still be hashing),
        then the writer write its sidecar: sidecars land in step order, each after its step file, while several
        step files are written at once.

        The store threads take jobs in order, so the digests this job waits for were taken before it: waiting
        cannot block the pool."""
        tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in _output_tensors(outputs).items()}
        file = step_name(step) + ".safetensors"

        def write_file() -> dict:
            inputs = resolved(digests)
            data = save_tensors(tensors)
            write_atomic(self.folder / file, data)
            return {
                "schema": STEP_SCHEMA,
                "step": step,
                "total": self.total,
                "file": file,
                "input_sha256": _combined(inputs),
                "inputs": inputs,
                "info": info,
                "file_sha256": sha256_bytes(data),
            }

        written = self._pool.submit(write_file)

        def write() -> None:
            write_json(self.folder / (step_name(step) + ".json"), written.result())

        self._writer.put(write)

    # Finishing --------------------------------------------------------------------------------------------

    def finish(self, artifacts: dict[str, str], extra: dict | None = None) -> dict:
        """Mark the run finished: every call made, every step on disk, ``artifacts`` (file name in the folder ->
        sha256) recorded in ``finished.json``, written last."""
        if self.calls != self.total:
            raise ResumeError(f"the pipeline made {self.calls} transformer calls; this run expects {self.total} "
                              f"({self.folder})")
        self._writer.flush()
        for name in artifacts:
            if Path(name).name != name:
                raise ValueError(f"artifact {name!r} must be a file name inside the run folder {self.folder}")
        record = {"schema": FINISHED_SCHEMA, "steps": self.total, "artifacts": dict(artifacts), **(extra or {})}
        write_json(self.folder / FINISHED_FILE, record)
        self.finished = record
        return record


def _output_tensors(outputs) -> dict[str, torch.Tensor]:
    if not isinstance(outputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in outputs):
        raise ResumeError(f"the transformer returned {type(outputs).__name__}; a resumable run needs a tuple of tensors "
                          "(return_dict=False)")
    return {f"output.{i}": tensor for i, tensor in enumerate(outputs)}
