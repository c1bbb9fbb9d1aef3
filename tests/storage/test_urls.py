"""URLs a manifest may name, URLs stoker may read, and credentials kept out of text."""

from __future__ import annotations

import pytest

from stoker._core.errors import ManifestError
from stoker.storage.urls import SCHEMES, check_url, is_url, join_under, redact

MANIFEST = "s3://bkt/sets/train.stoker.json"

HOSTILE = [
    ("s3://other-bucket/train-00000.rec", "scheme"),
    ("s3://bkt/sets/train-00000.rec", "scheme"),  # even the same bucket: names are relative
    ("https://other.example.com/x.rec", "scheme"),
    ("http://evil/x.rec", "scheme"),
    ("file:///etc/passwd", "scheme"),
    ("ftp://host/x.rec", "scheme"),
    ("pipe:touch x", "scheme"),
    ("data:text/plain,x", "scheme"),
    ("C:x.rec", "scheme"),
    ("http://169.254.169.254/latest/meta-data/", "scheme"),
    ("//169.254.169.254/latest", "absolute"),
    ("metadata.google.internal/computeMetadata", "not refused"),
    ("..", "'..'"),
    ("../x.rec", "'..'"),
    ("a/../../x.rec", "'..'"),
    ("a/..", "'..'"),
    ("%2e%2e/x.rec", "'..'"),
    ("%2E%2E/x.rec", "'..'"),
    ("a/%2e%2e/%2e%2e/x.rec", "'..'"),
    ("%252e%252e/x.rec", "'..'"),
    ("/abs/x.rec", "absolute"),
    ("%2fabs/x.rec", "absolute"),
    ("\\\\host\\share\\x.rec", "absolute"),
    ("\\x.rec", "absolute"),
    ("..\\..\\x.rec", "backslash"),
    ("a\x00.rec", "NUL"),
    ("a%00.rec", "NUL"),
    ("x.rec?versionId=1", "query"),
    ("?x", "query"),
    ("x.rec#frag", "query"),
    ("", "empty"),
    ("a//b.rec", "empty path segment"),
    ("a/", "empty path segment"),
    (".", "folder itself"),
    ("a\nb.rec", "control"),
]


@pytest.mark.parametrize(("rel", "why"), [h for h in HOSTILE if h[1] != "not refused"])
def test_a_hostile_name_in_a_manifest_is_refused_naming_the_manifest_and_field(rel, why):
    with pytest.raises(ManifestError) as info:
        join_under(MANIFEST, rel, manifest=MANIFEST, field="shards[3].rec")
    msg = str(info.value)
    assert MANIFEST in msg and "'shards[3].rec'" in msg
    assert why in msg or why == "scheme" and "scheme" in msg


def test_a_host_like_name_stays_a_key_under_the_manifest_folder():
    # "metadata.google.internal/x" without a scheme is a key in the same bucket, not a host
    assert (
        join_under(MANIFEST, "metadata.google.internal/x", manifest=MANIFEST, field="f")
        == "s3://bkt/sets/metadata.google.internal/x"
    )


def test_a_non_string_name_is_refused():
    with pytest.raises(ManifestError, match="not a string"):
        join_under(MANIFEST, 3, manifest=MANIFEST, field="f")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("base", "rel", "want"),
    [
        (MANIFEST, "train-00000.rec", "s3://bkt/sets/train-00000.rec"),
        (MANIFEST, "sub/train-00000.idx", "s3://bkt/sets/sub/train-00000.idx"),
        (MANIFEST, "./train-00000.rec", "s3://bkt/sets/train-00000.rec"),
        (MANIFEST, "name with spaces.rec", "s3://bkt/sets/name with spaces.rec"),
        ("s3://bkt/top.stoker.json", "a.rec", "s3://bkt/a.rec"),
        ("s3://bkt", "a.rec", "s3://bkt/a.rec"),
        ("gs://b/d/m.json", "a.rec", "gs://b/d/a.rec"),
        ("https://data.example.com/sets/m.json", "a.rec", "https://data.example.com/sets/a.rec"),
        ("file:///data/sets/m.json", "a.rec", "file:///data/sets/a.rec"),
        ("memory://b/m.json", "a.rec", "memory://b/a.rec"),
    ],
)
def test_a_plain_relative_name_joins_under_the_manifest_folder(base, rel, want):
    assert join_under(base, rel, manifest=base, field="f") == want


def test_join_under_a_local_manifest_gives_a_path_in_its_folder(tmp_path):
    manifest = str(tmp_path / "train.stoker.json")
    assert join_under(manifest, "a/b.rec", manifest=manifest, field="f") == str(
        tmp_path / "a/b.rec"
    )
    with pytest.raises(ManifestError):
        join_under(manifest, "../b.rec", manifest=manifest, field="f")


def test_the_manifest_name_in_the_error_has_no_credentials():
    manifest = "https://user:hunter22@example.com/m.json?sig=SECRETSIG&se=2030"
    with pytest.raises(ManifestError) as info:
        join_under(manifest, "../x", manifest=manifest, field="f")
    msg = str(info.value)
    assert "hunter22" not in msg and "SECRETSIG" not in msg and "example.com" in msg


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host/x",
        "data:text/plain,x",
        "pipe:touch x",
        "gopher://h/x",
        "s3://",
        "https:///x",
        "file://remotehost/etc/passwd",
        "http://169.254.169.254/latest/meta-data/iam",
        "http://169.254.170.2/v2/credentials",
        "http://[fd00:ec2::254]/latest",
        "http://[fe80::1]/x",
        "http://[::ffff:169.254.169.254]/x",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://METADATA.google.internal./x",
        "http://0xa9fea9fe/x",
        "http://2852039166/x",
        "http://0251.0376.0251.0376/x",
        "http://169.254.1/x",
        "s3://169.254.169.254/x",
        "http://a\x00b/x",
        "not a url",
    ],
)
def test_check_url_refuses_other_schemes_and_metadata_hosts(url):
    with pytest.raises(ValueError):
        check_url(url)


def test_check_url_names_the_url_without_credentials():
    with pytest.raises(ValueError) as info:
        check_url("http://admin:pa55word@169.254.169.254/x")
    assert "pa55word" not in str(info.value) and "169.254.169.254" in str(info.value)


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("s3://bkt/a/b.rec", "s3://bkt/a/b.rec"),
        ("S3://bkt/a", "s3://bkt/a"),
        ("HTTPS://Data.Example.COM/A/b", "https://data.example.com/A/b"),
        ("http://127.0.0.1:9000/x", "http://127.0.0.1:9000/x"),
        ("file:///tmp/x", "file:///tmp/x"),
        ("file://localhost/tmp/x", "file://localhost/tmp/x"),
        ("abfs://cont@acct.dfs.core.windows.net/x", "abfs://cont@acct.dfs.core.windows.net/x"),
        ("memory://x", "memory://x"),
    ],
)
def test_check_url_accepts_and_normalises(url, want):
    assert check_url(url) == want


def test_every_allowed_scheme_is_accepted():
    for scheme in SCHEMES:
        url = "file:///x" if scheme == "file" else f"{scheme}://host/x"
        assert check_url(url).startswith(scheme + "://")


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("s3://b/x", True),
        ("ftp://h/x", True),  # a refused scheme is still a URL, so it is refused, not opened
        ("file:///x", True),
        ("data/train.rec", False),
        ("/abs/train.rec", False),
        ("C:\\data\\x.rec", False),
        ("pipe:touch x", False),
        ("", False),
    ],
)
def test_is_url(path, want):
    assert is_url(path) is want


PRESIGNED = (
    "https://bkt.s3.amazonaws.com/sets/a.rec?X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIAEXAMPLEKEY%2F20240101%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Security-Token=FQoGZXIvYXdzEXAMPLETOKEN"
    "&X-Amz-Signature=0123456789abcdef0123456789abcdef"
)
SAS = (
    "https://acct.blob.core.windows.net/cont/a.rec?sv=2021-08-06&ss=b&srt=o&sp=r"
    "&se=2030-01-01T00:00:00Z&st=2024-01-01T00:00:00Z&spr=https&sig=AbCdEf%2BgHiJ%3D"
)


def test_redact_a_presigned_s3_url():
    out = redact(f"failed to read {PRESIGNED}: 503")
    for secret in ("AKIAEXAMPLEKEY", "FQoGZXIvYXdzEXAMPLETOKEN", "0123456789abcdef"):
        assert secret not in out
    assert "https://bkt.s3.amazonaws.com/sets/a.rec?" in out and "X-Amz-Signature=***" in out
    assert out.endswith(": 503")


def test_redact_an_azure_sas_url():
    out = redact(SAS)
    assert "AbCdEf" not in out and "sig=***" in out and "2030-01-01" not in out
    assert out.startswith("https://acct.blob.core.windows.net/cont/a.rec?")


@pytest.mark.parametrize(
    "text",
    [
        "https://user:pass@host/x",
        "s3://AKIAXXXX:secretkey@bkt/x",
        "https://ghp_tokenvalue@github.com/x",
    ],
)
def test_redact_userinfo(text):
    out = redact(text)
    assert "pass" not in out and "secretkey" not in out and "ghp_tokenvalue" not in out
    assert "***@" in out


def test_redact_keeps_an_azure_container_name():
    assert redact("abfs://cont@acct.dfs.core.windows.net/x") == (
        "abfs://cont@acct.dfs.core.windows.net/x"
    )


def test_redact_the_values_of_aws_variables(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAMYOWNKEY123")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "my/very+secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "sessiontokenvalue")
    text = "auth failed for AKIAMYOWNKEY123 with my/very+secret and sessiontokenvalue"
    out = redact(text)
    assert "AKIAMYOWNKEY123" not in out and "my/very+secret" not in out
    assert "sessiontokenvalue" not in out and out.startswith("auth failed for ***")


def test_redact_ignores_short_env_values(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    assert redact("the x of it") == "the x of it"


def test_redact_is_idempotent_and_leaves_plain_text_alone():
    for text in (PRESIGNED, SAS, "https://u:p@h/x?token=abc&key=k"):
        once = redact(text)
        assert redact(once) == once
    plain = "shard 3 (train-00003.rec), key 5, byte offset 1024, size=3, s3://bkt/a.rec"
    assert redact(plain) == plain
