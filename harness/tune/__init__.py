"""harness.tune."""
