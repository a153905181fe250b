"""HTML reports and comparisons built from stored trial records."""
