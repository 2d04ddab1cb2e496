"""Stand-ins for what a test cannot run here (a fake server, a synthetic run folder); not public API, and
nothing outside this package imports them."""
