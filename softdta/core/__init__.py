"""The sans-IO core. Importing it registers the built-in primitives (`softdta.core.registry`)."""

from softdta.core import primitives  # noqa: F401  (registers the built-ins)
