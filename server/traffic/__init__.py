"""Gray release in one room: traffic policies, weighted splits, canaries and shadow copies."""
