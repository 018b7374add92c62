"""Adapters that make PyG models splittable into stages."""
