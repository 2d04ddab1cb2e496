"""Stage 06: the report, its figures, and run comparison."""
