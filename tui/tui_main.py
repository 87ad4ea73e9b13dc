"""Start the TUI against the daemon on a bus (``aithermctl``, ``aithermctl top``)."""

from __future__ import annotations


def run_tui(bus: str) -> int:
    from aithermctl.app import AithermApp
    from aithermctl.client import DaemonClient

    app = AithermApp(DaemonClient(bus))
    app.run()
    return int(app.return_code or 0)
