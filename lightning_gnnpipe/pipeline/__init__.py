"""Split a GNN into stages; stage modules, schedules and the last stage's loss."""
