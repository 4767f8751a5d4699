"""Device health: a device marked unhealthy empties itself and stays free of new work (DESIGN.md §2.3)."""
