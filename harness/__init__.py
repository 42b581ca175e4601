"""Test-support code that tests/ and bench/ both use: server processes started and stopped by pid,
process-tree inspection, and a scheduler that answers at once. Not shipped with the server."""
