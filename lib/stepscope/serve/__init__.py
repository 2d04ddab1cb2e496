"""Stage 00: start or attach to the inference server, and keep it for the run."""
