"""The daemon process: lifecycle, the scheduler, the tick, the world, the operator's state, sd_notify.

The only package that knows the order of things (docs/design.md).
"""
