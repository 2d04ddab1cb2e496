"""Tables that show what server a run measured."""

from __future__ import annotations

import pandas as pd


def server_table(server: dict) -> pd.DataFrame:
    """One row per fact about the server, as recorded in server.json."""
    models = server.get("models_response") or {}
    model_ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)]
    max_len = [m.get("max_model_len") for m in models.get("data", []) if isinstance(m, dict)]
    rows = [
        ("mode", server.get("mode")),
        ("engine", server.get("engine")),
        ("engine version", server.get("engine_version")),
        ("base URL", server.get("base_url")),
        ("served model", server.get("served_model")),
        ("models (/v1/models)", ", ".join(str(m) for m in model_ids) or None),
        ("max model len", max_len[0] if max_len else None),
        ("tensor parallel", server.get("tp")),
        ("profiler dir", server.get("profiler_dir")),
        ("start-up (s)", server.get("startup_s")),
        ("started at", server.get("started_at")),
        ("log", server.get("log_path")),
    ]
    return pd.DataFrame(rows, columns=["field", "value"]).set_index("field")
