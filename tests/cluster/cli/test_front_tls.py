"""`radixmesh front` off loopback (issue 38, items 16 and 9): its API serves TLS with the files given or
a certificate minted from an operator's CA, refuses to start beyond loopback without TLS unless told
`--no-tls`, and follows radixmesh agents' CURVE KV-event sockets with keys from a cluster secret file.
Bad input is refused before anything starts. Real servers on 127.0.0.1."""

import asyncio
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from radixmesh.cluster.api.admin import NO_ADMIN
from radixmesh.cluster.cli import front as front_cli
from radixmesh.cluster.cli.main import main
from radixmesh.cluster.fleet.ingest.subscriber import KVEventSubscriber
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.common.cluster_ca import ClusterCa
from radixmesh.common.secret import ClusterSecret
from radixmesh.common.text.chat_template import PlainChatTemplate
from radixmesh.common.text.tokenizer import ByteTokenizer
from radixmesh.node_agent.kv_events.publisher import ZmqKVEventPublisher
from radixmesh.node_agent.kv_events.token_book import TokenBook
from radixmesh.proto.serve.limits import PromptLimits
from radixmesh.proto.vllm_kv_events import VllmEventBatch
from tests.common.test_cluster_ca import operator_ca
from tests.node_agent.kv_events.test_kv_events_curve import publish_one
from tests.support.agents import SECRET
from tests.support.poll import until
from tests.support.tiny_model import BS

pytestmark = [pytest.mark.anyio, pytest.mark.integration]
ENGINE = "name=e0,url=http://127.0.0.1:9,events=tcp://127.0.0.1:9"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the front's `_serve` would have been given, once per start (it starts nothing)."""
    calls: list[dict[str, Any]] = []

    async def record(config: RouterConfig, engines: list[Any], *args: Any, tls: ssl.SSLContext | None) -> None:
        calls.append({"engines": engines, "tls": tls})

    monkeypatch.setattr(front_cli, "_serve", record)
    monkeypatch.delenv("RADIXMESH_API_KEY", raising=False)
    monkeypatch.delenv("RADIXMESH_ADMIN_KEY", raising=False)
    return calls


def run_front(*args: str) -> Any:
    return CliRunner().invoke(main, ["front", "--model", "m", "--engine", ENGINE, *args])


def leaf_files(tmp_path: Path, secret: ClusterSecret = SECRET) -> tuple[Path, Path, bytes]:
    served = ClusterCa.derive(secret).issue(["127.0.0.1"])
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_bytes(served.cert_chain)
    key.write_bytes(served.private_key)
    key.chmod(0o600)
    return cert, key, served.ca


def test_beyond_loopback_the_front_needs_tls_or_an_explicit_no_tls(served: list[dict[str, Any]]) -> None:
    refused = run_front("--host", "0.0.0.0", "--api-key", "sk-k")
    assert refused.exit_code == 2 and "serves TLS: give --tls-cert/--tls-key or --tls-dir" in refused.output
    assert served == []  # nothing started
    assert run_front("--host", "0.0.0.0", "--api-key", "sk-k", "--no-tls").exit_code == 0
    assert run_front("--host", "127.0.0.1").exit_code == 0  # loopback stays plain, as `up --local`
    assert [call["tls"] for call in served] == [None, None]


@pytest.mark.parametrize(("make_args", "error"), [
    (lambda cert, key, tmp: ["--tls-cert", str(cert)], "--tls-cert and --tls-key go together"),
    (lambda cert, key, tmp: ["--tls-cert", str(cert), "--tls-key", str(key), "--no-tls"], "exclude each other"),
    (lambda cert, key, tmp: ["--tls-dir", str(tmp), "--no-tls"], "exclude each other"),
    (lambda cert, key, tmp: ["--tls-cert", str(key), "--tls-key", str(cert)], "not a PEM certificate and its key"),
    (lambda cert, key, tmp: ["--tls-dir", str(tmp)], "--tls-dir: cannot read"),  # no ca.pem there
])
def test_bad_tls_options_are_refused_before_starting(make_args: Any, error: str, served: list[dict[str, Any]],
                                                     tmp_path: Path) -> None:
    cert, key, _ = leaf_files(tmp_path)
    result = run_front("--host", "0.0.0.0", "--api-key", "sk-k", *make_args(cert, key, tmp_path))
    assert result.exit_code == 2 and error in result.output, result.output
    assert served == []


async def serve_front(tls: ssl.SSLContext | None) -> tuple[str, asyncio.Task[None]]:
    """The front's own serving path on 127.0.0.1 (port 0) over one engine that is not there; its URL."""
    config = RouterConfig("external:m:bs16", block_size=16, policy="cost_no_pull", model_name="m",
                          limits=PromptLimits(vocab_size=256, max_context_tokens=64))
    engine = front_cli.parse_engine(ENGINE, model="m", block_size=16, layout=config.layout, hash_key=b"k",
                                    capacity_blocks=0)
    urls: list[str] = []
    task = asyncio.create_task(front_cli._serve(config, [engine], ClusterSecret.generate(), ByteTokenizer(),
                                                PlainChatTemplate(), "127.0.0.1", 0, "", NO_ADMIN, tls, urls.append))
    await until(lambda: bool(urls) or task.done(), "the front to listen")
    assert urls, task.result()
    return urls[0].split()[2].removesuffix("/v1"), task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_front_serves_tls_with_given_files_or_a_leaf_of_a_tls_dir_and_refuses_plain_text(tmp_path: Path) -> None:
    cert, key, ca = leaf_files(tmp_path)
    operator = tmp_path / "operator"
    operator.mkdir()
    operator_pem = operator_ca(operator)
    for tls, trusted in ((front_cli.api_tls("127.0.0.1", cert, key, None, False), ca),
                         (front_cli.api_tls("127.0.0.1", None, None, operator, False), operator_pem)):
        base, task = await serve_front(tls)
        try:
            assert base.startswith("https://127.0.0.1:")
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/healthz", ssl=ssl.create_default_context(cadata=trusted.decode())) as r:
                    assert r.status == 200
                with pytest.raises(aiohttp.ClientError):  # plain HTTP gets no answer from a TLS port
                    await http.get(f"{base.replace('https', 'http', 1)}/healthz")
                with pytest.raises(aiohttp.ClientConnectorCertificateError):  # nor a client of the system's roots
                    await http.get(f"{base}/healthz", ssl=ssl.create_default_context())
        finally:
            await stop(task)


def secret_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(mode)
    return path


async def test_the_front_follows_an_agents_curve_sockets_with_the_secret_file(served: list[dict[str, Any]],
                                                                              tmp_path: Path) -> None:
    publisher = ZmqKVEventPublisher("tcp://127.0.0.1:0", TokenBook(BS), secret=SECRET)
    await publisher.start()
    try:
        spec = f"name=a,url=http://127.0.0.1:9,events={publisher.endpoint},replay={publisher.replay_endpoint}"
        ipc = ENGINE.replace("e0", "b").replace("tcp://127.0.0.1:9", f"ipc://{tmp_path}/b.sock")
        args = ["front", "--model", "m", "--engine", spec, "--engine", ipc,
                "--kv-events-secret-file", str(secret_file(tmp_path, SECRET.to_hex()))]
        result = await asyncio.to_thread(CliRunner().invoke, main, args)  # the CLI runs its own loop
        assert result.exit_code == 0, result.output
        [agent, local] = served[0]["engines"]
        assert agent.events.authenticated and local.events.curve is None  # ipc sockets are plain on the agent too
        batches: list[VllmEventBatch] = []
        sub = KVEventSubscriber(agent.events, batches.append, lambda: None)
        await sub.start()
        try:
            await until(lambda: publisher.subscriptions == 1, "the front's subscription, admitted by its key")
            publish_one(publisher, 1)
            await until(lambda: sub.last_seq == 0, "the agent's batch")
        finally:
            await sub.stop()
        assert publisher.refused_clients == 0 and len(batches) == 1
    finally:
        await publisher.stop()


@pytest.mark.parametrize(("text", "mode", "error"), [
    (SECRET.to_hex(), 0o644, "accessible to other users"),
    ("not hex", 0o600, "--kv-events-secret-file: "),
    (None, 0o600, "cannot read"),
], ids=["readable-by-others", "not-hex", "missing"])  # the secret is random: ids from it differ per xdist worker
def test_a_bad_kv_events_secret_file_is_refused_before_starting(text: str | None, mode: int, error: str,
                                                                served: list[dict[str, Any]], tmp_path: Path) -> None:
    path = secret_file(tmp_path, text, mode) if text is not None else tmp_path / "missing"
    result = run_front("--kv-events-secret-file", str(path))
    assert result.exit_code == 2 and error in result.output and "--kv-events-secret-file" in result.output, result.output
    assert served == []
