"""The core the frontends call: its interface, the in-process implementation, the one infer
path, client shared-memory regions."""
