"""harness.launch."""
