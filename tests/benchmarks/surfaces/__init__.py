"""Simulated response surfaces: a plan (dict, as in a record's "plan") and a repeat
number -> what a trial of it would report, for replaying searches without a GPU.
`h100` holds the project's two H100 surfaces and states their assumptions."""
