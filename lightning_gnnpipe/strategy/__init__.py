"""The Lightning strategy and its helpers."""
