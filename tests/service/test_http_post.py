"""The webhook sink's HTTP client against a receiver that answers exactly the bytes a test
gives: keep-alive, every way an answer can end, timeouts, cancellation, TLS, hostile headers."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
from pathlib import Path

import pytest

from delayq.local.waiting import eventually
from delayq.service.delivery.http_post import PostClient, PostError
from delayq.service.delivery.targets import TargetPolicy
from tests.service.receiver_support import OK, Receiver, Request, answering, answers

LOCAL = TargetPolicy(allow_private=True)


def client_of(receiver: Receiver, timeout_ms: int = 5_000, path: str = "/hook") -> PostClient:
    return PostClient(f"http://127.0.0.1:{receiver.port}{path}", LOCAL, timeout_ms)


async def test_posts_share_one_connection_and_carry_their_headers_and_body():
    async with Receiver() as receiver:
        client = client_of(receiver, path="/hook?tenant=a")
        replies = [
            await client.post(b'{"n":%d}' % n, {"X-Delayq-Id": str(n)}, 1024) for n in range(3)
        ]
        await client.close()
    assert [(r.status, r.body) for r in replies] == [(200, b"ok")] * 3
    assert receiver.connections == 1
    first = receiver.requests[0]
    assert (first.target, first.body) == ("/hook?tenant=a", b'{"n":0}')
    assert first.headers["x-delayq-id"] == "0"
    assert first.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert first.headers["content-length"] == "7"
    assert first.headers["user-agent"].startswith("delayq/")
    assert first.headers["accept-encoding"] == "identity"  # replies are never decompressed


async def test_a_header_the_caller_sends_replaces_the_default_of_that_name():
    async with Receiver() as receiver:
        client = client_of(receiver)
        await client.post(b"{}", {"user-agent": "tenant-agent/2"}, 1024)
        await client.close()
    assert receiver.requests[0].headers["user-agent"] == "tenant-agent/2"
    assert receiver.requests[0].raw_head.lower().count(b"user-agent") == 1


async def test_an_answer_read_with_another_behind_it_keeps_its_own_status():
    """A receiver that writes a second answer in the same read as the first: the first is
    this POST's answer (a 500 is never turned into the 200 behind it) and the connection,
    its stream out of step, is not reused."""
    answer = b"HTTP/1.1 500 No\r\nContent-Length: 2\r\n\r\nno" + OK
    async with Receiver(answering(answer)) as receiver:
        client = client_of(receiver)
        reply = await client.post(b"{}", {}, 1024)
        assert (reply.status, reply.body) == (500, b"no")
        await eventually(lambda: client.connections == 0, 5, "the connection to close")
        await client.close()


async def test_a_connection_idle_past_its_time_is_not_reused_before_the_sweep():
    async with Receiver() as receiver:
        client = client_of(receiver)
        await client.post(b"1", {}, 1024)
        (idle,) = client._idle
        idle.idle_since -= client.keep_idle_s  # as if idle that long, the sweep not yet run
        await client.post(b"2", {}, 1024)
        await client.close()
    assert receiver.connections == 2


async def test_an_answer_that_closes_the_connection_is_not_reused():
    async with Receiver(answering(OK.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))) as (
        receiver
    ):
        client = client_of(receiver)
        assert (await client.post(b"1", {}, 1024)).status == 200
        assert (await client.post(b"2", {}, 1024)).status == 200
        await client.close()
    assert receiver.connections == 2


async def test_a_connection_idle_past_its_time_is_closed_and_replaced():
    async with Receiver() as receiver:
        client = PostClient(f"http://127.0.0.1:{receiver.port}/", LOCAL, 5_000, keep_idle_s=0.2)
        await client.post(b"1", {}, 1024)
        await client.post(b"2", {}, 1024)  # at once: the same connection
        assert (receiver.connections, client.connections) == (1, 1)
        await eventually(lambda: client.connections == 0, 5, "the idle connection to close")
        assert (await client.post(b"3", {}, 1024)).status == 200
        await client.close()
    assert receiver.connections == 2


async def test_a_connection_the_receiver_closed_while_idle_is_replaced():
    async with Receiver(answering(OK, close=True)) as receiver:
        client = client_of(receiver)
        assert (await client.post(b"1", {}, 1024)).status == 200
        await eventually(lambda: client.connections == 0, 5, "the client to see the close")
        assert (await client.post(b"2", {}, 1024)).status == 200
        await client.close()
    assert receiver.connections == 2


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
            b"abc",
        ),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        (
            b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz",
            b"z",
        ),
    ],
    ids=["chunked", "no-content", "interim-first"],
)
async def test_framed_answers_are_read_whole_and_keep_the_connection(answer: bytes, body: bytes):
    async with Receiver(answering(answer)) as receiver:
        client = client_of(receiver)
        replies = [await client.post(b"{}", {}, 1024) for _ in range(2)]
        await client.close()
    assert [(r.status, r.body) for r in replies] == [(200 if body else 204, body)] * 2
    assert receiver.connections == 1


async def test_a_body_that_ends_with_the_connection_is_whole():
    async with Receiver(answering(b"HTTP/1.1 200 OK\r\n\r\nhello", close=True)) as receiver:
        client = client_of(receiver)
        reply = await client.post(b"{}", {}, 1024)
        await client.close()
    assert (reply.status, reply.body) == (200, b"hello")


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",  # cut off
        b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000,  # over the limit
    ],
    ids=["cut-off", "over-the-limit"],
)
async def test_a_status_stands_without_its_body_and_the_connection_goes(answer: bytes):
    async with Receiver(answering(answer, close=answer.endswith(b"abc"))) as receiver:
        client = client_of(receiver)
        reply = await client.post(b"{}", {}, 1024)
        await eventually(lambda: client.connections == 0, 5, "the connection to close")
        await client.close()
    assert (reply.status, reply.body) == (200, None)


async def test_retry_after_is_read_from_the_answer():
    answer = b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"
    async with Receiver(answering(answer)) as receiver:
        client = client_of(receiver)
        reply = await client.post(b"{}", {}, 1024)
        await client.close()
    assert (reply.status, reply.retry_after) == (429, "7")


async def test_no_answer_in_time_is_a_timeout_and_headers_alone_keep_their_status():
    hung = asyncio.Event()

    async def silent(_request: Request, _writer: asyncio.StreamWriter) -> None:
        await hung.wait()

    async with Receiver(silent) as receiver:
        client = client_of(receiver, timeout_ms=200)
        with pytest.raises(TimeoutError):
            await client.post(b"{}", {}, 1024)
        await client.close()
    async with Receiver(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")) as receiver:
        client = client_of(receiver, timeout_ms=200)
        reply = await client.post(b"{}", {}, 1024)
        assert (reply.status, reply.body) == (200, None)
        # the rest of that body must not meet the next POST
        await eventually(lambda: client.connections == 0, 5, "the connection to close")
        await client.close()


async def test_a_cancelled_post_never_leaves_its_answer_to_the_next():
    """A POST cancelled while its answer is on the way closes its connection: reused, the late
    answer would be read as the next POST's."""
    release = asyncio.Event()

    async def late_first(request: Request, writer: asyncio.StreamWriter) -> None:
        if request.body == b"first":
            await release.wait()
            writer.write(b"HTTP/1.1 500 Late\r\nContent-Length: 0\r\n\r\n")
        else:
            writer.write(OK)

    async with Receiver(late_first) as receiver:
        client = client_of(receiver)
        first = asyncio.create_task(client.post(b"first", {}, 1024))
        await eventually(lambda: receiver.requests, 5, "the first POST to arrive")
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        release.set()
        reply = await client.post(b"second", {}, 1024)
        await client.close()
    assert reply.status == 200
    assert receiver.connections == 2


async def test_an_answer_that_is_not_http_fails_the_post():
    async with Receiver(answering(b"SMTP ready\r\n\r\n")) as receiver:
        client = client_of(receiver)
        with pytest.raises(PostError, match="not HTTP"):
            await client.post(b"{}", {}, 1024)
        await client.close()


async def test_a_switch_of_protocols_is_an_answer_that_ends_the_connection():
    answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n"
    async with Receiver(answering(answer)) as receiver:
        client = client_of(receiver)
        assert (await client.post(b"{}", {}, 1024)).status == 101  # not a 2xx: a failure
        await eventually(lambda: client.connections == 0, 5, "the connection to close")
        await client.close()


@pytest.mark.parametrize("value", ["1\r\nX-Evil: 2", "1\nX-Evil: 2", "1\rX", "1\x00"])
async def test_a_header_value_cannot_add_a_header(value: str):
    async with Receiver() as receiver:
        client = client_of(receiver)
        with pytest.raises(PostError, match="line break or NUL"):
            await client.post(b"{}", {"X-Id": value}, 1024)
        await client.close()
    assert receiver.requests == []


async def test_credentials_in_the_url_are_basic_authorization_replacing_any_other():
    async with Receiver() as receiver:
        client = PostClient(f"http://user:p%40ss@127.0.0.1:{receiver.port}/", LOCAL, 5_000)
        await client.post(b"{}", {"Authorization": "Bearer other"}, 1024)
        await client.close()
    expected = "Basic " + base64.b64encode(b"user:p@ss").decode()
    assert receiver.requests[0].headers["authorization"] == expected


@pytest.mark.parametrize("url", ["ftp://example.com/x", "https:///x", "http://example.com:0/"])
async def test_an_unusable_url_fails_each_post_naming_why(url: str):
    client = PostClient(url, LOCAL, 5_000)
    with pytest.raises(PostError, match="cannot be used"):
        await client.post(b"{}", {}, 1024)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and `localhost` (its own CA) and its key."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_is_verified_against_the_trusted_cas(certificate: tuple[Path, Path]):
    cert, key = certificate
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    async with Receiver(ssl_context=server) as receiver:
        url = f"https://127.0.0.1:{receiver.port}/hook"
        trusting = PostClient(
            url, LOCAL, 5_000, ssl_context=ssl.create_default_context(cafile=cert)
        )
        replies = [await trusting.post(b"{}", {}, 1024) for _ in range(2)]
        await trusting.close()
        default = PostClient(url, LOCAL, 5_000)
        with pytest.raises(PostError, match="CERTIFICATE_VERIFY_FAILED"):
            await default.post(b"{}", {}, 1024)
        await default.close()
    assert [r.status for r in replies] == [200, 200]
    assert len(receiver.requests) == 2


async def test_tls_verifies_a_host_name_written_with_its_trailing_dot(
    certificate: tuple[Path, Path],
):
    """`localhost.` is `localhost` fully qualified: the certificate's name is checked without
    the dot (as aiohttp did), else every POST to such a URL would fail verification."""
    cert, key = certificate
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    async with Receiver(ssl_context=server) as receiver:
        client = PostClient(
            f"https://localhost.:{receiver.port}/hook",
            LOCAL,
            5_000,
            resolve=answers("127.0.0.1"),
            ssl_context=ssl.create_default_context(cafile=cert),
        )
        assert (await client.post(b"{}", {}, 1024)).status == 200
        await client.close()
    assert receiver.requests[0].headers["host"] == f"localhost:{receiver.port}"  # as yarl writes it
