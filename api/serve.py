"""`radixserve serve`: uvicorn listens at once (`/health` is 503) while the engine loads in a
background thread; then the server answers and prints what it serves and where."""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from typing import Callable

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


def cmd_serve(args: argparse.Namespace, make_config: Callable[[argparse.Namespace], EngineConfig]) -> int:
    import uvicorn

    from radixserve.api.server import attach_engine, build_app
    from radixserve.runtime.engine import Engine

    config = make_config(args)
    config.validate()  # bad flags fail before anything listens
    app = build_app(None, served_model_name=args.served_model_name, api_key=args.api_key)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5))
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
              + (" (API key required)" if args.api_key else ""), flush=True)

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
    return 0


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"

