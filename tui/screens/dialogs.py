"""Override and hold dialogs. They validate what was typed, hand a request to the app (which calls the
daemon in a worker) and show a refusal — not authorized, out of range — plainly, in place."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from aithermctl.document import all_knobs
from aithermctl.durations import check_unit, parse_duration, parse_value


class RequestDialog(ModalScreen[None]):
    """Base: ``show_error`` puts one line under the form; the app dismisses the dialog on success."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Cancel")]

    def show_error(self, text: str) -> None:
        self.query_one("#error", Static).update(text)
        self.query_one("#error", Static).set_class(bool(text), "visible")

    def _duration(self, widget_id: str) -> float:
        text = self.query_one(widget_id, Input).value.strip()
        return parse_duration(text) if text else 0.0

    def submit(self, request: dict[str, Any]) -> None:
        self.show_error("")
        self.query_one("#busy", Static).update("asking the daemon…")
        self.app.submit(request, origin=self)  # type: ignore[attr-defined]

    def done(self) -> None:
        self.query_one("#busy", Static).update("")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel":
            self.dismiss()
            return
        try:
            request = self.request(event.button.id or "")
        except ValueError as exc:
            self.show_error(str(exc))
            return
        self.submit(request)

    def request(self, button: str) -> dict[str, Any]:
        raise NotImplementedError


class OverrideDialog(RequestDialog):
    """Override one knob (daemon units: W for limits, % for fans), for a while or until cleared."""

    def __init__(self, doc: dict[str, Any] | None, knob_id: str | None = None) -> None:
        super().__init__()
        self._knobs = {k: v for k, v in all_knobs(doc or {}).items()}
        self._initial = knob_id

    def compose(self) -> ComposeResult:
        options = []
        for kid, k in self._knobs.items():
            rng = f"{k.get('min'):g}–{k.get('max'):g} {k.get('unit')}" if k.get("min") is not None else ""
            ro = "" if k.get("writable", True) else " (read-only)"
            options.append((f"{kid}  {rng}{ro}", kid))
        with Vertical(classes="dialog"):
            yield Label("Override a knob", classes="dialog-title")
            yield Select(options, prompt="knob", id="knob",
                         value=self._initial if self._initial in self._knobs else Select.NULL)
            yield Input(placeholder="value, in the knob's unit (250, 60%)", id="value")
            yield Input(placeholder="for how long (15m, 2h; empty: until cleared)", id="for")
            yield Static("", id="error", classes="error")
            yield Static("", id="busy", classes="busy")
            with Horizontal(classes="buttons"):
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Clear override", id="clear")
                yield Button("Cancel", id="cancel")

    def request(self, button: str) -> dict[str, Any]:
        knob = self.query_one("#knob", Select).value
        if knob is Select.NULL:
            raise ValueError("choose a knob")
        if button == "clear":
            return {"action": "clear_override", "knob": knob}
        text = self.query_one("#value", Input).value
        value = parse_value(text)
        check_unit(text, self._knobs.get(knob, {}).get("unit"))
        return {"action": "override", "knob": knob, "value": value, "seconds": self._duration("#for")}


class HoldDialog(RequestDialog):
    """Hold a policy on top of the active one; it ends when released, at its timeout, or (unless detached)
    when this aithermctl exits."""

    def __init__(self, policies: list[dict[str, Any]]) -> None:
        super().__init__()
        self._names = [str(p.get("name")) for p in policies]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Hold a policy", classes="dialog-title")
            yield Select([(n, n) for n in self._names], prompt="policy", id="policy")
            yield Input(placeholder="reason (shown to everyone)", id="reason")
            yield Input(placeholder="for how long (15m, 2h; empty: until released)", id="timeout")
            yield Checkbox("keep after aithermctl exits (detached)", id="detached")
            yield Static("", id="error", classes="error")
            yield Static("", id="busy", classes="busy")
            with Horizontal(classes="buttons"):
                yield Button("Hold", id="hold", variant="primary")
                yield Button("Cancel", id="cancel")

    def set_policies(self, policies: list[dict[str, Any]]) -> None:
        """Offer ``policies`` (they may arrive after the dialog opened: the list is fetched on demand)."""
        names = [str(p.get("name")) for p in policies]
        if names != self._names:
            self._names = names
            # not composed yet (compose reads self._names) or already torn down: nothing to update
            for select in self.query("#policy").results(Select):
                select.set_options([(n, n) for n in names])

    def request(self, button: str) -> dict[str, Any]:
        policy = self.query_one("#policy", Select).value
        if policy is Select.NULL:
            raise ValueError("choose a policy")
        reason = self.query_one("#reason", Input).value.strip()
        if not reason:
            raise ValueError("give a reason: everyone sees it")
        return {"action": "hold", "policy": policy, "reason": reason, "timeout_s": self._duration("#timeout"),
                "detached": self.query_one("#detached", Checkbox).value}


HELP = """\
[b]Screens[/b]
  1 o   overview: GPUs, CPU packages, board fans
  2 g   plots: temperature, power and limits (+/- zoom)
  3 p   policy: policies, holds, states and windows, why
  4 e   events: decisions, drift, faults, hotplug (f: filter)
  5 j   processes per GPU, energy today (s sort, b by job/unit)

[b]Changes[/b] (need root or polkit)
  v     override a knob, or clear an override
  h     hold a policy (ends when released, timed out, or when you quit unless detached)
  a     on the policy screen: make the selected policy active
  r     on the policy screen: release the selected hold
  ctrl+r  reload policy files

[b]Other[/b]
  ?     this help          q  quit
  tab   move between tables and fields; escape closes a dialog
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Label("aithermctl — keys", classes="dialog-title")
            yield Static(HELP)
