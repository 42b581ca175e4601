"""Model repositories on disk: config.pbtxt, version directories, the registry of loaded
versions and the manager that loads, swaps and unloads them."""
