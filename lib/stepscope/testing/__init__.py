"""Stand-ins for what a test cannot run here; not part of stepscope's public API.

- `fake_server.FakeServer`: an OpenAI-compatible SSE server with scripted timing and
  failures (no model), for the sweep client's tests and `benchmarks/loadgen.py`.
- `synthetic.make_synthetic_run`: a hand-made run folder that follows every artifact's
  schema (`stepscope.schema`), with invented numbers shaped like an 8-GPU campaign, for
  report and compare tests and previews.

Both are fakes by name; nothing in `lib/stepscope` outside this package imports them.
"""
