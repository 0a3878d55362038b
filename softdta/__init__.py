"""softdta: Direct Telemetry Access in software."""

__version__ = "0.1.0"
