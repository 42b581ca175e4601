"""Triton's sequence batcher: its config, the slots and backlog of live sequences, the scheduler."""
