"""Subcommands of `slide`, in the order `slide --help` lists them."""

from slide.commands import (
    calibrate,
    capacity,
    compare,
    compare_trace,
    critical_batch,
    data,
    demo,
    layout,
    machines,
    models,
    plan,
    rollout,
    simulate,
    sweep,
    train,
)

COMMANDS = (
    demo,
    plan,
    simulate,
    sweep,
    critical_batch,
    capacity,
    compare,
    compare_trace,
    layout,
    rollout,
    calibrate,
    data,
    train,
    models,
    machines,
)
