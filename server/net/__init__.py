"""Sockets shared by the frontends: the listeners and the bounds on HTTP connections."""
