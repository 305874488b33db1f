"""The runstate server: the deterministic core (actors), the replicated log (cluster) and the
process (node). Imports nothing of the SDK."""
