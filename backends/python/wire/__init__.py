"""The wire both ends of a Python model use: framed messages, shared-memory rings, one socket
for many waiters."""
