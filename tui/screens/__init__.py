"""Screens of the TUI: overview, plots, policy, events, dialogs and help."""
