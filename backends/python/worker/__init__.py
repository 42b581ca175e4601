"""The process a Python model instance runs in: the main loop, the bridge to the server, the
pb_utils API."""
