"""The server process: settings and CLI, the core API, HTTP and gRPC frontends, metrics."""
