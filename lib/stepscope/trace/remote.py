"""Traces in object storage for `stepscope analyze`: `s3://`, `gs://`, `http(s)://` (fsspec).

Each trace is copied into the run folder and read by the local loader, so every local guard holds; the listed
sizes are held to the budget first. docs/trace-analysis.md#traces-in-object-storage.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator
from urllib.parse import unquote, urlsplit, urlunsplit

from stepscope.errors import StepscopeError, TraceError
from stepscope.redaction import REDACTED, scrub
from stepscope.trace.budget import (IMPORTS_BYTES, PEAK_BYTES_PER_JSON_BYTE, MemoryBudgetExceeded,
                                    default_budget_bytes, estimate_peak_bytes)

SCHEMES = ("s3", "gs", "gcs", "http", "https")
PACKAGE_FOR_SCHEME = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}
STAGING_DIR = "remote_traces"
"""The run folder's subfolder the copies go to, one numbered folder per URL given."""
DOWNLOAD_CHUNK_BYTES = 8 << 20
CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "DefaultCredentialsError", "RefreshError")
"""Class names of the errors botocore and google-auth raise when no usable credentials are found."""
CONNECTION_ERRORS = ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                     "ServerDisconnectedError", "TimeoutError", "ConnectionError")


def is_url(text: str | Path) -> bool:
    """True for a path `analyze` reads through fsspec (s3://, gs://, http(s)://)."""
    return isinstance(text, str) and urlsplit(text).scheme.lower() in SCHEMES and "://" in text


def shown(url: str) -> str:
    """The URL as messages and files may show it: no `user:pass@`, secrets scrubbed."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return scrub(urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)))


@dataclass(frozen=True)
class RemoteObject:
    """One file under a URL, as its listing gives it."""

    path: str
    """What the filesystem opens (a bucket path, or the full http URL)."""
    name: str
    """Its base name, which the copy keeps: the rank and stage are read from it."""
    size_bytes: int | None
    """None where the server does not say (some http servers)."""


@dataclass
class Source:
    """One URL given: its filesystem and the trace files under it."""

    url: str
    """shown(url): safe to print."""
    fs: Any
    objects: list[RemoteObject]

    @property
    def listed_bytes(self) -> int:
        return sum(o.size_bytes or 0 for o in self.objects)


@contextlib.contextmanager
def remote_errors(url: str, secrets: tuple[str, ...] = ()) -> Iterator[None]:
    """Turn what fsspec and its backends raise into one StepscopeError naming the URL (never
    its credentials: `secrets` are blanked besides what `scrub` removes)."""
    try:
        yield
    except StepscopeError:
        raise
    except Exception as exc:  # noqa: BLE001 -- every backend raises its own types
        text = f"{type(exc).__name__}: {exc}"
        for s in secrets:
            text = text.replace(s, REDACTED)
        message, hint = _explain(exc)
        raise TraceError(f"{message} ({text})", where=shown(url), hint=hint) from None


def _explain(exc: BaseException) -> tuple[str, str]:
    """(what went wrong, how to fix it) for a backend's error."""
    names = {c.__name__ for c in type(exc).__mro__}
    if names & set(CREDENTIAL_ERRORS):
        return ("no credentials found for it",
                "s3: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or FSSPEC_S3_ANON=true for "
                "a public bucket; gs: GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default login`")
    if isinstance(exc, PermissionError) or getattr(exc, "status", None) in (401, 403):
        return ("access denied", "check that the credentials in the environment may list and read this prefix")
    if isinstance(exc, FileNotFoundError):
        return ("not found: no such bucket, or nothing under this prefix",
                "check the bucket and prefix (`aws s3 ls`, `gcloud storage ls`)")
    if names & set(CONNECTION_ERRORS):
        return ("cannot reach the storage endpoint",
                "check the network and AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 where one is set")
    return "could not list or read it", "check the URL and the credentials in the environment"


def open_source(url: str) -> Source:
    """List the trace files under `url` (a prefix ending in '/', or one object)."""
    fs, path, secrets = _filesystem(url)
    with remote_errors(url, secrets):
        objects, under_prefix = _list(fs, path, url)
    # one object named is taken whatever its name, as a local file given by name is
    names = select_names([o.name for o in objects]) if under_prefix else [o.name for o in objects if _usable(o.name)]
    picked = [o for n in names for o in objects if o.name == n]
    if not picked:
        from stepscope.trace.analyze import TRACE_GLOBS

        raise TraceError("no trace file there (none is named " + ", ".join(TRACE_GLOBS) + ")", where=shown(url),
                         hint="pass the prefix that holds the rank traces, ending in '/'")
    with remote_errors(url, secrets):
        picked = [o if o.size_bytes is not None else _sized(fs, o) for o in picked]
    return Source(shown(url), fs, picked)


def _filesystem(url: str) -> tuple[Any, str, tuple[str, ...]]:
    """(filesystem, path in it, the secrets the URL carried). A `user:pass@` in an http URL
    becomes basic auth, so that the URL fsspec sees and echoes carries none."""
    scheme = urlsplit(url).scheme.lower()
    try:
        from fsspec import get_filesystem_class
        from fsspec.core import url_to_fs

        get_filesystem_class(scheme)
    except ImportError:
        pkg = PACKAGE_FOR_SCHEME[scheme]
        raise StepscopeError(f"reading {scheme}:// needs the {pkg} package, which is not installed",
                             where=shown(url), hint=f"pip install {pkg} (or: pip install 'stepscope[remote]')") from None
    parts = urlsplit(url)
    user, _, password = parts.netloc.rpartition("@")[0].partition(":")
    options: dict[str, Any] = {"skip_instance_cache": True}  # the environment (endpoint, keys) may have changed
    if user and scheme not in ("http", "https"):
        raise StepscopeError(f"credentials in a {scheme}:// URL are not read", where=shown(url),
                             hint="pass them in the environment (AWS_ACCESS_KEY_ID, ...) and the URL without them")
    secrets = tuple(s for s in (user, password, unquote(user), unquote(password)) if len(s) >= 3)
    if scheme in ("http", "https"):  # the bytes as stored: a server's Content-Encoding gzip left undecoded
        options["headers"] = {"Accept-Encoding": "identity"}
    if user:
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        options["headers"]["Authorization"] = f"Basic {token}"
        secrets += (token,)
        url = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, parts.fragment))
    with remote_errors(url, secrets):
        fs, path = url_to_fs(url, **options)
    return fs, path, secrets


def _list(fs: Any, path: str, url: str) -> tuple[list[RemoteObject], bool]:
    """(the files directly under a prefix, no deeper, as a local folder is read, True), or
    ([the one object the URL names], False)."""
    if not url.endswith("/"):
        info = fs.info(path)
        if info.get("type") != "directory":
            return [_object(info)], False
    entries = fs.ls(path, detail=True)
    base = path.rstrip("/") + "/"
    # http listings are scraped links: keep those under the prefix, never another host's
    return [_object(e) for e in entries if e.get("type") == "file" and str(e["name"]).startswith(base)], True


def _object(info: dict[str, Any]) -> RemoteObject:
    name = str(info["name"])
    base = unquote(PurePosixPath(urlsplit(name).path if "://" in name else name).name)
    size = info.get("size")
    return RemoteObject(name, base, int(size) if size is not None else None)


def _sized(fs: Any, obj: RemoteObject) -> RemoteObject:
    """The object with its size asked for (an http listing gives none); None where still unknown."""
    size = fs.info(obj.path).get("size")
    return RemoteObject(obj.path, obj.name, int(size) if size is not None else None)


def select_names(names: list[str]) -> list[str]:
    """The names a local folder's discovery would take: trace globs in order, less the front end's and the run
    folder's other JSON, then the profiler_out tables."""
    from stepscope.filenames import parse_name
    from stepscope.trace.analyze import NOT_TRACES, TEXT_TABLE_GLOBS, TRACE_GLOBS

    usable = sorted(filter(_usable, set(names)))
    seen: dict[str, None] = {}
    for pat in TRACE_GLOBS:
        seen.update((n, None) for n in usable if fnmatch.fnmatchcase(n, pat)
                    and n not in NOT_TRACES and parse_name(n).kind != "frontend_trace")
    for pat in TEXT_TABLE_GLOBS:
        seen.update((n, None) for n in usable if fnmatch.fnmatchcase(n, pat))
    return list(seen)


def _usable(name: str) -> bool:
    """A name the copy can take as a file name of its own in its folder."""
    return name not in ("", ".", "..") and "\0" not in name and len(name.encode()) < 256


def budget_bytes(budget_gb: float | None) -> int:
    return default_budget_bytes() if budget_gb is None else int(budget_gb * 2**30)


def require_listed_budget(sources: list[Source], budget_gb: float | None) -> None:
    """Refuse before any download when the listed bytes alone put the estimate over the budget:
    a trace holds at least its own size of JSON, so this is the least the analysis will need."""
    budget = budget_bytes(budget_gb)
    listed = sum(s.listed_bytes for s in sources)
    estimate = estimate_peak_bytes(listed)
    if estimate <= budget:
        return
    gb = 2**30
    raise MemoryBudgetExceeded(
        f"analysing {sum(len(s.objects) for s in sources)} trace file(s) would peak at more than "
        f"{estimate / gb:.2f} GB ({PEAK_BYTES_PER_JSON_BYTE:g} x their {listed / 2**20:,.1f} MB as listed, "
        f"a compressed file counted at its own size, + {IMPORTS_BYTES >> 20} MB for the interpreter), over the "
        f"memory budget of {budget / gb:.2f} GB; nothing was downloaded",
        where=", ".join(s.url for s in sources),
        hint="raise the budget: `stepscope analyze --memory-budget-gb N`; or analyse fewer ranks at once, on a "
             "machine with more free memory")


def download(src: Source, obj: RemoteObject, dest: Path, cap_bytes: int) -> int:
    """Copy one object to `dest` by chunks; its bytes. Refused once past `cap_bytes` (its listed
    size, or what the budget leaves when the listing gave none), the partial copy deleted."""
    kwargs: dict[str, Any] = {"block_size": DOWNLOAD_CHUNK_BYTES, "cache_type": "none"}
    if obj.path.startswith(("http://", "https://")):  # one stream, no range requests (http.server has none)
        kwargs = {"block_size": 0}
    n = 0
    try:
        with remote_errors(src.url), src.fs.open(obj.path, "rb", **kwargs) as fh, open(dest, "wb") as out:
            while chunk := fh.read(DOWNLOAD_CHUNK_BYTES):
                n += len(chunk)
                if n > cap_bytes:
                    raise _over_cap(src, obj, cap_bytes)
                out.write(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return n


def _over_cap(src: Source, obj: RemoteObject, cap_bytes: int) -> StepscopeError:
    if obj.size_bytes is not None:
        return TraceError(f"{obj.name} grew past its listed {obj.size_bytes:,} bytes while it was read",
                          where=src.url, hint="it was being written: analyse it once the capture has finished")
    return MemoryBudgetExceeded(f"{obj.name} sent more than {cap_bytes:,} bytes (the server gave no size), "
                                "over what the memory budget allows; nothing was parsed", where=src.url,
                                hint="raise the budget: `stepscope analyze --memory-budget-gb N`")


def listed_sources(paths: list[str], budget_gb: float | None) -> dict[int, Source]:
    """The URLs among `paths` (by position), listed, and held to the budget by their listed
    sizes: every refusal comes before anything is downloaded or written."""
    sources = {i: open_source(p) for i, p in enumerate(paths) if is_url(p)}
    require_listed_budget(list(sources.values()), budget_gb)
    return sources


def fetch_all(sources: list[Source], staging: Path, budget_gb: float | None,
              echo: Callable[[str], None] = print) -> list[list[Path]]:
    """Download every source's files, each URL into its own numbered folder; their local paths."""
    listed = sum(s.listed_bytes for s in sources)
    staging.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(staging).free
    if listed > free:
        raise StepscopeError(f"the traces take {listed / 2**20:,.1f} MB, more than the "
                             f"{free / 2**20:,.1f} MB free where they would be copied", where=str(staging),
                             hint="pass --out on a disk with room")
    # bytes an unsized object may bring: what the budget leaves after the listed ones
    spare = int((budget_bytes(budget_gb) - IMPORTS_BYTES) / PEAK_BYTES_PER_JSON_BYTE) - listed
    out: list[list[Path]] = []
    for i, src in enumerate(sources):
        folder = staging / str(i)
        folder.mkdir(exist_ok=True)
        echo(f"fetching {len(src.objects)} file(s), {src.listed_bytes / 2**20:,.1f} MB, from {src.url} into {folder}")
        paths = []
        for obj in src.objects:
            cap = obj.size_bytes if obj.size_bytes is not None else max(0, spare)
            got = download(src, obj, folder / obj.name, cap)
            spare -= got if obj.size_bytes is None else 0
            paths.append(folder / obj.name)
        out.append(paths)
    return out


@contextlib.contextmanager
def fetched_traces(paths: list[str], sources: dict[int, Source], staging: Path, budget_gb: float | None, *,
                   keep: bool = False, echo: Callable[[str], None] = print) -> Iterator[list[str]]:
    """`paths` with each URL (`sources`, from listed_sources) replaced by local copies of its
    trace files in `staging`, deleted on the way out unless `keep`. Local paths pass through."""
    try:
        fetched = dict(zip(sources, fetch_all(list(sources.values()), staging, budget_gb, echo)))
        yield [str(f) for i, p in enumerate(paths) for f in (fetched[i] if i in fetched else [p])]
    finally:
        if not keep and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
            echo(f"deleted the copies in {staging} (--keep-downloads keeps them)")
