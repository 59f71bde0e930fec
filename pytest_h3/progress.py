"""Progress bars for gate phases that take more than a few seconds, drawn past pytest's capture.

tqdm draws the bar (the field's standard, with ETA); it writes through pytest's capture manager so the bar
reaches the terminal while the test's own output stays captured.
"""

from __future__ import annotations

import sys

from tqdm import tqdm

from pytest_h3 import distribution


class Terminal:
    def __init__(self, config):
        self.config = config

    def write(self, text: str) -> None:
        """Write past pytest's output capture (the test's own output stays captured)."""
        capture = self.config.pluginmanager.getplugin("capturemanager")
        if capture is None:
            sys.stderr.write(text)
            return
        with capture.global_and_fixture_disabled():
            sys.stderr.write(text)
            sys.stderr.flush()

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def terminal(config) -> Terminal | None:
    """The stream the engine's bars and notes go to, or None in an xdist worker: workers share the controller's
    terminal, where their bars would interleave with each other's and with pytest's progress (what a worker's
    generation did, resumed or preempted, reaches the session's summary through its results)."""
    return None if distribution.is_worker(config) else Terminal(config)


class Progress:
    """``with Progress(config, label, total) as bar: bar.step("phase")`` - one tick per finished phase."""

    def __init__(self, config, label: str, total: int):
        stream = terminal(config)
        self.bar = tqdm(total=total, desc=label, unit="phase", file=stream, leave=False, dynamic_ncols=True,
                        disable=True if stream is None else None)
        self.started = False

    def step(self, phase: str) -> None:
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_postfix_str(phase)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.started:
            self.bar.update(1)
        self.bar.close()
