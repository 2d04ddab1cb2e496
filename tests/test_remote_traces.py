"""`stepscope analyze s3://... / http://...` (trace.remote): traces read through fsspec from a
local S3 server (moto's server mode) and a local http.server, both on 127.0.0.1 only."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import logging
import shutil
import socket
import sys
import threading
from pathlib import Path

import pytest

from stepscope.cli import main
from stepscope.trace import remote

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

TP2 = [f"vllm-cpu-tinyllama-tp2-rank{r}.pt.trace.json.gz" for r in (0, 1)]
SECRET = "sEcReT-Value-9f3b2c7d1e"
"""The secret access key given to the S3 client: it must reach no message and no file."""


@pytest.fixture(scope="module")
def moto_endpoint():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request lines in the captured output
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, monkeypatch, tmp_path):
    """An S3 filesystem on the local moto server; the AWS settings point there and nowhere else
    (no ~/.aws read, no instance metadata asked)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "FSSPEC_S3_ANON"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def _bucket_with(s3, bucket: str, files: list[Path], prefix: str = "run1/") -> str:
    s3.mkdir(bucket)
    for f in files:
        s3.put_file(str(f), f"{bucket}/{prefix}{f.name}")
    return f"s3://{bucket}/{prefix}"


def _texts_under(folder: Path) -> str:
    return "\n".join(f.read_bytes().decode("utf-8", "replace") for f in folder.rglob("*") if f.is_file())


def test_s3_prefix_analyses_as_the_same_files_do_locally(s3, real_traces, tmp_path, capsys):
    files = [real_traces / n for n in TP2]
    url = _bucket_with(s3, "traces-ok", files)
    s3.pipe("traces-ok/run1/manifest.json", b"{}")  # a run folder's other JSON: not a trace, not fetched
    s3.pipe("traces-ok/run1/deeper/rank7.pt.trace.json.gz", b"")  # below the prefix: not read, as locally
    remote_out, local_out = tmp_path / "remote", tmp_path / "local"
    assert main(["analyze", url, "--tp", "2", "--out", str(remote_out), "--no-progress"]) == 0
    printed = capsys.readouterr()
    assert main(["analyze", *map(str, files), "--tp", "2", "--out", str(local_out), "--no-progress"]) == 0
    capsys.readouterr()
    mb = sum(f.stat().st_size for f in files) / 2**20
    assert f"fetching 2 file(s), {mb:,.1f} MB, from {url} into {remote_out / 'remote_traces' / '0'}" in printed.out
    assert not (remote_out / "remote_traces").exists()  # the copies are deleted once analysed
    got, want = (json.loads((d / "05_categorize" / "summary.json").read_text())["ranks"] for d in (remote_out, local_out))
    assert [(r["rank"], r["n_steps"], r["n_decode_steps"], r["busy_us"]) for r in got] == \
        [(r["rank"], r["n_steps"], r["n_decode_steps"], r["busy_us"]) for r in want]
    assert [r["n_decode_steps"] for r in got] == [10, 10]
    assert [Path(r["file"]).name for r in got] == TP2
    for table in ("decode_categories.csv", "rank_categories.csv"):
        assert (remote_out / "05_categorize" / table).read_text() == (local_out / "05_categorize" / table).read_text()
    # the secret key was in the environment the whole run: nothing printed or written holds it
    assert SECRET not in printed.out + printed.err
    assert SECRET not in _texts_under(remote_out)


def test_one_object_by_url_is_kept_byte_for_byte(s3, real_traces, tmp_path):
    # only the fetch is under test here: the analysis itself is the test above's. An object named
    # by its URL is taken whatever its name, as a local file given by name is.
    s3.mkdir("traces-keep")
    s3.put_file(str(real_traces / TP2[0]), "traces-keep/capture-rank0.bin")
    staging = tmp_path / "run" / remote.STAGING_DIR
    paths = ["s3://traces-keep/capture-rank0.bin", str(real_traces / TP2[1])]
    sources = remote.listed_sources(paths, None)
    with remote.fetched_traces(paths, sources, staging, None, keep=True, echo=lambda _: None) as got:
        assert got == [str(staging / "0" / "capture-rank0.bin"), str(real_traces / TP2[1])]
    assert (staging / "0" / "capture-rank0.bin").read_bytes() == (real_traces / TP2[0]).read_bytes()


def test_missing_bucket_exits_2_naming_the_url(s3, tmp_path, capsys):
    url = "s3://no-such-bucket/run1/"
    assert main(["analyze", url, "--out", str(tmp_path / "an"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}: not found: no such bucket, or nothing under this prefix")
    assert "The specified bucket does not exist" in err and "fix: check the bucket and prefix" in err
    assert SECRET not in err


def test_prefix_without_traces_exits_2(s3, tmp_path, capsys):
    s3.mkdir("traces-none")
    s3.pipe("traces-none/run1/notes.txt", b"no trace here")
    assert main(["analyze", "s3://traces-none/run1/", "--out", str(tmp_path / "an")]) == 2
    assert "s3://traces-none/run1/: no trace file there (none is named *.pt.trace.json.gz" in capsys.readouterr().err


def test_missing_credentials_are_named_not_shown(s3, tmp_path, monkeypatch, capsys):
    url = _bucket_with(s3, "traces-creds", [])
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert main(["analyze", url, "--out", str(tmp_path / "an")]) == 2
    err = capsys.readouterr().err
    assert f"{url}: no credentials found for it (NoCredentialsError" in err
    assert "AWS_ACCESS_KEY_ID" in err  # the fix names the variables


def test_unreachable_endpoint_is_named(s3, tmp_path, monkeypatch, capsys):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's retries would take 7 s
    out = tmp_path / "an"
    assert main(["analyze", "s3://traces/run1/", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s3://traces/run1/: cannot reach the storage endpoint (EndpointConnectionError")
    assert f"127.0.0.1:{port}" in err and "fix: check the network and AWS_ENDPOINT_URL" in err
    assert not out.exists()


def test_object_over_the_budget_is_refused_before_download(s3, real_traces, tmp_path, monkeypatch, capsys):
    url = _bucket_with(s3, "traces-big", [real_traces / n for n in TP2])

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded although the listing was over the budget")

    monkeypatch.setattr(remote, "download", no_download)
    out = tmp_path / "an"
    # 0.25 GB: under the interpreter's own 256 MB, so the listed 0.2 MB put the estimate over it
    assert main(["analyze", url, "--out", str(out), "--memory-budget-gb", "0.25", "--no-progress"]) == 5
    said = capsys.readouterr().out
    assert f"error: {url}: analysing 2 trace file(s) would peak at more than 0.25 GB" in said
    assert "over the memory budget of 0.25 GB; nothing was downloaded" in said
    assert not out.exists()  # refused before the run folder was made


def test_unsized_object_stops_once_past_the_cap(tmp_path):
    class Stream:
        def __init__(self):
            self.left = 3 * remote.DOWNLOAD_CHUNK_BYTES

        def read(self, n):
            n = min(n, self.left)
            self.left -= n
            return b"x" * n

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class FS:
        def open(self, path, mode, **kwargs):
            return Stream()

    obj = remote.RemoteObject("http://127.0.0.1:9/t.json", "t.json", None)
    src = remote.Source("http://127.0.0.1:9/", FS(), [obj])
    dest = tmp_path / "t.json"
    with pytest.raises(remote.MemoryBudgetExceeded, match="sent more than 10,000,000 bytes"):
        remote.download(src, obj, dest, cap_bytes=10_000_000)
    assert not dest.exists()  # the partial copy is not left behind


def test_gs_without_gcsfs_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    registry = sys.modules["fsspec.registry"]  # `fsspec.registry` is the read-only view, not the module

    monkeypatch.delitem(registry._registry, "gs", raising=False)
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # the import fails, whether or not it is installed
    assert main(["analyze", "gs://bucket/run1/", "--out", str(tmp_path / "an")]) == 2
    err = capsys.readouterr().err
    assert "gs://bucket/run1/: reading gs:// needs the gcsfs package, which is not installed" in err
    assert "fix: pip install gcsfs" in err


@pytest.fixture
def http_folder(tmp_path):
    """A folder served by http.server on 127.0.0.1 (a directory listing at '/')."""
    folder = tmp_path / "served"
    folder.mkdir()

    auth: list[str | None] = []

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            auth.append(self.headers.get("Authorization"))  # called once a request

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"127.0.0.1:{server.server_address[1]}", auth
    server.shutdown()
    thread.join()


def test_http_listing_fetches_the_trace_and_its_table(http_folder, real_traces, tmp_path):
    folder, host, auth = http_folder
    for name in ("vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz",
                 "vllm-cpu-tinyllama-tp1-nostack-rank0.profiler_out.txt"):
        shutil.copy(real_traces / name, folder / name)
    (folder / "summary.json").write_text("{}")  # a run folder's own JSON: not a trace
    password = "pw-" + SECRET
    url = f"http://reader:{password}@{host}/"
    lines: list[str] = []
    staging = tmp_path / "run" / remote.STAGING_DIR
    with remote.fetched_traces([url], remote.listed_sources([url], None), staging, None, echo=lines.append) as got:
        assert [Path(p).name for p in got] == ["vllm-cpu-tinyllama-tp1-nostack-rank0.pt.trace.json.gz",
                                               "vllm-cpu-tinyllama-tp1-nostack-rank0.profiler_out.txt"]
        for p in got:
            assert Path(p).read_bytes() == (folder / Path(p).name).read_bytes()
    assert not staging.exists()
    assert lines[0].startswith(f"fetching 2 file(s), 0.2 MB, from http://{host}/ into ")
    assert password not in "\n".join(lines) and "reader" not in "\n".join(lines)
    # the URL's user:pass@ went as basic auth on every request (listing, sizes, copies)
    token = base64.b64encode(f"reader:{password}".encode()).decode()
    assert auth and set(auth) == {f"Basic {token}"}


def test_http_missing_file_names_the_url_without_its_password(http_folder, tmp_path, capsys):
    _, host, _ = http_folder
    assert main(["analyze", f"http://reader:pw-{SECRET}@{host}/gone.pt.trace.json.gz",
                 "--out", str(tmp_path / "an")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: http://{host}/gone.pt.trace.json.gz: not found")
    assert SECRET not in err and "reader" not in err
