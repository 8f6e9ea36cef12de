"""The Ray Serve application's entry points, without starting Ray: the plain server never imports
Ray, and the Serve config example builds the application it describes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG_EXAMPLE = ROOT / "bench" / "ray_serve_config.yaml"


def test_serving_without_replicas_never_imports_ray():
    code = ("import sys; from radixserve.api.cli import build_parser; from radixserve.api.server import build_app; "
            "from radixserve.api.serve import cmd_serve; build_app(None); "
            "build_parser().parse_args(['serve']); "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_serve_config_example_is_a_valid_serve_deploy_document():
    from ray.serve.schema import ServeDeploySchema

    document = ServeDeploySchema.model_validate(yaml.safe_load(CONFIG_EXAMPLE.read_text()))
    assert document.applications[0].import_path == "radixserve.api.cluster.app:app_builder"


def test_serve_config_example_builds_an_ingress_bound_to_its_engine_replicas():
    from ray.serve import Application

    from radixserve.api.cluster.app import app_builder

    args = yaml.safe_load(CONFIG_EXAMPLE.read_text())["applications"][0]["args"]
    app = app_builder(args)
    assert isinstance(app, Application)
    ingress = app._bound_deployment
    engine = ingress.init_args[0]._bound_deployment
    assert (ingress.name, engine.name) == ("Ingress", "EngineReplica")
    assert engine._deployment_config.num_replicas == args["replicas"]
    assert engine._deployment_config.request_router_config.request_router_class == \
        "radixserve.api.cluster.request_router:RadixPrefixRouter"


def test_autoscaling_settings_reach_the_engine_deployment():
    from radixserve.api.cluster.app import app_builder

    app = app_builder({"replicas": 2, "autoscaling": {"min_replicas": 1, "max_replicas": 4,
                                                        "target_ongoing_requests": 16}})
    config = app._bound_deployment.init_args[0]._bound_deployment._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.initial_replicas) == (1, 4, 2)


def test_unknown_settings_in_a_serve_config_are_refused_by_name():
    from radixserve.api.cluster.app import app_builder

    with pytest.raises(ValueError, match="kv_cache_tokenz"):
        app_builder({"replicas": 1, "engine": {"kv_cache_tokenz": 4096}})


def test_replicas_below_one_are_refused():
    from radixserve.api.cluster.app import ClusterSettings, build_application

    with pytest.raises(ValueError, match="replicas"):
        build_application(ClusterSettings(replicas=0))
