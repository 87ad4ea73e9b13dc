"""StatusLine: the top line of every screen: connection, the policy in force, holds, dry run."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget


class StatusLine(Widget):
    DEFAULT_CSS = "StatusLine { height: auto; max-height: 3; background: $panel; padding: 0 1; }"
    connected: reactive[bool | None] = reactive(None, layout=True)
    detail: reactive[str] = reactive("", layout=True)
    policy: reactive[str] = reactive("")
    stale_since: reactive[str] = reactive("", layout=True)  # "HH:MM:SS" of the last values shown, when gone

    def render(self) -> Text:
        if self.connected is None:
            return Text("◌ connecting…", style="dim")
        if not self.connected:
            stale = f" · STALE: values below are from {self.stale_since}" if self.stale_since else ""
            return Text(f"○ {self.detail} — retrying{stale}", style="bold red")
        text = Text("● ", style="bold green", no_wrap=True, overflow="ellipsis")
        text.append(self.policy)
        text.truncate(max(1, self.content_size.width), overflow="ellipsis")
        return text
