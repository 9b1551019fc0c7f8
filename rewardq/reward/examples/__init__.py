"""Example managers that need the whole trajectory (not loaded unless named)."""
