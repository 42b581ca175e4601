"""Where an object-store model repository is: Triton's `s3://` spellings, parsed and checked.

Accepted, as Triton does: `s3://bucket[/prefix]` (AWS, region from AWS_DEFAULT_REGION),
`s3://host:port/bucket[/prefix]` (an S3-compatible endpoint over HTTP) and
`s3://https://host:port/bucket[/prefix]` (the same over HTTPS; `s3://http://...` is the
default spelled out). Credentials come from the environment only: a URL that carries any
(`user:secret@host`) or a query string is refused, and an error never repeats such a URL.
Triton's other stores, `gs://` and `as://`, are refused with a message that says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
# S3's rules are stricter for new buckets; older ones may hold capitals and underscores.
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
_MAX_URL = 2048

REFUSED = {
    "gs": "Google Cloud Storage repositories (gs://) are not supported; "
    "copy the repository to local disk or to an S3-compatible store (s3://)",
    "as": "Azure Storage repositories (as://) are not supported; "
    "copy the repository to local disk or to an S3-compatible store (s3://)",
}


@dataclass(frozen=True)
class S3Location:
    """A bucket, a key prefix ("" or ending in "/"), and an endpoint (None: AWS's own)."""

    bucket: str
    prefix: str = ""
    endpoint: str | None = None

    def __str__(self) -> str:
        """The URL as the user spelled it, rebuilt from its parts (so it never holds more)."""
        where = f"{self.endpoint}/" if self.endpoint else ""
        if where.startswith("http://"):
            where = where[len("http://") :]
        return f"s3://{where}{self.bucket}/{self.prefix}".rstrip("/")


def is_url(text: str) -> bool:
    """Whether a --model-repository value names a store (`scheme://...`) rather than a path."""
    return _SCHEME.match(text) is not None


def scrubbed(text: str) -> str:
    """A URL fit to show in an error: no user information, no query, bounded length."""
    text = re.sub(r"//[^/@]*@", "//", text)
    return text.split("?", 1)[0].split("#", 1)[0][:200]


def parse_repository_url(text: str) -> S3Location:
    """Parse an `s3://` repository URL. Raises ValueError saying what is wrong."""
    match = _SCHEME.match(text)
    if match is None:
        raise ValueError(f"'{scrubbed(text)}' is not a URL")
    scheme = match.group(1).lower()
    if scheme in REFUSED:
        raise ValueError(f"--model-repository {scheme}://...: {REFUSED[scheme]}")
    if scheme != "s3":
        raise ValueError(
            f"--model-repository {scheme}://...: unknown repository scheme; "
            "use a local path or s3://"
        )
    if len(text) > _MAX_URL:
        raise ValueError(f"--model-repository: the URL is longer than {_MAX_URL} characters")
    if "@" in text or "?" in text or "#" in text:
        raise ValueError(
            "--model-repository s3://...: credentials, queries and fragments are not accepted "
            "in the URL; set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN, "
            "AWS_DEFAULT_REGION) in the environment"
        )
    rest = text[match.end() :]
    endpoint_scheme = "http"
    inner = _SCHEME.match(rest)
    if inner is not None:
        endpoint_scheme = inner.group(1).lower()
        if endpoint_scheme not in ("http", "https"):
            raise ValueError(
                f"'{text}': the endpoint must be http:// or https://, not {endpoint_scheme}://"
            )
        rest = rest[inner.end() :]
        if ":" not in rest.split("/", 1)[0]:
            raise ValueError(f"'{text}': an endpoint is host:port, e.g. s3://https://host:443/b")
    first, _, path = rest.partition("/")
    endpoint = None
    if ":" in first:
        host, _, port = first.rpartition(":")
        if not _HOST.match(host) or not port.isascii() or not port.isdigit():
            raise ValueError(f"'{text}': expected s3://host:port/bucket/path")
        if not 0 < int(port) < 65536:
            raise ValueError(f"'{text}': port {port} is out of range")
        endpoint = f"{endpoint_scheme}://{host}:{int(port)}"
        bucket, _, path = path.partition("/")
    else:
        bucket = first
    if not bucket:
        raise ValueError(f"'{text}': no bucket named (s3://bucket/path)")
    if not _BUCKET.match(bucket):
        raise ValueError(f"'{text}': '{bucket}' is not a valid bucket name")
    parts = path.rstrip("/").split("/") if path.strip("/") else []
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"'{text}': the path may not hold empty, '.' or '..' segments")
    prefix = "/".join(parts) + "/" if parts else ""
    return S3Location(bucket, prefix, endpoint)
