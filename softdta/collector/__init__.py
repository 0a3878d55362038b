"""The collector: memory regions for DTA structures, the backends that expose them to translators over RoCEv2,
the control protocol that connects translators, and the query service."""
