"""aithermd: thermal and power management daemon for Linux AI workstations."""

__version__ = "0.1.0"
