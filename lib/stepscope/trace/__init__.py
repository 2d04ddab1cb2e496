"""Stage 05: trace loading, kernel categories, exact per-step accounting."""
