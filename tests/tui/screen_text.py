"""The text of what a running Textual app shows now (a plain-text snapshot of the screen)."""

from textual.app import App


def screen_text(app: App) -> str:
    return "\n".join(strip.text.rstrip() for strip in app.screen._compositor.render_strips())
