"""harness.measure."""
