"""Start the TUI against the daemon on a bus (``aithermctl``, ``aithermctl top``).

The screen needs a terminal on stdin and stdout: without one (``aithermctl </dev/null | cat``, a cron job,
a pipe) Textual would draw escape codes into the pipe and wait for keys forever, so that is a usage error
(exit 2) naming the command that prints instead.
"""

from __future__ import annotations

import sys

NO_TERMINAL = "aithermctl's screen needs a terminal; try `aithermctl status`"


def has_terminal() -> bool:
    """Whether stdin and stdout are both terminals."""
    try:
        return sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty()
    except (ValueError, OSError):  # a closed stream
        return False


def run_tui(bus: str) -> int:
    if not has_terminal():
        print(NO_TERMINAL, file=sys.stderr)
        return 2
    from aithermctl.app import AithermApp
    from aithermctl.client import DaemonClient

    app = AithermApp(DaemonClient(bus))
    app.run()
    return int(app.return_code or 0)
