"""Subcommands of `slide`, in the order `slide --help` lists them."""

from slide.commands import (
    calibrate,
    capacity,
    compare,
    critical_batch,
    demo,
    machines,
    models,
    plan,
    simulate,
    sweep,
)

COMMANDS = (
    demo,
    plan,
    simulate,
    sweep,
    critical_batch,
    capacity,
    compare,
    calibrate,
    models,
    machines,
)
