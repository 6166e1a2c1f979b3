"""simulator: predicted traces of schedule graphs (simpy), and the analyses built on them."""

from simulator.engine import simulate
from simulator.run import SimResult, simulate_plan

__all__ = ["SimResult", "simulate", "simulate_plan"]
