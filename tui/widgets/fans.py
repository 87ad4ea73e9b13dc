"""BoardFans: board fans with their speed (RPM), pwm duty (%) and what drives them."""

from __future__ import annotations

from textual.widgets import DataTable

from aithermctl.document import BoardFanView, fmt


class BoardFans(DataTable):
    DEFAULT_CSS = "BoardFans { height: auto; max-height: 12; border: round $secondary; }"

    def on_mount(self) -> None:
        self.border_title = "Board fans"
        self.cursor_type = "row"
        self.add_columns("fan", "speed", "duty", "source")

    def show(self, fans: tuple[BoardFanView, ...]) -> None:
        rows = [(f.label, fmt(f.rpm, "RPM") if f.status == "ok" else f"! {f.status}",
                 fmt(f.duty_pct, "%"), f.source) for f in fans]
        if rows == getattr(self, "_rows", None):
            return
        self._rows = rows
        self.clear()
        for f, row in zip(fans, rows, strict=True):
            self.add_row(*row, key=f.id)
