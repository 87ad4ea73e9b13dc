"""Watchers beside the tick: the fast lane, udev hotplug, logind suspend/resume (docs/design.md)."""
