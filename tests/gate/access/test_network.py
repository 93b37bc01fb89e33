"""Engine URLs: the syntax every spec obeys, the addresses nobody may call, the allow-list."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gate.access.network import check_allowed, check_always, check_syntax
from gate.core.errors import UrlRefused


def resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    def resolve(host: str) -> list[str]:
        return table.get(host, [])

    return resolve


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://user:pw@10.0.0.1:8000", "user info"),
        ("http://10.0.0.1:8000?x=/admin", "query"),
        ("http://10.0.0.1:8000/#frag", "fragment"),
        ("http://10.0.0.1:8000/../admin", "path"),
        ("http://10.0.0.1:8000/a%2fb", "path"),
        ("ftp://10.0.0.1", r"http\(s\)"),
        ("http://", r"http\(s\)"),
    ],
)
def test_syntax_refuses_what_a_base_url_never_needs(url: str, words: str) -> None:
    with pytest.raises(UrlRefused, match=words):
        check_syntax(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://[fd00:ec2::254]",
        "http://[::ffff:169.254.169.254]",
        "http://169.254.10.1:8000",
        "http://[fe80::1]:8000",
        "http://metadata.google.internal",
        "http://100.100.100.200",
        "http://0.0.0.0:8000",
    ],
)
def test_metadata_and_link_local_are_refused_whatever_the_allow_list(url: str) -> None:
    with pytest.raises(UrlRefused, match="never called"):
        check_allowed(url, ["0.0.0.0/0", "::/0", "metadata.google.internal"], loopback=True)


def test_a_name_that_resolves_to_metadata_is_refused() -> None:
    resolve = resolver({"innocent.example": ["10.0.0.5", "169.254.169.254"]})
    with pytest.raises(UrlRefused, match="metadata"):
        check_always("http://innocent.example:8000", resolve)
    with pytest.raises(UrlRefused, match="never called"):
        check_allowed(
            "http://innocent.example", ["innocent.example"], loopback=False, resolve=resolve
        )


def test_allow_list_entries() -> None:
    resolve = resolver(
        {"vllm.gpu.internal": ["10.1.2.3"], "far.example": ["192.0.2.1"], "localhost": ["::1"]}
    )

    def ok(url: str, allow: list[str], loopback: bool = False) -> bool:
        try:
            check_allowed(url, allow, loopback=loopback, resolve=resolve)
        except UrlRefused:
            return False
        return True

    assert ok("http://vllm.gpu.internal:8000", ["vllm.gpu.internal"])
    assert ok("http://vllm.gpu.internal:8000", [".gpu.internal"])
    assert not ok("http://gpu.internal:8000", [".gpu.internal"])
    assert not ok("http://evilgpu.internal:8000", [".gpu.internal"])
    assert ok("http://vllm.gpu.internal:8000", ["10.0.0.0/8"])  # by its resolved address
    assert not ok("http://far.example:8000", ["10.0.0.0/8"])
    assert ok("http://10.1.2.3:8000", ["10.1.2.3:8000"])
    assert not ok("http://10.1.2.3:8001", ["10.1.2.3:8000"])
    assert ok("http://127.0.0.1:8000", [], loopback=True)
    assert ok("http://localhost:8000", [], loopback=True)
    assert not ok("http://127.0.0.1:8000", [])  # the service's loopback is its own host
    assert not ok("http://10.1.2.3:8000", [])  # closed by default


@given(
    user=st.from_regex(r"[a-z]{1,8}(:[a-z]{0,8})?", fullmatch=True),
    query=st.from_regex(r"[a-z=&/]{0,12}", fullmatch=True),
)
def test_userinfo_and_queries_never_pass(user: str, query: str) -> None:
    for url in (f"http://{user}@127.0.0.1:8000", f"http://127.0.0.1:8000/v1?{query}"):
        with pytest.raises(UrlRefused):
            check_allowed(url, ["0.0.0.0/0", "127.0.0.1"], loopback=True)


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::a9fe:a9fe",
        "2002:a9fe:a9fe::",
        "::a9fe:a9fe",
        "::ffff:a9fe:a9fe",
        "::ffff:0:a9fe:a9fe",
    ],
)
def test_metadata_inside_ipv6_forms_is_refused(address: str) -> None:
    """NAT64, 6to4, the old compatible form and mapped addresses all carry 169.254.169.254."""
    with pytest.raises(UrlRefused, match="never called"):
        check_allowed(f"http://[{address}]:80", ["::/0"], loopback=False)


@pytest.mark.parametrize(
    "url",
    ["http://evil.com\\.corp.example", "http://evil.com;.corp.example", "http://a!b.corp.example"],
)
def test_host_names_are_plain_labels(url: str) -> None:
    with pytest.raises(UrlRefused):
        check_allowed(url, [".corp.example"], loopback=False)


def test_a_refused_name_is_never_resolved() -> None:
    """Closed by default, and no DNS lookup (an oracle, a blind ping) for a name no entry
    could admit."""
    looked_up: list[str] = []

    def resolve(host: str) -> list[str]:
        looked_up.append(host)
        return ["10.0.0.1"]

    for allow in ([], ["engines.internal"], [".corp.example"]):
        with pytest.raises(UrlRefused, match="allow-list"):
            check_allowed("http://attacker.example:8000", allow, loopback=False, resolve=resolve)
    assert looked_up == []
    check_allowed("http://vllm.corp.example", [".corp.example"], loopback=False, resolve=resolve)
    assert looked_up == ["vllm.corp.example"]  # admitted by name, then its addresses checked


@pytest.mark.parametrize(
    "url",
    ["http://[fd00:ec2::254%1]:80", "http://[fd00:ec2::254%eth0]/latest", "http://[::1%1]:8000"],
)
def test_ipv6_zone_ids_are_refused(url: str) -> None:
    """A zone id made the metadata address compare unequal to the refused one."""
    with pytest.raises(UrlRefused):
        check_allowed(url, ["::/0", "fd00::/8"], loopback=True)


def test_azure_wireserver_is_metadata() -> None:
    with pytest.raises(UrlRefused, match="metadata"):
        check_allowed("http://168.63.129.16", ["0.0.0.0/0"], loopback=False)
