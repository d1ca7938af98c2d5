"""The ``pyarrow.fs`` filesystem of a checkpoint location.

A plain path is a local directory; a URI is whatever ``pyarrow.fs`` makes of it,
except ``s3://``, which is configured from the usual AWS environment variables
(``pyarrow`` reads the credentials itself, but not the endpoint):

- ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``: an S3-compatible endpoint
  (MinIO, a moto server, a VPC endpoint), ``http://`` or ``https://``;
- ``AWS_REGION`` or ``AWS_DEFAULT_REGION``: the bucket's region;
- ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE``: credentials, as the AWS SDK reads them.

``options`` (from a data source's options, say) take precedence over the
environment: ``endpoint``, ``region``, ``access_key``, ``secret_key``,
``session_token``. An ``s3://`` URI with a query string or credentials
(``s3://KEY:SECRET@bucket/path?endpoint_override=host:port&scheme=http``) is
``pyarrow``'s own URI syntax and is passed to it as it is: that is how a
configuration reaches Spark's executors when their environment cannot be set.
Whatever prints a location (an error, ``relstate inspect``) prints
:func:`redact`'s form of it, without the credentials.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from urllib.parse import urlsplit

import pyarrow.fs as pafs

__all__ = ["S3_OPTIONS", "filesystem_for", "redact", "s3_filesystem", "write_atomically"]

#: The options :func:`s3_filesystem` takes.
S3_OPTIONS = ("endpoint", "region", "access_key", "secret_key", "session_token")


#: A URI query parameter that holds a secret: its value is never printed.
_SECRET_PARAM = re.compile(r"(?i)([?&][^=&#]*(?:key|secret|token|password)[^=&#]*=)[^&#]*")


def redact(location: str) -> str:
    """``location`` as it may be printed: a URI's credentials
    (``s3://KEY:SECRET@bucket``) and any query parameter that names a key,
    secret, token or password replaced by ``***``; a plain path unchanged."""
    scheme, sep, rest = location.partition("://")
    if not sep:
        return location
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    authority, tail = rest[:end], rest[end:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return _SECRET_PARAM.sub(r"\1***", f"{scheme}://{authority}{tail}")


def _first(options: Mapping[str, str], key: str, *env: str) -> str | None:
    if options.get(key):
        return options[key]
    for name in env:
        value = os.environ.get(name)
        if value:
            return value
    return None


def s3_filesystem(options: Mapping[str, str] | None = None) -> pafs.S3FileSystem:
    """An S3 filesystem configured from ``options`` and the environment."""
    opts = dict(options or {})
    kwargs: dict[str, object] = {}
    endpoint = _first(opts, "endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    region = _first(opts, "region", "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    access, secret = opts.get("access_key"), opts.get("secret_key")
    if access and secret:
        kwargs["access_key"] = access
        kwargs["secret_key"] = secret
        if opts.get("session_token"):
            kwargs["session_token"] = opts["session_token"]
    return pafs.S3FileSystem(**kwargs)


def filesystem_for(
    location: str, options: Mapping[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """The filesystem of ``location`` and the path on it (no trailing ``/``)."""
    scheme, _, rest = location.partition("://")
    if scheme == "s3" and "?" not in rest and "@" not in rest.split("/", 1)[0]:
        return s3_filesystem(options), rest.rstrip("/")
    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(location)


def write_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all: a temporary file, then a move."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, path)
