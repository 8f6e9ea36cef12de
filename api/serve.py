"""`radixserve serve`: uvicorn listens at once (`/health` is 503) while the engine loads in a
background thread; then the server answers and prints what it serves and where.

SIGTERM / SIGINT drain: new requests get 503, in-flight ones may finish for `--shutdown-timeout`
seconds, the rest end with finish_reason "abort"; then exit 0. A second signal stops at once. If the
engine stops serving (its thread died, or steps keep failing), the process exits 1 so that a
supervisor restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import threading
import time
from typing import Callable, Optional

import uvicorn

from radixserve.api.openai.tool_formats import FORMATS
from radixserve.api.shell.lifecycle import DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WATCHDOG_TIMEOUT, Lifecycle
from radixserve.api.responses.store import DEFAULT_RESPONSE_STORE_SIZE
from radixserve.runtime.config import EngineConfig

log = logging.getLogger("radixserve")

API_KEY_ENV = "RADIXSERVE_API_KEY"


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Flags of `serve` beyond the shared engine flags."""
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model id /v1/models reports (default: the model's)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require this Bearer token on /v1/* (default: ${API_KEY_ENV})")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT,
                   help="seconds in-flight requests may finish after SIGTERM before they are aborted")
    p.add_argument("--watchdog-timeout", type=float, default=DEFAULT_WATCHDOG_TIMEOUT,
                   help="/health fails when the engine loop has made no progress for this many seconds")
    p.add_argument("--response-store-size", type=int, default=DEFAULT_RESPONSE_STORE_SIZE,
                   help="finished /v1/responses kept in memory for previous_response_id and GET, least recently "
                        "used evicted first (0 keeps none)")
    p.add_argument("--no-schema-in-prompt", dest="schema_in_prompt", action="store_false",
                   help="enforce a chat response_format json_schema without also stating it in the system message")
    p.add_argument("--tool-call-format", default="auto", choices=["auto", *FORMATS],
                   help="how the model spells tool calls (prompt, auto's grammar, parser); auto: from its chat "
                        "template, Hermes when the template shows none")
    p.add_argument("--no-ui", dest="ui", action="store_false",
                   help="no web page at / (the chat playground and the cache view)")
    p.add_argument("--ui-show-prefix-text", action="store_true",
                   help="the cache view (GET /v1/cache, the page) shows cached prompts' text, not only their "
                        "token counts; anyone who may call the API can then read other users' prompts")
    r = p.add_argument_group("replicas on Ray Serve (needs the ray[serve] extra: pip install 'radixserve[ray]')")
    r.add_argument("--replicas", type=int, default=None,
                   help="run this many engine replicas behind one OpenAI endpoint on Ray Serve, routed by "
                        "what each replica's prefix cache holds (default: one engine in this process, no Ray)")
    r.add_argument("--ray-address", default=None,
                   help="join this Ray cluster (`auto` or host:port) instead of starting a local one")
    r.add_argument("--cpus-per-replica", type=float, default=None,
                   help="Ray CPUs per replica (default: 1 on GPUs, else the machine's cores shared out)")
    r.add_argument("--gpus-per-replica", type=float, default=None, help="default: 1 on CUDA, else 0")
    r.add_argument("--router", default="radix", choices=["radix", "pow2", "text"],
                   help="radix: by each replica's reported prefix cache; to compare: pow2 (Ray Serve's default) "
                        "or text (Ray Serve LLM's PrefixCacheAffinityRouter, needs pyarrow)")
    r.add_argument("--router-kwargs", type=json.loads, default={},
                   help='the router\'s settings as JSON, e.g. \'{"imbalance": 8, "pending_ttl_s": 60}\'')


class DrainingServer(uvicorn.Server):
    """uvicorn, but the first SIGTERM / SIGINT drains before the listener closes (uvicorn would stop
    accepting at once, and sse-starlette would cut every open stream)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle, shutdown_timeout: float):
        super().__init__(config)
        self.lifecycle = lifecycle
        self.shutdown_timeout = shutdown_timeout
        self.exit_code = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._drain_started = False

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self._drain_started or self._loop is None:
            log.warning("second signal: stopping now")
            self.force_exit = self.should_exit = True
            return
        self._drain_started = True
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        try:
            await self.lifecycle.drain(self.shutdown_timeout)
        finally:
            self.should_exit = True

    def stop_failed(self, reason: str) -> None:
        """The engine cannot serve any more: exit non-zero (from any thread)."""
        log.critical("%s; exiting so that a supervisor restarts the server", reason)
        self.exit_code = 1
        self.should_exit = True


def cmd_serve(args: argparse.Namespace, make_config: Callable[[argparse.Namespace], EngineConfig]) -> int:
    from radixserve.api.server import attach_engine, build_app
    from radixserve.runtime.engine import Engine

    if args.replicas is not None or args.ray_address is not None:
        if args.replicas is None:
            args.replicas = 1
        if args.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {args.replicas}")
        try:
            import ray.serve  # noqa: F401  (imported only on this path)
        except ModuleNotFoundError:
            raise ValueError("--replicas needs Ray Serve: pip install 'radixserve[ray]'") from None
        from radixserve.api.cluster.serve import cmd_serve_replicas
        return cmd_serve_replicas(args, make_config)
    config = make_config(args)
    config.validate()  # bad flags fail before anything listens
    if not args.shutdown_timeout >= 0:
        raise ValueError("shutdown-timeout must be >= 0 seconds")
    if not args.watchdog_timeout > 0:
        raise ValueError("watchdog-timeout must be > 0 seconds")
    if args.response_store_size < 0:
        raise ValueError("response-store-size must be >= 0")
    app = build_app(None, served_model_name=args.served_model_name, api_key=args.api_key,
                    watchdog_timeout=args.watchdog_timeout, response_store_size=args.response_store_size,
                    schema_in_prompt=args.schema_in_prompt, ui=args.ui,
                    ui_show_prefix_text=args.ui_show_prefix_text, tool_call_format=args.tool_call_format)
    server = DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5),
                            app.state.server.lifecycle, args.shutdown_timeout)
    loaded: list[Engine] = []
    failure: list[BaseException] = []

    def load() -> None:
        t0 = time.monotonic()
        try:
            engine = Engine(config)
        except BaseException as e:  # reported once uvicorn stops
            failure.append(e)
            server.should_exit = True
            return
        loaded.append(engine)
        attach_engine(app, engine)
        name = args.served_model_name or engine.model_name
        print(f"radixserve: serving {engine.model_name}"
              + (f" as {name!r}" if name != engine.model_name else "")
              + f" on {engine.device} ({str(engine.dtype).replace('torch.', '')}), "
              f"KV cache {engine.kv_capacity_tokens} tokens, context {engine.model_config.max_context_len}, "
              f"loaded in {time.monotonic() - t0:.1f} s", flush=True)
        print(f"radixserve: ready at {_url(args.host, args.port)}/v1"
              + (" (API key required)" if args.api_key else "")
              + (f"; chat page and cache view at {_url(args.host, args.port)}/" if args.ui else ""), flush=True)
        watch_engine(engine, server)

    print(f"radixserve: loading the model; listening on {_url(args.host, args.port)} "
          "(/health answers 503 until it is loaded)", flush=True)
    loader = threading.Thread(target=load, name="radixserve-loader", daemon=True)
    loader.start()
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it shut down on: a normal stop
        pass
    finally:
        loader.join(timeout=120)
        for engine in loaded:
            engine.shutdown()
    if failure:
        raise failure[0]
    return server.exit_code


WATCH_SECONDS = 0.5


def watch_engine(engine, server: DrainingServer) -> None:
    """Ends the process (exit 1) once the engine stops serving while the server still runs."""
    def watch() -> None:
        while not server.should_exit:
            health = engine.health()
            if not health.alive:
                if not server.should_exit:
                    server.stop_failed(f"the engine stopped: {health.fatal_error or 'its loop thread ended'}")
                return
            time.sleep(WATCH_SECONDS)

    threading.Thread(target=watch, name="radixserve-watchdog", daemon=True).start()


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"

