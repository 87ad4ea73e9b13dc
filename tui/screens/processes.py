"""Processes: per GPU its memory and the processes on it (PID, user, SM %, GPU memory, W, energy so far,
Slurm job or unit, command), sortable; below, today's energy by Slurm job or unit from the daemon's
history. The process document comes with each snapshot (``"processes"`` in ``GetSnapshot``); the report is
fetched by the app while this screen is shown."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static

from aithermctl.document import fmt
from aithermctl.processes import SORT_KEYS, gib, gpu_processes, memory_text, processes_of
from aithermctl.screens.base import DataScreen
from aithermctl.state import TuiState

COLUMNS = (("GPU", None), ("PID", "pid"), ("USER", "user"), ("SM", "sm"), ("GPU MEM", "memory"),
           ("W", "watts"), ("kJ", "joules"), ("JOB / UNIT", None), ("COMMAND", "command"))
REPORT_BY = ("job", "unit", "process")


class ProcessesScreen(DataScreen):
    # the tables' titles name these keys: the footer keeps q Quit on 80 columns
    BINDINGS = [Binding("s", "sort", "Sort", show=False), Binding("b", "report_by", "Report by", show=False)]

    def __init__(self) -> None:
        super().__init__()
        self.sort = "watts"
        self.report_by = "job"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="processes-body"):
            yield Static("", id="processes-head")
            yield DataTable(id="processes", cursor_type="row", zebra_stripes=True)
            yield DataTable(id="energy-report", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one("#processes", DataTable).add_columns(*(name for name, _ in COLUMNS))
        self.query_one("#energy-report", DataTable).add_columns("name", "kWh", "cost", "users")
        self._titles()

    def _titles(self) -> None:
        self.query_one("#processes", DataTable).border_title = f"Processes per GPU (sorted by {self.sort}; s)"
        self.query_one("#energy-report", DataTable).border_title = (
            f"Energy today by {self.report_by} (b)")

    def on_screen_resume(self) -> None:
        super().on_screen_resume()
        self.app.refresh_energy_report(self.report_by)  # type: ignore[attr-defined]

    def action_sort(self) -> None:
        self.sort = SORT_KEYS[(SORT_KEYS.index(self.sort) + 1) % len(SORT_KEYS)]
        self._titles()
        self.show(self.app.state)  # type: ignore[attr-defined]

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = COLUMNS[event.column_index][1]
        if key is not None and event.data_table.id == "processes":
            self.sort = key
            self._titles()
            self.show(self.app.state)  # type: ignore[attr-defined]

    def action_report_by(self) -> None:
        self.report_by = REPORT_BY[(REPORT_BY.index(self.report_by) + 1) % len(REPORT_BY)]
        self._titles()
        self.app.refresh_energy_report(self.report_by)  # type: ignore[attr-defined]

    def show_body(self, state: TuiState) -> None:
        head = self.query_one("#processes-head", Static)
        table = self.query_one("#processes", DataTable)
        table.clear()
        proc = processes_of(state.doc or {})
        if proc is None:
            head.update("This daemon accounts no energy per process (or has not finished its first pass).")
        else:
            gpus = gpu_processes(proc, self.sort)
            head.update("  ".join(f"{g.id} {memory_text(g)}" + (f" ({g.basis})" if g.basis else "")
                                  + (f" ! {g.note}" if g.note else "") for g in gpus) or "no GPU")
            for g in gpus:
                for r in g.rows:
                    table.add_row(g.id, str(r.pid), r.user, fmt(r.sm_pct, "%"), f"{gib(r.memory_bytes)} GiB",
                                  f"{r.watts:.1f}", f"{r.joules / 1000:.1f}", r.group, Text(r.command))
        report = state.energy_report
        rtable = self.query_one("#energy-report", DataTable)
        rtable.clear()
        if report is not None and report.get("by") == self.report_by:
            for row in report.get("rows") or ():
                cost = row.get("cost")
                rtable.add_row(str(row.get("name")), f"{float(row.get('kwh') or 0):.4f}",
                               "—" if cost is None else f"{cost:.2f} {report.get('currency') or ''}".strip(),
                               ", ".join(row.get("users") or ()))
