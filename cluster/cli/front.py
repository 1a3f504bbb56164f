"""`radixmesh front`: a radixmesh router in front of vLLM/SGLang engines it does not own.

    radixmesh front --model meta-llama/Llama-3.1-8B-Instruct --tokenizer /models/llama-3.1-8b \
        --engine name=vllm-0,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558 \
        --engine name=vllm-1,url=http://10.0.0.6:8000,events=tcp://10.0.0.6:5557 --port 8000

One process: a metadata service on 127.0.0.1 (memory state, a fresh secret), every engine's KV
events ingested into it (ExternalFleet), and the OpenAI API of a Router that routes with
`cost_no_pull`. It prints the API's URL, then serves until Ctrl-C or SIGTERM.
"""

import asyncio
import contextlib
import signal
from pathlib import Path

import click

from radixmesh.cluster.api.app import start_http
from radixmesh.cluster.cli.inspect import API_KEY_ENV
from radixmesh.cluster.fleet.agent_client import StaticAgentDirectory
from radixmesh.cluster.fleet.external_fleet import ExternalFleet
from radixmesh.cluster.fleet.ingest.engine import ExternalEngineConfig
from radixmesh.cluster.fleet.ingest.subscriber import SubscriberConfig
from radixmesh.cluster.metadata.server import ServerOptions, create_server
from radixmesh.cluster.metadata.service import MetadataService
from radixmesh.cluster.router.config import RouterConfig
from radixmesh.cluster.router.router import Router
from radixmesh.common.metadata.auth import CallerCredentials
from radixmesh.common.metadata.client import MetadataClient
from radixmesh.common.secret import ClusterSecret
from radixmesh.common.text.chat_template import (
    ChatTemplate,
    PlainChatTemplate,
    chat_template_from_gguf,
    chat_template_from_pretrained_dir,
)
from radixmesh.common.text.tokenizer import Tokenizer, load_tokenizer
from radixmesh.proto.ids import NodeId
from radixmesh.proto.serve.limits import PromptLimits

_SPEC_KEYS = {"name", "url", "events", "replay", "topic"}


def parse_engine(spec: str, *, model: str, block_size: int, layout: str, hash_key: bytes,
                 capacity_blocks: int) -> ExternalEngineConfig:
    """`name=N,url=U,events=E[,replay=R][,topic=T]` as an engine's config; ValueError naming the problem."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep or key not in _SPEC_KEYS or key in fields or not value:
            raise ValueError(f"{part!r} in {spec!r}: expected name=...,url=...,events=...[,replay=...][,topic=...]")
        fields[key] = value
    missing = sorted({"name", "url", "events"} - set(fields))
    if missing:
        raise ValueError(f"engine {spec!r} lacks {', '.join(missing)}")
    events = SubscriberConfig(fields["events"], fields.get("replay"), fields.get("topic", ""))
    return ExternalEngineConfig(NodeId(fields["name"]), fields["url"], events, layout, model, block_size=block_size,
                                capacity_blocks=capacity_blocks, hash_key=hash_key)


@click.command("front")
@click.option("--engine", "engines", multiple=True, required=True, metavar="SPEC",
              help="name=N,url=http://host:port,events=tcp://host:5557[,replay=tcp://host:5558][,topic=T]; repeat it.")
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
              help=f"Required on every API call when set [default: ${API_KEY_ENV}; none]. The environment keeps "
                   "it out of the process list.")
def front(engines: tuple[str, ...], model: str, tokenizer: Path | None, block_size: int, max_context: int,
          capacity_blocks: int, host: str, port: int, api_key: str) -> None:
    """Route requests over existing vLLM/SGLang engines by the prefixes their KV events show."""
    secret = ClusterSecret.generate()
    layout = f"external:{model}:bs{block_size}"
    try:
        configs = [parse_engine(s, model=model, block_size=block_size, layout=layout, hash_key=secret.hash_key(),
                                capacity_blocks=capacity_blocks) for s in engines]
        tok = load_tokenizer(tokenizer)
        template = _chat_template(tokenizer)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    config = RouterConfig(layout, block_size=block_size, policy="cost_no_pull", model_name=model,
                          hash_key=secret.hash_key(),
                          limits=PromptLimits(vocab_size=tok.vocab_size, max_context_tokens=max_context))
    asyncio.run(_serve(config, configs, secret, tok, template, host, port, api_key))


def _chat_template(tokenizer: Path | None) -> ChatTemplate:
    if tokenizer is None:
        return PlainChatTemplate()
    return chat_template_from_gguf(tokenizer) if tokenizer.suffix == ".gguf" else chat_template_from_pretrained_dir(
        tokenizer if tokenizer.is_dir() else tokenizer.parent)


async def _serve(config: RouterConfig, engines: list[ExternalEngineConfig], secret: ClusterSecret,
                 tokenizer: Tokenizer, template: ChatTemplate, host: str, port: int, api_key: str) -> None:
    server, metadata_port = create_server(MetadataService(), ServerOptions("127.0.0.1", 0, secret=secret))
    await server.start()
    target = f"127.0.0.1:{metadata_port}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop, 1.0)
        fleet = ExternalFleet(engines, lambda node: MetadataClient(target, credentials=CallerCredentials.node(secret, node)))
        clients = await fleet.start()
        stack.push_async_callback(fleet.stop)
        metadata = MetadataClient(target, credentials=CallerCredentials.cluster(secret))
        stack.push_async_callback(metadata.close)
        router = Router(config, StaticAgentDirectory(clients), metadata, tokenizer=tokenizer, chat_template=template)
        runner, bound = await start_http(router, host, port, api_key=api_key)
        stack.push_async_callback(runner.cleanup)
        click.echo(f"radixmesh front: http://{host}:{bound}/v1 over {len(engines)} engine(s)", nl=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
