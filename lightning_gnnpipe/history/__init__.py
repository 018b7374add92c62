"""Historical-embedding tables, stale halo gradients, and their lifecycle over an epoch (refresh, staleness)."""
