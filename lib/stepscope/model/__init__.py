"""Model architecture: shapes, collectives and bytes per decode step under TP."""
