"""The boto3 side of S3 repositories: the client, and its errors in words without secrets.

Credentials are boto3's: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_DEFAULT_REGION, as Triton reads them) or boto3's other usual sources.
They are never logged: boto3's own loggers are held at WARNING (their DEBUG lines carry request
headers), and every message made from an error goes through `redacted()`. boto3 is imported
only when a client is made, so a server without s3:// repositories never loads it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from repository.s3_location import S3Location

_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
_QUIET_LOGGERS = ("boto3", "botocore", "s3transfer", "urllib3")

# (location, timeout in seconds) -> an S3 client (tests wrap the real one)
ClientFactory = Callable[[S3Location, float], Any]


def redacted(text: str) -> str:
    """`text` without the values of the credential variables (belt and braces: neither boto3's
    errors nor ours are known to quote them)."""
    for name in _SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


def default_client(location: S3Location, timeout_secs: float) -> Any:
    """A boto3 S3 client for `location`: that timeout to connect and per read, 3 tries."""
    import boto3
    from botocore.config import Config

    for name in _QUIET_LOGGERS:  # their DEBUG lines carry request headers
        logging.getLogger(name).setLevel(logging.WARNING)
    config = Config(
        connect_timeout=timeout_secs,
        read_timeout=timeout_secs,
        retries={"max_attempts": 3, "mode": "standard"},
        s3={"addressing_style": "path"} if location.endpoint else {},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=location.endpoint,
        region_name=os.environ.get("AWS_DEFAULT_REGION") or None,
        config=config,
    )


def describe(exc: BaseException, location: S3Location) -> str:
    """What went wrong, in words an operator can act on, without credentials."""
    response = getattr(exc, "response", None)
    code = ""
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    name = type(exc).__name__
    if code == "NoSuchBucket":
        text = f"bucket '{location.bucket}' does not exist"
    elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
        text = (
            f"access denied ({code}): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY "
            "and AWS_SESSION_TOKEN"
        )
    elif name == "NoCredentialsError":
        text = "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"):
        text = f"cannot reach {location.endpoint or 'S3'}: {exc}"
    else:
        text = f"{name}: {exc}"
    return redacted(text)
