"""aithermctl: command line and terminal UI for aithermd (talks to it only over D-Bus)."""

__version__ = "0.1.0"
