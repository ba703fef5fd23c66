"""The progress bar the command line draws on a terminal."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """A one-line progress bar on a terminal, shown once the runs have taken
    ``delay`` seconds and redrawn at most every ``interval`` seconds."""

    def __init__(self, total: int, stream: TextIO, delay: float = 2.0, interval: float = 0.1) -> None:
        self.total, self.stream, self.interval = total, stream, interval
        self.drawn = time.monotonic() + delay - interval  # the first draw comes after ``delay``
        self.shown = False
        self.done = 0  # requests of the runs already finished
        self.label = ""

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.drawn < self.interval:
            return
        self.drawn = now
        self.shown = True
        fraction = min((self.done + done) / max(self.total, 1), 1.0)
        bar = "#" * int(30 * fraction)
        self.stream.write(f"\r[{bar:<30}] {fraction:4.0%} {self.label}")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
