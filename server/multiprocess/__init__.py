"""--frontend-processes: extra frontend processes, and the link that hands their requests to
the model owner."""
