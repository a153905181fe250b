"""harness.records."""
