"""Split a GNN into stages; stage modules, schedules, the last stage's loss, and this rank's pipeline runtime."""
