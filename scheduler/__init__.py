"""Per-model-version admission, queues, dynamic batching and the instance pool."""
