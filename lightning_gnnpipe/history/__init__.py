"""Historical-embedding tables."""
