"""Subcommands of `slide`, in the order `slide --help` lists them."""

from slide.commands import machines, models, plan

COMMANDS = (plan, models, machines)
