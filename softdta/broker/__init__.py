"""The message broker the collector exports telemetry to: NATS JetStream (docs/export.md)."""
