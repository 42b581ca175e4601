"""--frontend-processes: extra frontend processes and the frontend link that hands their
requests to the model owner."""
