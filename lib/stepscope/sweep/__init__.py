"""Stage 01: closed- and open-loop load against the server; serving metrics."""
