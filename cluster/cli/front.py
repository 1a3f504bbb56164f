"""`radixmesh front`: a radixmesh router in front of vLLM/SGLang engines it does not own.

    radixmesh front --model meta-llama/Llama-3.1-8B-Instruct --tokenizer /models/llama-3.1-8b \
        --engine name=vllm-0,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557 --port 8000

One process: a metadata service on 127.0.0.1 (memory state, a fresh secret), every engine's KV
events ingested into it (ExternalFleet), and the OpenAI API of a Router that routes with
`cost_no_pull`, until Ctrl-C or SIGTERM. Engine specs (`kv-events-config=`, bind-all hosts,
`key-env=`), credentials, TLS and which event sockets are trusted:
docs/routing.md#external-engines-vllm-sglang-and-ray-serve.
"""

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import click

from radixmesh.cluster.api.admin import NO_ADMIN, AdminConfig
from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.cli.options import check_tls_choice
from radixmesh.cluster.cli.route_stats import API_KEY_ENV
from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.fleet.external_fleet import ExternalFleet
from radixmesh.cluster.fleet.ingest.external_engine import ExternalEngineConfig
from radixmesh.cluster.fleet.ingest.subscriber import MAX_MESSAGE_BYTES, SubscriberConfig
from radixmesh.cluster.launch.secret_file import read_secret
from radixmesh.cluster.metadata.server import ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.cluster_ca import ClusterCa, served_names, server_tls, server_tls_pem
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret, check_api_bind, is_loopback
from radixmesh.common.text.chat_template import (
    ChatTemplate,
    PlainChatTemplate,
    chat_template_from_gguf,
    chat_template_from_pretrained_dir,
)
from radixmesh.common.text.tokenizer import Tokenizer, load_tokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import PromptLimits

logger = logging.getLogger(__name__)

_SPEC_KEYS = {"name", "url", "events", "replay", "topic", "key-env"}
_KV_EVENTS_CONFIG = "kv-events-config="
_SPEC_FORM = ("name=...,url=...,events=...[,replay=...][,topic=...][,key-env=VAR] or "
              "name=...,url=...[,key-env=VAR],kv-events-config=JSON")
ADMIN_KEY_ENV = "RADIXMESH_ADMIN_KEY"
MIN_ADMIN_KEY_CHARS = 16
"""A shorter admin key is refused: it guards every tenant's cache."""


def parse_engine(spec: str, *, model: str, block_size: int, layout: str, hash_key: bytes,
                 capacity_blocks: int, environ: Mapping[str, str] = os.environ,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, curve: ClusterSecret | None = None) -> ExternalEngineConfig:
    """`name=N,url=U,events=E[,replay=R][,topic=T][,key-env=VAR]` or `name=N,url=U[,key-env=VAR],
    kv-events-config=JSON` as an engine's config, its API key read from `environ[VAR]`; ValueError
    naming the problem. With `curve` (a cluster secret), tcp events are followed as a CURVE client of
    a publisher of that secret (a radixmesh agent's: common.kv_events_curve); ipc ones stay plain."""
    # The JSON holds commas, so its field comes last and takes the rest of the spec.
    head, sep, kv_events_config = spec.partition("," + _KV_EVENTS_CONFIG)
    fields: dict[str, str] = {}
    for part in head.split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in _SPEC_KEYS or key in fields or not value:
            raise ValueError(f"{part!r} in {spec!r}: expected {_SPEC_FORM}")
        fields[key] = value
    required = {"name", "url"} if sep else {"name", "url", "events"}
    missing = sorted(required - set(fields))
    if missing:
        raise ValueError(f"engine {spec!r} lacks {', '.join(missing)}")
    if sep:
        if fields.keys() & {"events", "replay", "topic"}:
            raise ValueError(f"engine {spec!r}: give events=... or kv-events-config=..., not both")
        events = subscriber_from_kv_events_config(kv_events_config, fields["url"])
    else:
        events = SubscriberConfig(fields["events"], fields.get("replay"), fields.get("topic", ""))
    events = dataclasses.replace(events, max_message_bytes=max_message_bytes,
                                 curve=curve if events.endpoint.startswith("tcp://") else None)
    api_key = ""
    if "key-env" in fields:
        api_key = environ.get(fields["key-env"], "")
        if not api_key:  # a key the operator meant to send and did not: every call would get 401
            raise ValueError(f"engine {fields['name']}: key-env={fields['key-env']} names an unset or empty variable")
    return ExternalEngineConfig(NodeId(fields["name"]), fields["url"], events, layout, model, block_size=block_size,
                                capacity_blocks=capacity_blocks, hash_key=hash_key, api_key=api_key)


_VLLM_FIELDS = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps", "hwm",
                "max_queue_size", "topic"}
"""vLLM's KVEventsConfig (vllm/config/kv_events.py); buffer_steps, hwm and max_queue_size tune the
engine's side only."""
_BIND_ALL = {"*", "0.0.0.0", "::", "[::]"}


def subscriber_from_kv_events_config(text: str, engine_url: str) -> SubscriberConfig:
    """Where to follow the events of an engine started with `--kv-events-config text` and serving at
    `engine_url`; ValueError naming the problem."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"kv-events-config is not JSON ({e}): {text!r}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"kv-events-config must be a JSON object, got {text!r}")  # noqa: TRY004 (a usage error)
    unknown = sorted(doc.keys() - _VLLM_FIELDS)
    if unknown:
        raise ValueError(f"kv-events-config: unknown field(s) {', '.join(unknown)}; vLLM's are "
                         f"{', '.join(sorted(_VLLM_FIELDS))}")
    if doc.get("enable_kv_cache_events") is not True:
        raise ValueError("kv-events-config: enable_kv_cache_events is not true, so the engine publishes no KV events")
    publisher = doc.get("publisher", "zmq")  # vLLM's default once events are enabled
    if publisher != "zmq":
        raise ValueError(f"kv-events-config: publisher {publisher!r} publishes nothing to follow; only 'zmq' does")
    endpoint, replay, topic = doc.get("endpoint"), doc.get("replay_endpoint"), doc.get("topic", "")
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError("kv-events-config lacks endpoint (vLLM's default is tcp://*:5557: give it explicitly)")
    if not (replay is None or isinstance(replay, str) and replay) or not isinstance(topic, str):
        raise ValueError("kv-events-config: replay_endpoint must be a ZMQ address or null, topic a string")
    host = urlsplit(engine_url).hostname
    if not host:
        raise ValueError(f"engine url {engine_url!r} names no host to reach its KV events on")
    return SubscriberConfig(_connect_address(endpoint, host), replay and _connect_address(replay, host), topic)


def _connect_address(endpoint: str, engine_host: str) -> str:
    """The address to connect to for the one the engine binds: its URL's host for a bind-all host."""
    scheme, _, rest = endpoint.partition("://")
    if scheme == "ipc":  # a path on the engine's machine: reachable when the front runs there too
        return endpoint
    address, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not colon or not address or not port.isdigit():
        raise ValueError(f"kv-events-config: endpoint {endpoint!r} must be tcp://host:port (or ipc://path)")
    if address in _BIND_ALL:
        address = f"[{engine_host}]" if ":" in engine_host else engine_host
    return f"tcp://{address}:{port}"


@click.command("front")
@click.option("--engine", "engines", multiple=True, required=True, metavar="SPEC",
              help="name=N,url=http://host:port,events=tcp://host:5557[,replay=tcp://host:5558][,topic=T]"
                   "[,key-env=VAR: the engine's API key is in $VAR], or name=N,url=http://host:port,kv-events-config=JSON with the JSON the engine's `vllm serve "
                   "--kv-events-config` took (last: it takes the rest of the spec; a bind-all endpoint host such "
                   "as tcp://*:5557 is reached at the URL's host); repeat it.")
@click.option("--model", required=True, help="The model name the engines serve (and /v1/models shows).")
@click.option("--tokenizer", type=click.Path(exists=True, path_type=Path), default=None,
              help="The engines' tokenizer (an HF directory or a .gguf file), for text prompts and chat.")
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(1),
              help="Tokens per block the router hashes by; the engines' block size must be a multiple.")
@click.option("--max-context", default=8192, show_default=True, type=click.IntRange(1), help="Prompt + reply tokens.")
@click.option("--capacity-blocks", default=0, show_default=True, type=click.IntRange(0),
              help="Blocks of --block-size each engine's KV cache holds (for the free blocks it reports).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address of the OpenAI API.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--api-key", envvar=API_KEY_ENV, default="",
              help=f"Required on every API call when set [default: ${API_KEY_ENV}; none, which only a loopback "
                   "--host allows]. The environment keeps it out of the process list.")
@click.option("--admin-key", envvar=ADMIN_KEY_ENV, default="",
              help=f"Opens /reset_prefix_cache, /flush_cache and /stats' tenants [default: ${ADMIN_KEY_ENV}; none: "
                   f"they answer 403]. At least {MIN_ADMIN_KEY_CHARS} characters, not the API key.")
@click.option("--kv-events-max-bytes", default=MAX_MESSAGE_BYTES, show_default=True,
              type=click.IntRange(1024), help="Longest KV-event frame read from an engine; a longer one is a lost batch.")
@click.option("--kv-events-secret-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Follow every engine's tcp KV events as a CURVE client with the keys of this cluster secret "
                   "(hex, mode 0600): radixmesh agents publish so (`radixmesh kv-events-keys` prints the same "
                   "keys); only a publisher holding it is followed, and every frame is encrypted.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="PEM certificate (valid for --host) the API serves TLS with.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Its PEM private key.")
@click.option("--tls-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="An operator's CA (ca.pem, ca.key mode 0600) to mint the API's certificate from for --host; "
                   "clients trust its ca.pem.")
@click.option("--no-tls", is_flag=True,
              help="Serve plain text beyond loopback (refused there otherwise): the API key and prompts then "
                   "cross the network readable.")
def front(engines: tuple[str, ...], model: str, tokenizer: Path | None, block_size: int, max_context: int,
          capacity_blocks: int, host: str, port: int, api_key: str, admin_key: str, kv_events_max_bytes: int,
          kv_events_secret_file: Path | None, tls_cert: Path | None, tls_key: Path | None, tls_dir: Path | None,
          no_tls: bool) -> None:
    """Route requests over existing vLLM/SGLang engines by the prefixes their KV events show."""
    secret = ClusterSecret.generate()
    layout = f"external:{model}:bs{block_size}"
    try:
        check_api_bind(host, api_key)
        tls = api_tls(host, tls_cert, tls_key, tls_dir, no_tls)
        admin = _admin_config(admin_key, api_key)
        curve = _kv_events_secret(kv_events_secret_file) if kv_events_secret_file is not None else None
        configs = [parse_engine(s, model=model, block_size=block_size, layout=layout, hash_key=secret.hash_key(),
                                capacity_blocks=capacity_blocks, max_message_bytes=kv_events_max_bytes, curve=curve)
                   for s in engines]
        tok = load_tokenizer(tokenizer)
        template = _chat_template(tokenizer)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    config = RouterConfig(layout, block_size=block_size, policy="cost_no_pull", model_name=model,
                          hash_key=secret.hash_key(),
                          limits=PromptLimits(vocab_size=tok.vocab_size, max_context_tokens=max_context))
    try:
        asyncio.run(_serve(config, configs, secret, tok, template, host, port, api_key, admin, tls=tls))
    except ValueError as e:  # an ipc source others could bind (subscriber.check_source)
        raise click.ClickException(str(e)) from None


def api_tls(host: str, tls_cert: Path | None, tls_key: Path | None, tls_dir: Path | None,
            no_tls: bool) -> ssl.SSLContext | None:
    """The TLS the API serves on `host`: the files given, a certificate minted for `host` from the CA in
    `tls_dir`, or none (loopback, or `no_tls`). ValueError beyond loopback with none of them (the
    front's secret is fresh each run, so there is no CA of its own clients could know), for options
    that exclude each other, and for files that are not a certificate and its key."""
    check_tls_choice(tls_cert, tls_key, tls_dir, no_tls)
    if tls_cert is not None and tls_key is not None:
        try:
            return server_tls(tls_cert, tls_key)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(f"--tls-cert {tls_cert} / --tls-key {tls_key}: not a PEM certificate and its key ({e})") from None
    if tls_dir is not None:
        # A wildcard host is reached by this machine's name, as `metadata-server` names it.
        served = ClusterCa.load(tls_dir).issue(served_names(host, socket.getfqdn()))
        return server_tls_pem(served.cert_chain, served.private_key)
    if not no_tls and not is_loopback(host):
        raise ValueError(f"the API on {host!r} (beyond loopback) serves TLS: give --tls-cert/--tls-key or --tls-dir, "
                         "or --no-tls to send the API key and prompts readable")
    return None


def _kv_events_secret(path: Path) -> ClusterSecret:
    try:
        return read_secret(path)
    except ValueError as e:  # missing, readable by others, or not a secret
        raise ValueError(f"--kv-events-secret-file: {e}") from None


def _admin_config(admin_key: str, api_key: str) -> AdminConfig:
    """The admin access `--admin-key` gives; ValueError for a key too short or equal to the API key
    (a client's key must never open the reset of every tenant's cache)."""
    if not admin_key:
        return NO_ADMIN
    if len(admin_key) < MIN_ADMIN_KEY_CHARS or admin_key == api_key:
        raise ValueError(f"--admin-key must have at least {MIN_ADMIN_KEY_CHARS} characters and differ from the API key")
    return AdminConfig(admin_key)


def _chat_template(tokenizer: Path | None) -> ChatTemplate:
    if tokenizer is None:
        return PlainChatTemplate()
    return chat_template_from_gguf(tokenizer) if tokenizer.suffix == ".gguf" else chat_template_from_pretrained_dir(
        tokenizer if tokenizer.is_dir() else tokenizer.parent)


async def _serve(config: RouterConfig, engines: list[ExternalEngineConfig], secret: ClusterSecret,
                 tokenizer: Tokenizer, template: ChatTemplate, host: str, port: int, api_key: str,
                 admin: AdminConfig, tls: ssl.SSLContext | None = None,
                 announce: Callable[[str], None] = click.echo) -> None:
    """Serve until SIGINT or SIGTERM (or cancelled); `announce` is told the API's URL once it listens."""
    server, metadata_port = create_server(MetadataService(), ServerOptions("127.0.0.1", 0, secret=secret))
    await server.start()
    target = f"127.0.0.1:{metadata_port}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop, 1.0)
        for engine in engines:
            if not engine.events.authenticated:
                logger.warning("engine %s: its KV events (%s) are not authenticated: whoever can publish there "
                               "steers routing to it (docs/security.md)", engine.node_id, engine.events.endpoint)
        fleet = ExternalFleet(engines, lambda node: MetadataClient(target, credentials=CallerCredentials.node(secret, node)))
        clients = await fleet.start()
        stack.push_async_callback(fleet.stop)
        metadata = MetadataClient(target, credentials=CallerCredentials.cluster(secret))
        stack.push_async_callback(metadata.close)
        router = Router(config, StaticAgentDirectory(clients), metadata)
        runner, bound = await start_http(router, host, port, tokenizer=tokenizer, chat_template=template,
                                         api_key=api_key, admin=admin, tls=tls)
        stack.push_async_callback(runner.cleanup)
        announce(f"radixmesh front: {'https' if tls else 'http'}://{host}:{bound}/v1 over {len(engines)} engine(s)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
            stack.callback(loop.remove_signal_handler, sig)
        await stop.wait()
