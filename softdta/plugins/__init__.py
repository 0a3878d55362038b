"""Primitives beyond the paper's, written against `softdta.primitives` (docs/primitives.md)."""
