"""slide_ir: model specs, hardware profiles, the memory ledger, the schedule IR and the planner.

Standard library only: planning and simulating need no GPU stack.
"""

from slide_ir.ir.graph import Graph, GraphInfo, Op, OpKind, Pool, Tier, Work
from slide_ir.planning.ledger import Ledger, build_ledger
from slide_ir.planning.planner import Plan, plan, plan_from_json, plan_to_json
from slide_ir.specs.config import TrainConfig
from slide_ir.specs.hardware import Machine, load_machine, machine_names
from slide_ir.specs.model import ModelSpec
from slide_ir.specs.model_catalog import load_model, model_names

__all__ = [
    "Graph",
    "GraphInfo",
    "Ledger",
    "Machine",
    "ModelSpec",
    "Op",
    "OpKind",
    "Plan",
    "Pool",
    "Tier",
    "TrainConfig",
    "Work",
    "build_ledger",
    "load_machine",
    "load_model",
    "machine_names",
    "model_names",
    "plan",
    "plan_from_json",
    "plan_to_json",
]
