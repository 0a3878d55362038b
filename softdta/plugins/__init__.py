"""Primitives beyond the paper's, written against `softdta.core.primitives` (docs/primitives.md)."""
