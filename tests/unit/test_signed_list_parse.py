"""The ListObjectsV2 answers `store.signed.parse_page` reads: S3's, and the variants other stores send."""

from __future__ import annotations

import datetime

import pytest

from gateway.store.signed import parse_page

S3_NS = 'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'


def answer(ns: str, body: str) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult {ns}>{body}</ListBucketResult>'.encode()


def test_an_s3_page_url_encoded_with_prefixes_and_a_next_token() -> None:
    page = parse_page(answer(S3_NS, """<Name>b</Name><Prefix>d%2F</Prefix><EncodingType>url</EncodingType>
        <IsTruncated>true</IsTruncated><NextContinuationToken>tok+/=</NextContinuationToken>
        <Contents><Key>d%2Fsp+ace%2Bplus%25pct%C3%A9</Key><LastModified>2026-12-04T18:50:01.250Z</LastModified>
          <ETag>&quot;0123abcd&quot;</ETag><Size>65536</Size><StorageClass>GLACIER</StorageClass></Contents>
        <Contents><Key>d%2Fplain</Key><LastModified>2026-12-04T18:50:02Z</LastModified><ETag>"e-2"</ETag><Size>0</Size></Contents>
        <CommonPrefixes><Prefix>d%2Fsub%2F</Prefix></CommonPrefixes>"""))
    when = datetime.datetime(2026, 12, 4, 18, 50, 1, 250000, tzinfo=datetime.timezone.utc).timestamp()
    assert page.objects == [("d/sp ace+plus%pcté", 65536, "0123abcd", when, "GLACIER"), ("d/plain", 0, "e-2", when + 0.75, "STANDARD")]
    assert page.prefixes == ["d/sub/"]
    assert page.next_token == "tok+/="  # passed back as sent: it is not a key


def test_a_page_without_a_namespace_or_encoding_and_other_time_forms() -> None:
    page = parse_page(answer("", """<IsTruncated>false</IsTruncated>
        <Contents><Key>a+b%20c</Key><LastModified>2026-12-04T18:50:01+00:00</LastModified><ETag>x</ETag><Size>3</Size></Contents>
        <Contents><Key>naive</Key><LastModified>2026-12-04T18:50:01</LastModified><ETag>y</ETag><Size>4</Size></Contents>
        <Contents><Key>rfc</Key><LastModified>Fri, 04 Dec 2026 18:50:01 GMT</LastModified><ETag>z</ETag><Size>5</Size></Contents>"""))
    when = datetime.datetime(2026, 12, 4, 18, 50, 1, tzinfo=datetime.timezone.utc).timestamp()
    assert page.objects == [("a+b%20c", 3, "x", when, "STANDARD"), ("naive", 4, "y", when, "STANDARD"), ("rfc", 5, "z", when, "STANDARD")]
    assert page.next_token is None and page.prefixes == []


def test_a_truncated_page_without_a_token_is_an_error_not_a_short_listing() -> None:
    with pytest.raises(ValueError, match="NextContinuationToken"):
        parse_page(answer(S3_NS, "<IsTruncated>true</IsTruncated>"))
