"""Whether the resumable step store (``h3gate.generation.resume.Run``) writes at disk speed and leaves the step loop alone.

Usage: python benchmarks/step_store.py [--device cuda|cpu] [--steps 20] [--rounds 3] [--step-ms 500]
                                       [--fraction 1] [--folder DIR] [-o FILE]

A step's inputs and outputs have the release transformer's shapes and dtypes at the release contract (38,222
rows), without building the transformer: the inputs are ``h3gate.model.contract.model_inputs`` for the release config
(26 MB, plus the ``attention_kwargs`` and ``return_dict`` the pipeline's denoiser passes), the outputs' shapes and
dtypes are what the release transformer's forward gives on the meta device (video 1 x 37,296 x 96 and audio
1 x 414 x 32, float32: a 14.4 MB step file).

Three phases, in a temporary folder under ``--folder`` (removed at the end):

1. disk: one step file's bytes written ``--steps`` times to new files with open/write/flush/fsync, none of the
   store's code: the disk's speed for this write pattern.
2. store: a Run intercepting a stand-in whose forward returns the outputs at once, timed from the first call to
   the end of ``finish()`` (so the writer's backlog counts): steps/s and MB/s of step files, against 1. Phases 1
   and 2 alternate ``--rounds`` times and their medians are compared: a shared disk's speed drifts.
3. stall: a stand-in whose forward does ``--step-ms`` of device work (bf16 matmuls on CUDA, float32 on CPU,
   calibrated here) and synchronises, as the pipeline does when it reads the outputs; every call's inputs then
   take an Euler step of its outputs, as the denoising loop's do. Per step, without and with a Run: the wall
   time, the device work in it and the rest, where the device waits for the host. The stall is the rest the Run
   adds. Beside it: the main thread's time inside the store (a call's time minus its forward's), and its two
   parts timed alone, the host copies of the inputs and of the outputs; and the hashing of one call's inputs
   on the store's hashing threads (``hash_inputs``), which overlaps the next call.

The stall is also given as a share of a release step: one 50-block transformer call on an H200
(``results/h200-perf/h200-release-step-tma.json``). On CPU the matmuls and the store's writer thread share the
host's cores, which a GPU's work does not: there the wall time added exceeds the stall.
"""

import argparse
import dataclasses
import os
import shutil
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors.torch import save as save_tensors
from tqdm import tqdm

from h3gate import bench
from h3gate.files import write_json
from h3gate.generation import resume
from h3gate.generation.resume import Run, hash_inputs, resolved
from h3gate.model.contract import model_inputs
from h3gate.model.factory import transformer_skeleton
from h3gate.model.presets import RELEASE_CONFIG

RELEASE_STEP_MS = 6794.0  # the provider's 50-block transformer call, h200-release-step-tma.json
MB = 1e6


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def release_io(device: str, fraction: float = 1.0) -> tuple[dict, tuple]:
    """(keyword inputs, outputs) of one release transformer call on ``device``; ``fraction`` < 1 scales the
    contract's latent frames, text tokens and audio latents down (at least one of each)."""
    transformer = transformer_skeleton({**RELEASE_CONFIG, "num_layers": 1})
    contract = bench.contract("release")
    scaled = ("latent_frames", "text_tokens", "audio_latents")
    contract = dataclasses.replace(contract, **{key: max(1, round(getattr(contract, key) * fraction))
                                                for key in scaled})
    inputs, _ = model_inputs(contract, dict(transformer.config))
    with torch.no_grad():
        shapes = transformer(**{name: value.to("meta") for name, value in inputs.items()}, return_dict=False)
    generator = torch.Generator().manual_seed(0)
    outputs = tuple(torch.randn(out.shape, generator=generator).to(device, out.dtype) for out in shapes)
    inputs = {name: value.to(device) for name, value in inputs.items()}
    return {**inputs, "attention_kwargs": None, "return_dict": False}, outputs


def step_file_bytes(outputs: tuple) -> int:
    """The size of one step file: the store saves the outputs as ``output.<i>`` with safetensors."""
    return len(save_tensors({f"output.{i}": out.cpu().contiguous() for i, out in enumerate(outputs)}))


def disk_speed(folder: Path, nbytes: int, steps: int) -> dict:
    """``steps`` new files of ``nbytes`` each, written and fsynced one after the other (then removed)."""
    data = os.urandom(nbytes)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for step in tqdm(range(steps), desc="disk", unit="file", leave=False):
        with open(folder / f"disk-{step:04d}.bin", "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
    seconds = time.perf_counter() - start
    for step in range(steps):
        (folder / f"disk-{step:04d}.bin").unlink()
    return {"files": steps, "bytes": steps * nbytes, "seconds": seconds, "mb_s": steps * nbytes / MB / seconds}


class StandIn(torch.nn.Module):
    """A transformer called as the pipeline calls it (keywords, a tuple back) that does ``work`` and then returns
    fixed outputs, recording how long each forward took."""

    def __init__(self, outputs: tuple, device: str, work=None):
        super().__init__()
        self.outputs, self.device, self.work = outputs, device, work
        self.seconds: list[float] = []

    def forward(self, **inputs):
        start = time.perf_counter()
        if self.work is not None:
            self.work()
        sync(self.device)
        self.seconds.append(time.perf_counter() - start)
        return self.outputs


def denoise(module: StandIn, inputs: dict, steps: int, desc: str) -> dict[str, list[float]]:
    """Wall seconds of each step (the call, then an Euler step of the inputs by its outputs) and of its call."""
    walls = {"steps": [], "calls": []}
    for _ in tqdm(range(steps), desc=desc, unit="step", leave=False):
        start = time.perf_counter()
        video, audio = module(**inputs)
        called = time.perf_counter()
        inputs["hidden_states"].sub_(video, alpha=0.01)
        inputs["audio_hidden_states"].sub_(audio, alpha=0.01)
        walls["calls"].append(called - start)
        walls["steps"].append(time.perf_counter() - start)
    return walls


def describe(inputs: dict) -> dict:
    """The sidecar info the generation gate records per step."""
    return {"timesteps": inputs["timestep"].tolist()}


def fresh(inputs: dict) -> dict:
    """A copy of the inputs that a loop may move without touching the next loop's start."""
    return {name: value.clone() if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


def with_run(folder: Path, module: StandIn, inputs: dict, steps: int, desc: str) -> dict:
    """A fresh Run in ``folder`` around ``steps`` calls: per-step walls, and the seconds from the first call to
    the end of ``finish()`` (every step file landed)."""
    with Run(folder, {"benchmark": "step_store", "folder": folder.name}, steps) as run:
        with run.intercept(module, describe=describe):
            start = time.perf_counter()
            walls = denoise(module, inputs, steps, desc)
        flush = time.perf_counter()
        run.finish({})
        end = time.perf_counter()
    return {"walls": walls, "seconds": end - start, "finish_s": end - flush}


def store_throughput(folder: Path, inputs: dict, outputs: tuple, device: str, steps: int, step_bytes: int) -> dict:
    """Phase 2: the store's own rate, with steps that take no time (the inputs hashed, the outputs copied, each step
    serialised, hashed and written); ``step_bytes`` is one step file's size (:func:`step_file_bytes`)."""
    result = with_run(folder, StandIn(outputs, device), fresh(inputs), steps, "store")
    nbytes = steps * step_bytes
    seconds = result["seconds"]
    return {"folder": str(folder), "steps": steps, "bytes": nbytes, "seconds": seconds, "finish_s": result["finish_s"],
            "steps_s": steps / seconds, "mb_s": nbytes / MB / seconds}


def throughput(folder: Path, inputs: dict, outputs: tuple, device: str, steps: int, rounds: int) -> dict:
    """Phases 1 and 2 in turn, ``rounds`` times (a shared disk's speed drifts): each round's results, and the
    medians of the rates and of the store/disk ratios."""
    nbytes = step_file_bytes(outputs)
    disk, store = [], []
    for round_ in range(rounds):
        disk.append(disk_speed(folder / "disk", nbytes, steps))
        store.append(store_throughput(folder / f"store-{round_}", inputs, outputs, device, steps, nbytes))
        shutil.rmtree(folder / f"store-{round_}")
    return {
        "disk": disk, "store": store, "disk_mb_s": statistics.median(d["mb_s"] for d in disk),
        "store_mb_s": statistics.median(s["mb_s"] for s in store),
        "store_steps_s": statistics.median(s["steps_s"] for s in store),
        "ratio": statistics.median(s["mb_s"] / d["mb_s"] for d, s in zip(disk, store)),
    }


def calibrate(device: str, step_ms: float):
    """A callable doing about ``step_ms`` of matmuls on ``device``, and its measured milliseconds."""
    cuda = device.startswith("cuda")
    n, dtype = (8192, torch.bfloat16) if cuda else (512, torch.float32)
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=generator) for _ in range(2))
    c = torch.empty_like(a)

    def matmuls(count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            torch.mm(a, b, out=c)
        sync(device)
        return time.perf_counter() - start

    matmuls(3)
    count = 1
    while (seconds := matmuls(count)) < 0.5:
        count *= 2
    count = max(1, round(step_ms / 1e3 / (seconds / count)))
    return (lambda: matmuls(count)), statistics.median(matmuls(count) for _ in range(3)) * 1e3


def host_parts(inputs: dict, outputs: tuple, device: str, repeats: int = 5) -> dict:
    """Median milliseconds of the store's main-thread jobs alone, the host copies of the inputs (what
    ``hash_inputs`` does on the caller's thread) and of the outputs (``Run._save``'s expression), and of hashing
    one call's copied inputs on the store's threads (in the background during a run)."""
    tensors = {name: value for name, value in inputs.items() if isinstance(value, torch.Tensor)}
    copies = {name: value.to("cpu", copy=True) for name, value in tensors.items()}

    def timed(fn) -> float:
        times = []
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    with ThreadPoolExecutor(resume.STORE_THREADS) as pool:
        return {
            "input_copy_ms": timed(lambda: [value.detach().to("cpu", copy=True) for value in tensors.values()]),
            "host_copy_ms": timed(lambda: [out.detach().to("cpu", copy=True).contiguous() for out in outputs]),
            "input_hashing_ms": timed(lambda: resolved(hash_inputs(copies, pool, snapshot=False))),
            "store_threads": resume.STORE_THREADS,
        }


def loop_times(walls: dict, forwards: list[float]) -> dict:
    """Mean milliseconds per step: the whole step, the device work in it, and the rest (the device waits)."""
    steps = statistics.fmean(walls["steps"]) * 1e3
    forward = statistics.fmean(forwards) * 1e3
    return {"step_ms": steps, "forward_ms": forward, "outside_ms": steps - forward}


def stall(folder: Path, inputs: dict, outputs: tuple, device: str, steps: int, step_ms: float) -> dict:
    """Phase 3: the time a Run adds to a step that does ``step_ms`` of device work. The stall is the added time
    outside the forward, where the device has nothing to do; the added wall time also holds, on CPU, the writer
    slowing the matmuls down, and any drift of the machine's speed between the two loops."""
    work, work_ms = calibrate(device, step_ms)
    plain = StandIn(outputs, device, work)
    denoise(plain, fresh(inputs), 1, "warm-up")
    plain.seconds.clear()
    without = loop_times(denoise(plain, fresh(inputs), steps, "without Run"), plain.seconds)
    stored = StandIn(outputs, device, work)
    result = with_run(folder, stored, fresh(inputs), steps, "with Run")
    within = loop_times(result["walls"], stored.seconds)
    inside = [call - forward for call, forward in zip(result["walls"]["calls"], stored.seconds)]
    stall_ms = within["outside_ms"] - without["outside_ms"]
    return {
        "steps": steps, "work_ms": work_ms, "without_run": without, "with_run": within,
        "added_wall_ms": within["step_ms"] - without["step_ms"], "stall_ms": stall_ms,
        "stall_share": stall_ms / without["step_ms"], "stall_share_release": stall_ms / RELEASE_STEP_MS,
        "store_main_thread_ms": statistics.fmean(inside) * 1e3, "store_main_thread_max_ms": max(inside) * 1e3,
        "finish_s": result["finish_s"], **host_parts(inputs, outputs, device),
    }


def filesystem(path: Path) -> dict:
    """The mount point and type holding ``path`` (from /proc/mounts where there is one)."""
    path, best = path.resolve(), {"mount": None, "type": None}
    if Path("/proc/mounts").exists():
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, kind = line.split()[:3]
            if path.is_relative_to(mount) and len(mount) >= len(best["mount"] or ""):
                best = {"mount": mount, "type": kind}
    return best


def machine(device: str, folder: Path) -> dict:
    return {
        "hostname": socket.gethostname(), "cpus": os.cpu_count(), "torch": torch.__version__, "device": device,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "folder": str(folder.resolve()), "filesystem": filesystem(folder),
    }


def describe_io(inputs: dict, outputs: tuple) -> dict:
    tensors = [value for value in inputs.values() if isinstance(value, torch.Tensor)]
    return {
        "input_bytes": sum(t.numel() * t.element_size() for t in tensors),
        "inputs": {name: [str(value.dtype), list(value.shape)] for name, value in inputs.items()
                   if isinstance(value, torch.Tensor)},
        "outputs": [[str(out.dtype), list(out.shape)] for out in outputs],
        "step_file_bytes": step_file_bytes(outputs),
    }


def rounds(rows: list[dict], key: str, form: str) -> str:
    return ", ".join(format(row[key], form) for row in rows)


def table(report: dict) -> str:
    io, rates, hold = report["io"], report["throughput"], report["stall"]
    outputs = ", ".join(f"{'x'.join(map(str, shape))} {dtype.removeprefix('torch.')}" for dtype, shape in io["outputs"])
    fs = report["machine"]["filesystem"]
    loops = {"without Run": hold["without_run"], "with Run": hold["with_run"]}
    return "\n".join([
        f"inputs {io['input_bytes'] / MB:.1f} MB ({len(io['inputs'])} tensors); step file "
        f"{io['step_file_bytes'] / MB:.2f} MB (outputs {outputs}); device {report['machine']['device']}",
        f"folder {report['machine']['folder']} ({fs['type']} on {fs['mount']}); {report['steps']} steps per loop",
        "",
        "| phase | measured |",
        "|---|---|",
        f"| 1. disk: open/write/flush/fsync | {rates['disk_mb_s']:.0f} MB/s (median; rounds "
        f"{rounds(rates['disk'], 'mb_s', '.0f')}) |",
        f"| 2. store: Run, instant steps, to the end of finish() | {rates['store_steps_s']:.1f} steps/s, "
        f"{rates['store_mb_s']:.0f} MB/s (medians; rounds {rounds(rates['store'], 'mb_s', '.0f')}); "
        f"store/disk {rates['ratio']:.2f}x (median of the rounds') |",
        *(f"| 3. step {name} | {times['step_ms']:.1f} ms: device work {times['forward_ms']:.1f} ms, rest "
          f"{times['outside_ms']:.1f} ms |" for name, times in loops.items()),
        f"| 3. stall: rest added by the Run | {hold['stall_ms']:+.1f} ms = {hold['stall_share']:.2%} of the step, "
        f"{hold['stall_share_release']:.2%} of a {RELEASE_STEP_MS / 1e3:.1f} s release step (wall "
        f"{hold['added_wall_ms']:+.1f} ms) |",
        f"| 3. main thread inside the store | {hold['store_main_thread_ms']:.1f} ms/step (max "
        f"{hold['store_main_thread_max_ms']:.1f}); alone: host copy of inputs {hold['input_copy_ms']:.1f} ms, of "
        f"outputs {hold['host_copy_ms']:.1f} ms |",
        f"| 3. hashing a call's inputs, in the background | {hold['input_hashing_ms']:.1f} ms on "
        f"{hold['store_threads']} threads |",
        f"| 3. finish() after the last step | {hold['finish_s'] * 1e3:.1f} ms |",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the inputs, outputs and the stand-in's work live (cuda or cpu)")
    parser.add_argument("--steps", type=int, default=20,
                        help="calls per loop: the step files of each round of phase 2, the steps without and with "
                        "a Run in phase 3 (a release generation makes tens)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="phases 1 and 2 run in turn this many times; medians are reported (a disk's speed drifts)")
    parser.add_argument("--step-ms", type=float, default=500.0,
                        help="device work per call in phase 3 (a release call takes about 6.8 s on an H200; the "
                        "stall is also reported against that)")
    parser.add_argument("--fraction", type=float, default=1.0,
                        help="scale the release contract's latent frames, text tokens and audio latents (1: release)")
    parser.add_argument("--folder", default=tempfile.gettempdir(),
                        help="where the phases write (a temporary folder inside it, removed after); put it on the "
                        "filesystem the run folders live on")
    parser.add_argument("--store-threads", type=int, default=resume.STORE_THREADS,
                        help="the store's threads hashing inputs and writing step files (h3gate.generation.resume.STORE_THREADS; "
                        "its default is this machine's)")
    parser.add_argument("-o", "--output", help="write the report as JSON here")
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.store_threads < 1 or not 0 < args.fraction <= 1:
        parser.error("--steps, --rounds and --store-threads must be >= 1, --fraction in (0, 1]")
    resume.STORE_THREADS = args.store_threads
    inputs, outputs = release_io(args.device, args.fraction)
    with tempfile.TemporaryDirectory(prefix="step-store-", dir=args.folder) as folder:
        folder = Path(folder)
        report = {"steps": args.steps, "fraction": args.fraction, "machine": machine(args.device, folder),
                  "io": describe_io(inputs, outputs)}
        report["throughput"] = throughput(folder, inputs, outputs, args.device, args.steps, args.rounds)
        report["stall"] = stall(folder / "stall", inputs, outputs, args.device, args.steps, args.step_ms)
    print(table(report))
    if args.output:
        write_json(args.output, report)


if __name__ == "__main__":
    main()
