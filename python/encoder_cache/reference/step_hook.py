"""The twin of the Rust managers' step hook: a callable run at the end of
``get_freed_mm_hashes()`` (once per scheduler step), which returns how many
seconds it can wait before it runs again (``None``: the next step)."""

from __future__ import annotations

import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


class StepHooked:
    """``set_step_hook`` and the call of a due hook, for a manager class."""

    _step_hook: Callable[[Any], float | None] | None = None
    _step_hook_due: float | None = None
    _step_hook_running = False

    def set_step_hook(self, hook: Callable[[Any], float | None] | None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"hook must be callable, not {type(hook).__name__}")
        self._step_hook, self._step_hook_due, self._step_hook_running = hook, None, False

    def _run_step_hook(self) -> None:
        """Runs the hook if it is due (and not running: a step it makes does
        not run it again); an exception it raises is reported, not raised."""
        hook = self._step_hook
        if hook is None or self._step_hook_running:
            return
        if self._step_hook_due is not None and time.monotonic() < self._step_hook_due:
            return
        self._step_hook_running = True
        wait = None
        try:
            wait = _seconds(hook(self))
        except Exception:  # reported as CPython reports an unraisable exception; the wait stays None
            print(f"Exception ignored in: {hook!r}", file=sys.stderr)
            traceback.print_exc()
        finally:
            if self._step_hook is hook:
                self._step_hook_running = False
                self._step_hook_due = None if wait is None else time.monotonic() + wait


def _seconds(wait: object) -> float | None:
    """A hook's wait: None, or an int or float of seconds, finite and >= 0."""
    if wait is None:
        return None
    if isinstance(wait, (int, float)) and not isinstance(wait, bool):
        with contextlib.suppress(OverflowError):
            if math.isfinite(wait) and wait >= 0:
                return float(wait)
    raise ValueError(f"a step hook returns seconds >= 0 or None, got {wait!r}")
