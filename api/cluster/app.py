"""The Ray Serve application behind `radixserve serve --replicas N`, and for `serve deploy`
(import path `radixserve.api.cluster.app:app_builder`, arguments as in bench/ray_serve_config.yaml).

Two deployments: `Ingress` serves the same FastAPI app as `radixserve serve` (api/server.py) with
a RemoteEngine in place of the engine; `EngineReplica` runs one Engine per replica, routed by
RadixPrefixRouter on what each replica's radix tree holds."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ray import serve
from ray.exceptions import TaskCancelledError
from ray.serve.config import RequestRouterConfig

from radixserve.api.cluster.view import REPORT_PERIOD_S, ClusterCollector
from radixserve.api.shell.lifecycle import DEFAULT_WATCHDOG_TIMEOUT
from radixserve.api.cluster.replica import DEFAULT_SUMMARY_PAGES, EngineReplica
from radixserve.api.cluster.client import RemoteEngine
from radixserve.api.responses.store import DEFAULT_RESPONSE_STORE_SIZE
from radixserve.runtime.config import EngineConfig

log = logging.getLogger("radixserve.ingress")

APP_NAME = "radixserve"
ENGINE_DEPLOYMENT = "EngineReplica"


@dataclass
class IngressSettings:
    """The `serve` flags the ingress's API needs."""
    served_model_name: Optional[str] = None
    api_key: Optional[str] = None
    watchdog_timeout: float = DEFAULT_WATCHDOG_TIMEOUT
    response_store_size: int = DEFAULT_RESPONSE_STORE_SIZE
    schema_in_prompt: bool = True
    ui: bool = True
    ui_show_prefix_text: bool = False
    tool_call_format: Optional[str] = None


@dataclass
class ClusterSettings:
    replicas: int = 1
    # Ray Serve's autoscaling_config for the engine replicas (min_replicas, max_replicas,
    # target_ongoing_requests, ...); when given, `replicas` is only the initial count
    autoscaling: Optional[dict] = None
    num_cpus: float = 1.0                  # per engine replica (Ray's logical CPUs)
    num_gpus: float = 0.0                  # per engine replica: 1 on GPUs
    summary_pages: int = DEFAULT_SUMMARY_PAGES
    router: str = "radix"                  # a key of ROUTERS
    # the router's initialize_state arguments (RadixPrefixRouter: imbalance, pending_ttl_s, min_match_ratio)
    router_kwargs: dict = field(default_factory=dict)
    engine: EngineConfig = field(default_factory=EngineConfig)
    ingress: IngressSettings = field(default_factory=IngressSettings)

    def validate(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        self.engine.validate()


# Import paths (Ray Serve imports the class in the ingress's process). "pow2" is Ray Serve's default
# and "text" Ray Serve LLM's PrefixCacheAffinityRouter (a tree of the prompt text routed to each
# replica; it needs pyarrow): both only to compare with (bench/ray_router.py).
ROUTERS = {"radix": "radixserve.api.cluster.request_router:RadixPrefixRouter",
           "pow2": "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
           "text": "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router:"
                   "PrefixCacheAffinityRouter"}

# Requests a replica may hold: its engine batches and queues them itself (Ray Serve's default, 5,
# would queue the rest in the router, where the engine's prefix-aware scheduler cannot see them).
MAX_ONGOING_PER_REPLICA = 1024


@serve.ingress()
class Ingress:
    def __init__(self, engine_handle, settings: IngressSettings, model: Optional[str], router: str):
        self._handle = engine_handle
        self._settings = settings
        self._model = model
        self._send_text = router == "text"  # that router matches prompt text, not token pages

    async def __serve_build_asgi_app__(self):
        from radixserve.api.server import attach_engine, build_app
        from radixserve.runtime.models.loader import load_model_files

        s = self._settings
        info = await self._handle.info.remote()  # waits for a replica: the model is loaded
        engine = RemoteEngine(self._handle, load_model_files(self._model, weights=False), info, self._send_text)
        app = build_app(None, served_model_name=s.served_model_name, api_key=s.api_key,
                        watchdog_timeout=s.watchdog_timeout, response_store_size=s.response_store_size,
                        schema_in_prompt=s.schema_in_prompt, ui=s.ui, ui_show_prefix_text=s.ui_show_prefix_text,
                        tool_call_format=s.tool_call_format)
        app.state.server.metrics.registry.register(ClusterCollector())
        app.add_middleware(DisconnectOnCancel)
        attach_engine(app, engine)
        log.info("ingress ready: %s, replicas of %s tokens KV each", info.model_name, info.kv_capacity_tokens)
        return app


class DisconnectOnCancel:
    """ASGI middleware: when the HTTP client goes away, Ray Serve cancels the request, and the
    ingress's next `receive()` raises instead of returning `http.disconnect`. Handlers (and
    sse-starlette) already treat a disconnect as the end; this turns the one into the other."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def receive_or_disconnect():
            try:
                return await receive()
            except TaskCancelledError:
                return {"type": "http.disconnect"}

        await self.app(scope, receive_or_disconnect, send)


def build_application(settings: ClusterSettings):
    settings.validate()
    router = ROUTERS[settings.router]
    router_config = RequestRouterConfig(
        request_router_class=router, request_router_kwargs=settings.router_kwargs,
        request_routing_stats_period_s=REPORT_PERIOD_S, request_routing_stats_timeout_s=10 * REPORT_PERIOD_S)
    scaling = ({"autoscaling_config": {"initial_replicas": settings.replicas, **settings.autoscaling}}
               if settings.autoscaling else {"num_replicas": settings.replicas})
    engine = serve.deployment(EngineReplica, name=ENGINE_DEPLOYMENT).options(
        **scaling, max_ongoing_requests=MAX_ONGOING_PER_REPLICA,
        ray_actor_options={"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus},
        request_router_config=router_config, health_check_period_s=5, health_check_timeout_s=30)
    ingress = serve.deployment(Ingress, name="Ingress").options(
        num_replicas=1, max_ongoing_requests=MAX_ONGOING_PER_REPLICA * settings.replicas,
        ray_actor_options={"num_cpus": 0})
    # one OpenMP team per replica, as wide as its CPU share (Ray's workers default to 1 thread)
    threads = max(1, int(settings.num_cpus))
    return ingress.bind(engine.bind(settings.engine, settings.summary_pages, threads), settings.ingress,
                        settings.engine.model, settings.router)


def app_builder(args: dict[str, Any]):
    """`serve deploy` / KubeRay entry point: `args` are ClusterSettings fields, with `engine` the
    EngineConfig fields and `ingress` the IngressSettings fields."""
    args = dict(args)
    engine = EngineConfig(**_known(EngineConfig, args.pop("engine", {})))
    ingress = IngressSettings(**_known(IngressSettings, args.pop("ingress", {})))
    return build_application(ClusterSettings(engine=engine, ingress=ingress, **_known(ClusterSettings, args)))


def _known(cls, values: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"unknown {cls.__name__} settings: {', '.join(sorted(unknown))}")
    return dict(values)
