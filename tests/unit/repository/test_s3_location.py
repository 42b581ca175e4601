"""--model-repository URLs: Triton's s3:// spellings parsed, everything else refused by name."""

from __future__ import annotations

import pytest

from repository.s3_location import S3Location, is_url, parse_repository_url, scrubbed
from server.cli import settings_from_args


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", S3Location("bucket")),
        ("s3://bucket/", S3Location("bucket")),
        ("s3://bucket/a/b/", S3Location("bucket", "a/b/")),
        ("s3://localhost:9000/bkt/models", S3Location("bkt", "models/", "http://localhost:9000")),
        ("s3://http://10.0.0.1:80/bkt", S3Location("bkt", "", "http://10.0.0.1:80")),
        ("s3://https://minio.svc:443/bkt/x", S3Location("bkt", "x/", "https://minio.svc:443")),
    ],
)
def test_triton_spellings_parse(url: str, expected: S3Location) -> None:
    assert parse_repository_url(url) == expected


def test_the_shown_url_is_rebuilt_from_its_parts() -> None:
    assert str(parse_repository_url("s3://localhost:9000/bkt/models/")) == (
        "s3://localhost:9000/bkt/models"
    )
    assert str(parse_repository_url("s3://https://h:443/bkt")) == "s3://https://h:443/bkt"


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("gs://bucket/m", "Google Cloud Storage repositories (gs://) are not supported"),
        ("as://acct/container", "Azure Storage repositories (as://) are not supported"),
        ("ftp://host/x", "unknown repository scheme"),
        ("s3://", "no bucket named"),
        ("s3://host:70000/b", "port 70000 is out of range"),
        ("s3://bkt/a//c", "empty, '.' or '..' segments"),
        ("s3://bkt/../etc", "empty, '.' or '..' segments"),
        ("s3://ab", "is not a valid bucket name"),
        ("s3://ftp://h:1/b", "must be http:// or https://"),
        ("s3://b/p?x-amz-security-token=tok", "credentials, queries and fragments"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: str, words: str) -> None:
    with pytest.raises(ValueError, match=None) as refused:
        parse_repository_url(url)
    assert words in str(refused.value)


def test_a_url_with_credentials_is_refused_without_repeating_them() -> None:
    with pytest.raises(ValueError) as refused:
        parse_repository_url("s3://AKID:hunter22secret@host:9000/b")
    assert "hunter22secret" not in str(refused.value)
    assert "AWS_SECRET_ACCESS_KEY" in str(refused.value)
    assert "hunter22" not in scrubbed("s3://AKID:hunter22@host:9000/b?token=abc")


def test_paths_and_urls_are_told_apart() -> None:
    assert is_url("s3://b") and is_url("gs://b")
    assert not is_url("/models") and not is_url("relative/s3:/x")


def test_the_command_line_splits_local_and_s3_repositories(tmp_path) -> None:
    settings = settings_from_args(
        ["--model-repository", str(tmp_path), "--model-repository", "s3://host:9000/bkt/p"]
        + ["--model-repository", "s3://host:9000/bkt/p/", "--object-store-max-objects", "7"]
    )
    assert settings.model_repositories == [tmp_path.resolve()]
    assert settings.object_repositories == [S3Location("bkt", "p/", "http://host:9000")]
    assert settings.object_store_limits.max_objects == 7


def test_the_command_line_refuses_gs_with_a_message(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        settings_from_args(["--model-repository", "gs://bucket/models"])
    assert stopped.value.code == 2
    assert "(gs://) are not supported" in capsys.readouterr().err
