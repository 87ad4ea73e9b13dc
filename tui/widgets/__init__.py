"""Widgets of the TUI: each renders data it is given and never fetches."""
