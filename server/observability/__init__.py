"""Metrics, tracing and log settings: what the server tells about itself."""
