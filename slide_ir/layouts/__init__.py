"""The layout planner: tensor, pipeline, data and expert parallel layouts of a model over a
cluster, ranked by predicted step time (pure Python, independent of the sliding planner)."""
