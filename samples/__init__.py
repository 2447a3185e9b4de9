"""Tiny sample checkpoints of every expert layout (see samples/README.md)."""
