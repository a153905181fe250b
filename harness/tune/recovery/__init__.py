"""What stopped or dead workers left, and sharing a study: resume, the storage (and a
database that goes away), the trials a worker holds, helper workers, node followers."""
