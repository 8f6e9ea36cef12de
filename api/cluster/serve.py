"""`radixserve serve --replicas N`: the same OpenAI API, served by Ray Serve with N engine replicas.

Without `--ray-address` it starts a local Ray instance (and stops it on exit); with one (`auto`
or host:port) it joins that cluster and deletes only its own application on exit. SIGTERM /
SIGINT delete the application: Ray Serve lets in-flight requests finish for up to its graceful
shutdown timeout. A second signal exits at once."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from typing import Callable

from radixserve.runtime.config import EngineConfig

log = logging.getLogger("radixserve")

# The local instance's object store: engine calls and outputs are small, and the default (30% of
# memory, in /dev/shm) would hold back memory the engines need.
LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024


def cmd_serve_replicas(args: argparse.Namespace, make_config: Callable[[argparse.Namespace], EngineConfig]) -> int:
    import ray
    from ray import serve

    from radixserve.api.cluster.app import APP_NAME, ClusterSettings, IngressSettings, build_application

    config = make_config(args)
    settings = ClusterSettings(
        replicas=args.replicas, engine=config, router=args.router, router_kwargs=args.router_kwargs,
        ingress=IngressSettings(args.served_model_name, args.api_key, args.watchdog_timeout,
                                args.response_store_size, args.schema_in_prompt, args.ui, args.ui_show_prefix_text,
                                args.tool_call_format))
    settings.num_cpus, settings.num_gpus = _replica_resources(args, config)
    application = build_application(settings)  # validates: bad flags fail before Ray starts
    t0 = time.monotonic()
    local = args.ray_address is None
    if local:
        # one logical CPU beyond the replicas' for helper actors (e.g. the text router's tree)
        ray.init(num_cpus=max(os.cpu_count() or 1, int(settings.num_cpus * settings.replicas)) + 1,
                 include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
                 logging_level=logging.WARNING)
    else:
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
    print(f"radixserve: Ray {'started locally' if local else 'joined'} at {ray.get_runtime_context().gcs_address}; "
          f"starting {settings.replicas} engine replica(s) ({settings.num_cpus:g} CPU, {settings.num_gpus:g} GPU each)",
          flush=True)
    stop = threading.Event()

    def on_signal(signum, frame) -> None:
        if stop.is_set():
            log.warning("second signal: stopping now")
            os._exit(1)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(application, name=APP_NAME, route_prefix="/")
        print(f"radixserve: ready at http://{args.host}:{args.port}/v1 with {settings.replicas} replica(s), "
              f"started in {time.monotonic() - t0:.1f} s", flush=True)
        while not stop.wait(1.0):
            pass
        print("radixserve: stopping (in-flight requests may finish)", flush=True)
        serve.delete(APP_NAME)
    finally:
        if local:
            serve.shutdown()
        ray.shutdown()
    return 0


def _replica_resources(args: argparse.Namespace, config: EngineConfig) -> tuple[float, float]:
    """(CPUs, GPUs) per replica: one GPU each on CUDA; on CPU, the machine's cores shared out."""
    if args.gpus_per_replica is not None:
        gpus = args.gpus_per_replica
    else:
        import torch
        gpus = 1.0 if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()) else 0.0
    if args.cpus_per_replica is not None:
        cpus = args.cpus_per_replica
    else:
        cpus = 1.0 if gpus else float(max(1, (os.cpu_count() or 1) // args.replicas))
    return cpus, gpus
