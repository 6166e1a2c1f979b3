"""The planner: placement search, memory ledger, schedule emitters and the cost model that
turn (model, machine, config) into a Plan; re-fitting and data-parallel sharding of plans."""
