"""Writes tests/schemas/corpus.json: real-world-shaped JSON schemas written for this project (none
copied from elsewhere), in the five families issue 21 names: Kubernetes objects, CI/workflow
configs, OpenAPI-generated models, Azure resource definitions and function-calling schemas. Each
entry is {"name", "family", "schema"} plus "refuse": the keyword it must be refused by, for the
few that use what no backend enforces (uniqueItems, dependencies, not, an overlapping oneOf).

    .venv/bin/python tests/schemas/make_corpus.py
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

OUT = Path(__file__).with_name("corpus.json")
DNS_LABEL = {"type": "string", "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
QUANTITY = {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G)?$"}


# ---- Kubernetes -----------------------------------------------------------------------------
def k8s_definitions() -> dict:
    d = "io.k8s.api.core.v1."
    m = "io.k8s.apimachinery.pkg.apis.meta.v1."
    return {
        m + "ObjectMeta": {
            "description": "Standard object's metadata.", "type": "object",
            "properties": {
                "name": {**DNS_LABEL, "description": "Name must be unique within a namespace."},
                "namespace": DNS_LABEL,
                "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 63}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "generation": {"type": "integer", "format": "int64", "readOnly": True},
                "uid": {"type": "string", "format": "uuid"},
            }, "x-kubernetes-map-type": "atomic"},
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {
            "anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True},
        "io.k8s.apimachinery.pkg.api.resource.Quantity": QUANTITY,
        d + "ContainerPort": {
            "type": "object", "required": ["containerPort"],
            "properties": {"containerPort": {"type": "integer", "format": "int32"},
                           "name": {"type": "string", "maxLength": 15},
                           "protocol": {"type": "string", "enum": ["TCP", "UDP", "SCTP"], "default": "TCP"}}},
        d + "EnvVar": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                           "value": {"type": "string"}}},
        d + "ResourceRequirements": {
            "type": "object", "properties": {
                "limits": {"type": "object", "additionalProperties": {
                    "$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}},
                "requests": {"type": "object", "additionalProperties": {
                    "$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}}}},
        d + "Probe": {
            "type": "object", "properties": {
                "httpGet": {"type": "object", "required": ["port"], "properties": {
                    "path": {"type": "string"},
                    "port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"}}},
                "initialDelaySeconds": {"type": "integer", "format": "int32", "minimum": 0},
                "periodSeconds": {"type": "integer", "format": "int32"}}},
        d + "Container": {
            "type": "object", "required": ["name"],
            "properties": {
                "name": DNS_LABEL, "image": {"type": "string"},
                "command": {"type": "array", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}},
                "ports": {"type": "array", "items": {"$ref": f"#/definitions/{d}ContainerPort"},
                          "x-kubernetes-list-type": "map"},
                "env": {"type": "array", "items": {"$ref": f"#/definitions/{d}EnvVar"}},
                "resources": {"$ref": f"#/definitions/{d}ResourceRequirements", "description": "Compute resources."},
                "livenessProbe": {"$ref": f"#/definitions/{d}Probe"},
                "imagePullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}}},
        d + "PodSpec": {
            "type": "object", "required": ["containers"],
            "properties": {
                "containers": {"type": "array", "items": {"$ref": f"#/definitions/{d}Container"}},
                "restartPolicy": {"type": "string", "enum": ["Always", "OnFailure", "Never"]},
                "serviceAccountName": {"type": "string"},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "terminationGracePeriodSeconds": {"type": "integer", "format": "int64"}}},
        d + "PodTemplateSpec": {
            "type": "object", "properties": {
                "metadata": {"$ref": f"#/definitions/{m}ObjectMeta"},
                "spec": {"$ref": f"#/definitions/{d}PodSpec"}}},
        m + "LabelSelector": {
            "type": "object", "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
    }


def k8s_object(kind: str, api_version: str, spec: dict | None, extra: dict | None = None) -> dict:
    m = "io.k8s.apimachinery.pkg.apis.meta.v1."
    props = {
        "apiVersion": {"type": "string", "enum": [api_version]},
        "kind": {"type": "string", "enum": [kind]},
        "metadata": {"$ref": f"#/definitions/{m}ObjectMeta"},
    }
    if spec is not None:
        props["spec"] = spec
    props.update(extra or {})
    return {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "required": ["apiVersion", "kind", "metadata"], "properties": props, "definitions": k8s_definitions(),
            "x-kubernetes-group-version-kind": [{"kind": kind, "version": api_version.split("/")[-1]}]}


def kubernetes() -> list[tuple[str, dict, str | None]]:
    d = "io.k8s.api.core.v1."
    m = "io.k8s.apimachinery.pkg.apis.meta.v1."
    ref = lambda name: {"$ref": f"#/definitions/{name}"}  # noqa: E731
    workload = lambda extra: {"type": "object", "required": ["selector", "template"], "properties": {  # noqa: E731
        "replicas": {"type": "integer", "format": "int32", "minimum": 0},
        "selector": ref(m + "LabelSelector"), "template": ref(d + "PodTemplateSpec"), **extra}}
    out = [
        ("Deployment", k8s_object("Deployment", "apps/v1", workload({
            "strategy": {"type": "object", "properties": {"type": {"type": "string", "enum": ["Recreate", "RollingUpdate"]},
                         "rollingUpdate": {"type": "object", "properties": {
                             "maxSurge": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
                             "maxUnavailable": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString")}}}},
            "revisionHistoryLimit": {"type": "integer", "format": "int32"}})), None),
        ("StatefulSet", k8s_object("StatefulSet", "apps/v1", workload({"serviceName": {"type": "string"}})), None),
        ("DaemonSet", k8s_object("DaemonSet", "apps/v1", workload({"minReadySeconds": {"type": "integer", "format": "int32"}})), None),
        ("ReplicaSet", k8s_object("ReplicaSet", "apps/v1", workload({})), None),
        ("Pod", k8s_object("Pod", "v1", ref(d + "PodSpec")), None),
        ("Job", k8s_object("Job", "batch/v1", {"type": "object", "required": ["template"], "properties": {
            "template": ref(d + "PodTemplateSpec"), "backoffLimit": {"type": "integer", "format": "int32"},
            "completions": {"type": "integer", "format": "int32"},
            "activeDeadlineSeconds": {"type": "integer", "format": "int64", "minimum": 1}}}), None),
        ("CronJob", k8s_object("CronJob", "batch/v1", {"type": "object", "required": ["schedule", "jobTemplate"], "properties": {
            "schedule": {"type": "string", "pattern": "^(@(annually|yearly|monthly|weekly|daily|hourly))$|^(\\S+ ){4}\\S+$"},
            "concurrencyPolicy": {"type": "string", "enum": ["Allow", "Forbid", "Replace"]},
            "jobTemplate": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                "template": ref(d + "PodTemplateSpec")}}}}}}), None),
        ("Service", k8s_object("Service", "v1", {"type": "object", "properties": {
            "type": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
            "selector": {"type": "object", "additionalProperties": {"type": "string"}},
            "ports": {"type": "array", "items": {"type": "object", "required": ["port"], "properties": {
                "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
                "targetPort": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
                "protocol": {"type": "string", "enum": ["TCP", "UDP"]}, "name": {"type": "string"}}}},
            "clusterIP": {"type": "string", "format": "ipv4"}}}), None),
        ("ConfigMap", k8s_object("ConfigMap", "v1", None, {
            "data": {"type": "object", "additionalProperties": {"type": "string"}},
            "immutable": {"type": "boolean"}}), None),
        ("Secret", k8s_object("Secret", "v1", None, {
            "data": {"type": "object", "additionalProperties": {"type": "string", "format": "byte"}},
            "stringData": {"type": "object", "additionalProperties": {"type": "string"}},
            "type": {"type": "string"}}), None),
        ("Namespace", k8s_object("Namespace", "v1", {"type": "object", "properties": {
            "finalizers": {"type": "array", "items": {"type": "string"}}}}), None),
        ("ServiceAccount", k8s_object("ServiceAccount", "v1", None, {
            "automountServiceAccountToken": {"type": "boolean"},
            "secrets": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}), None),
        ("PersistentVolumeClaim", k8s_object("PersistentVolumeClaim", "v1", {"type": "object", "properties": {
            "accessModes": {"type": "array", "items": {"type": "string", "enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"]}},
            "resources": ref(d + "ResourceRequirements"), "storageClassName": {"type": "string"},
            "volumeMode": {"type": "string", "enum": ["Block", "Filesystem"]}}}), None),
        ("Ingress", k8s_object("Ingress", "networking.k8s.io/v1", {"type": "object", "properties": {
            "ingressClassName": {"type": "string"},
            "rules": {"type": "array", "items": {"type": "object", "properties": {
                "host": {"type": "string", "format": "hostname"},
                "http": {"type": "object", "required": ["paths"], "properties": {"paths": {"type": "array", "items": {
                    "type": "object", "required": ["pathType", "backend"], "properties": {
                        "path": {"type": "string"},
                        "pathType": {"type": "string", "enum": ["Exact", "Prefix", "ImplementationSpecific"]},
                        "backend": {"type": "object", "properties": {"service": {"type": "object", "required": ["name"], "properties": {
                            "name": {"type": "string"}, "port": {"type": "object", "properties": {
                                "number": {"type": "integer", "format": "int32"}, "name": {"type": "string"}}}}}}}}}}}}}}}}}), None),
        ("HorizontalPodAutoscaler", k8s_object("HorizontalPodAutoscaler", "autoscaling/v2", {"type": "object",
            "required": ["scaleTargetRef", "maxReplicas"], "properties": {
                "scaleTargetRef": {"type": "object", "required": ["kind", "name"], "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "name": {"type": "string"}}},
                "minReplicas": {"type": "integer", "format": "int32", "minimum": 1},
                "maxReplicas": {"type": "integer", "format": "int32"}}}), None),
        ("PodDisruptionBudget", k8s_object("PodDisruptionBudget", "policy/v1", {"type": "object", "properties": {
            "minAvailable": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
            "maxUnavailable": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
            "selector": ref(m + "LabelSelector")}}), None),
        ("Role", k8s_object("Role", "rbac.authorization.k8s.io/v1", None, {"rules": {"type": "array", "items": {
            "type": "object", "required": ["verbs"], "properties": {
                "apiGroups": {"type": "array", "items": {"type": "string"}},
                "resources": {"type": "array", "items": {"type": "string"}},
                "verbs": {"type": "array", "items": {"type": "string", "enum": ["get", "list", "watch", "create", "update", "patch", "delete"]}}}}}}), None),
        ("RoleBinding", k8s_object("RoleBinding", "rbac.authorization.k8s.io/v1", None, {
            "roleRef": {"type": "object", "required": ["apiGroup", "kind", "name"], "properties": {
                "apiGroup": {"type": "string"}, "kind": {"type": "string", "enum": ["Role", "ClusterRole"]}, "name": {"type": "string"}}},
            "subjects": {"type": "array", "items": {"type": "object", "required": ["kind", "name"], "properties": {
                "kind": {"type": "string"}, "name": {"type": "string"}, "namespace": {"type": "string"}}}}}), None),
        ("NetworkPolicy", k8s_object("NetworkPolicy", "networking.k8s.io/v1", {"type": "object", "properties": {
            "podSelector": ref(m + "LabelSelector"),
            "policyTypes": {"type": "array", "items": {"type": "string", "enum": ["Ingress", "Egress"]}},
            "ingress": {"type": "array", "items": {"type": "object", "properties": {"ports": {"type": "array", "items": {
                "type": "object", "properties": {"port": ref("io.k8s.apimachinery.pkg.util.intstr.IntOrString"),
                                                 "protocol": {"type": "string"}}}}}}}}}), None),
        ("ResourceQuota", k8s_object("ResourceQuota", "v1", {"type": "object", "properties": {
            "hard": {"type": "object", "additionalProperties": ref("io.k8s.apimachinery.pkg.api.resource.Quantity")},
            "scopes": {"type": "array", "items": {"type": "string"}}}}), None),
        ("LimitRange", k8s_object("LimitRange", "v1", {"type": "object", "required": ["limits"], "properties": {
            "limits": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {
                "type": {"type": "string"},
                "max": {"type": "object", "additionalProperties": ref("io.k8s.apimachinery.pkg.api.resource.Quantity")},
                "default": {"type": "object", "additionalProperties": ref("io.k8s.apimachinery.pkg.api.resource.Quantity")}}}}}}), None),
    ]
    # a CustomResourceDefinition's validation schema is itself recursive (JSONSchemaProps)
    props = {"type": "object", "properties": {
        "type": {"type": "string"}, "description": {"type": "string"},
        "properties": {"type": "object", "additionalProperties": {"$ref": "#/definitions/JSONSchemaProps"}},
        "items": {"$ref": "#/definitions/JSONSchemaProps"},
        "required": {"type": "array", "items": {"type": "string"}},
        "x-kubernetes-preserve-unknown-fields": {"type": "boolean"}}}
    crd = k8s_object("CustomResourceDefinition", "apiextensions.k8s.io/v1", {"type": "object", "required": ["group", "names", "scope"],
        "properties": {"group": {"type": "string"}, "scope": {"type": "string", "enum": ["Namespaced", "Cluster"]},
                       "names": {"type": "object", "required": ["plural", "kind"], "properties": {
                           "plural": {"type": "string"}, "kind": {"type": "string"}, "shortNames": {"type": "array", "items": {"type": "string"}}}},
                       "versions": {"type": "array", "items": {"type": "object", "required": ["name", "served", "storage"], "properties": {
                           "name": {"type": "string"}, "served": {"type": "boolean"}, "storage": {"type": "boolean"},
                           "schema": {"type": "object", "properties": {"openAPIV3Schema": {"$ref": "#/definitions/JSONSchemaProps"}}}}}}}})
    crd["definitions"]["JSONSchemaProps"] = props
    out.append(("CustomResourceDefinition", crd, None))
    # list types carry uniqueItems in some generators: refused, honestly
    secret_list = k8s_object("ImagePullSecrets", "v1", None, {"names": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}})
    out.append(("ImagePullSecrets", secret_list, "uniqueItems"))
    for name, schema, refuse in out:
        schema["title"] = name
    return [(f"k8s/{n}", s, r) for n, s, r in out]


# ---- CI / workflow configs --------------------------------------------------------------------
def ci() -> list[tuple[str, dict, str | None]]:
    step = {"type": "object", "properties": {
        "name": {"type": "string"}, "id": {"type": "string"}, "uses": {"type": "string", "pattern": "^[^@ ]+@[^@ ]+$|^docker://.+$|^\\./.+$"},
        "run": {"type": "string"}, "with": {"$ref": "#/definitions/env"}, "env": {"$ref": "#/definitions/env"},
        "if": {"type": ["string", "boolean"]}, "continue-on-error": {"type": "boolean"},
        "timeout-minutes": {"type": "number", "minimum": 1}},
        "oneOf": [{"required": ["uses"]}, {"required": ["run"]}], "additionalProperties": False}
    job = {"type": "object", "required": ["runs-on", "steps"], "additionalProperties": False, "properties": {
        "name": {"type": "string"}, "runs-on": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        "needs": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "timeout-minutes": {"type": "number"}, "env": {"$ref": "#/definitions/env"},
        "strategy": {"type": "object", "properties": {"matrix": {"type": "object", "additionalProperties": {
            "type": "array", "items": {"type": ["string", "number", "boolean"]}}}, "fail-fast": {"type": "boolean"},
            "max-parallel": {"type": "integer", "minimum": 1}}},
        "steps": {"type": "array", "items": {"$ref": "#/definitions/step"}, "minItems": 1}}}
    defs = {"env": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}},
            "step": step, "job": job,
            "event": {"type": "string", "enum": ["push", "pull_request", "schedule", "workflow_dispatch", "release"]}}
    github = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["on", "jobs"],
              "additionalProperties": False, "definitions": defs, "properties": {
                  "name": {"type": "string"},
                  "on": {"oneOf": [{"$ref": "#/definitions/event"}, {"type": "array", "items": {"$ref": "#/definitions/event"}},
                                   {"type": "object", "properties": {"push": {"type": "object", "properties": {
                                       "branches": {"type": "array", "items": {"type": "string"}}}},
                                       "schedule": {"type": "array", "items": {"type": "object", "required": ["cron"], "properties": {
                                           "cron": {"type": "string"}}}}}}]},
                  "env": {"$ref": "#/definitions/env"},
                  "jobs": {"type": "object", "patternProperties": {"^[_a-zA-Z][a-zA-Z0-9_-]*$": {"$ref": "#/definitions/job"}},
                           "additionalProperties": False, "minProperties": 1}}}
    out = [("github-workflow", github, None)]
    action = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["name", "description", "runs"],
              "properties": {"name": {"type": "string"}, "description": {"type": "string"}, "author": {"type": "string"},
                             "inputs": {"type": "object", "additionalProperties": {"type": "object", "required": ["description"], "properties": {
                                 "description": {"type": "string"}, "required": {"type": "boolean"}, "default": {"type": "string"}}}},
                             "runs": {"type": "object", "required": ["using"], "properties": {
                                 "using": {"type": "string", "enum": ["node20", "docker", "composite"]},
                                 "main": {"type": "string"}, "image": {"type": "string"},
                                 "steps": {"type": "array", "items": {"$ref": "#/definitions/step"}}}},
                             "branding": {"type": "object", "properties": {
                                 "color": {"type": "string", "enum": ["white", "yellow", "blue", "green", "orange", "red", "purple", "gray-dark"]},
                                 "icon": {"type": "string"}}}},
              "definitions": {"env": defs["env"], "step": step}}
    out.append(("github-action", action, None))
    gitlab_job = {"type": "object", "properties": {
        "stage": {"type": "string"}, "image": {"oneOf": [{"type": "string"}, {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "entrypoint": {"type": "array", "items": {"type": "string"}}}}]},
        "script": {"$ref": "#/definitions/script"}, "before_script": {"$ref": "#/definitions/script"},
        "when": {"type": "string", "enum": ["on_success", "on_failure", "always", "manual", "delayed", "never"]},
        "allow_failure": {"type": "boolean"}, "retry": {"type": "integer", "minimum": 0, "maximum": 2},
        "artifacts": {"type": "object", "properties": {"paths": {"type": "array", "items": {"type": "string"}},
                                                       "expire_in": {"type": "string"}}},
        "variables": {"type": "object", "additionalProperties": {"type": ["string", "integer"]}},
        "tags": {"type": "array", "items": {"type": "string"}}, "timeout": {"type": "string", "format": "duration"}},
        "required": ["script"]}
    gitlab = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "definitions": {
        "script": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]},
        "job": gitlab_job},
        "properties": {"stages": {"type": "array", "items": {"type": "string"}},
                       "variables": {"type": "object", "additionalProperties": {"type": "string"}},
                       "default": {"type": "object", "properties": {"image": {"type": "string"}}}},
        "patternProperties": {"^[.]?(build|test|deploy|lint|release)[a-z0-9_ -]*$": {"$ref": "#/definitions/job"}},
        "required": ["stages"]}
    out.append(("gitlab-ci", gitlab, None))
    circle = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["version", "jobs"], "properties": {
        "version": {"type": "number", "enum": [2, 2.1]},
        "orbs": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^[a-z0-9-]+/[a-z0-9-]+@[0-9.]+$"}},
        "jobs": {"type": "object", "additionalProperties": {"type": "object", "required": ["steps"], "properties": {
            "docker": {"type": "array", "items": {"type": "object", "required": ["image"], "properties": {"image": {"type": "string"}}}},
            "resource_class": {"type": "string", "enum": ["small", "medium", "large", "xlarge"]},
            "parallelism": {"type": "integer", "minimum": 1},
            "steps": {"type": "array", "items": {"anyOf": [{"type": "string", "enum": ["checkout"]},
                                                            {"type": "object", "required": ["run"], "properties": {"run": {"type": "string"}}}]}}}}},
        "workflows": {"type": "object", "properties": {"version": {"type": "integer"}}, "additionalProperties": {"type": "object", "properties": {
            "jobs": {"type": "array", "items": {"type": "string"}}}}}}}
    out.append(("circleci", circle, None))
    compose_service = {"type": "object", "properties": {
        "image": {"type": "string"}, "build": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {
            "context": {"type": "string"}, "dockerfile": {"type": "string"}, "args": {"type": "object", "additionalProperties": {"type": "string"}}}}]},
        "ports": {"type": "array", "items": {"type": ["string", "number"], "format": "ports"}},
        "environment": {"oneOf": [{"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}},
                                  {"type": "array", "items": {"type": "string"}}]},
        "depends_on": {"type": "array", "items": {"type": "string"}},
        "restart": {"type": "string", "enum": ["no", "always", "on-failure", "unless-stopped"]},
        "healthcheck": {"type": "object", "properties": {"test": {"type": "array", "items": {"type": "string"}},
                                                          "interval": {"type": "string", "format": "duration"},
                                                          "retries": {"type": "number"}}}},
        "additionalProperties": False}
    compose = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "required": ["services"], "properties": {
        "version": {"type": "string"},
        "services": {"type": "object", "patternProperties": {"^[a-zA-Z0-9._-]+$": {"$ref": "#/definitions/service"}},
                     "additionalProperties": False},
        "volumes": {"type": "object", "additionalProperties": {"type": ["object", "null"]}}},
        "definitions": {"service": compose_service}}
    out.append(("docker-compose", compose, None))
    # small per-tool configs
    tools = {
        "dependabot": {"type": "object", "required": ["version", "updates"], "properties": {
            "version": {"type": "integer", "const": 2},
            "updates": {"type": "array", "items": {"type": "object", "required": ["package-ecosystem", "directory", "schedule"], "properties": {
                "package-ecosystem": {"type": "string", "enum": ["npm", "pip", "github-actions", "docker", "gomod", "cargo"]},
                "directory": {"type": "string"},
                "schedule": {"type": "object", "required": ["interval"], "properties": {
                    "interval": {"type": "string", "enum": ["daily", "weekly", "monthly"]},
                    "time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"}}},
                "open-pull-requests-limit": {"type": "integer", "minimum": 0, "maximum": 10}}}}}},
        "pre-commit": {"type": "object", "required": ["repos"], "properties": {
            "repos": {"type": "array", "items": {"type": "object", "required": ["repo", "hooks"], "properties": {
                "repo": {"type": "string"}, "rev": {"type": "string"},
                "hooks": {"type": "array", "items": {"type": "object", "required": ["id"], "properties": {
                    "id": {"type": "string"}, "args": {"type": "array", "items": {"type": "string"}},
                    "files": {"type": "string", "format": "regex"}}}}}}},
            "fail_fast": {"type": "boolean"}, "default_stages": {"type": "array", "items": {"type": "string"}}}},
        "renovate": {"type": "object", "properties": {
            "extends": {"type": "array", "items": {"type": "string"}},
            "schedule": {"type": "array", "items": {"type": "string"}},
            "prConcurrentLimit": {"type": "integer", "minimum": 0},
            "packageRules": {"type": "array", "items": {"type": "object", "properties": {
                "matchPackagePatterns": {"type": "array", "items": {"type": "string"}},
                "automerge": {"type": "boolean"},
                "groupName": {"type": "string"}}}}}},
        "travis": {"type": "object", "properties": {
            "language": {"type": "string", "enum": ["python", "node_js", "go", "ruby", "java"]},
            "python": {"type": "array", "items": {"type": "string"}},
            "install": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "script": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "matrix": {"type": "object", "properties": {"fast_finish": {"type": "boolean"}}}}},
        "azure-pipelines": {"type": "object", "properties": {
            "trigger": {"anyOf": [{"type": "string", "enum": ["none"]}, {"type": "array", "items": {"type": "string"}}]},
            "pool": {"type": "object", "properties": {"vmImage": {"type": "string"}}},
            "variables": {"type": "object", "additionalProperties": {"type": "string"}},
            "steps": {"type": "array", "items": {"type": "object", "properties": {
                "script": {"type": "string"}, "displayName": {"type": "string"}, "task": {"type": "string", "pattern": "^[A-Za-z0-9]+@[0-9]+$"},
                "inputs": {"type": "object", "additionalProperties": {"type": "string"}}}}}}},
        "jenkins-job": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "description": {"type": "string"},
            "parameters": {"type": "array", "items": {"type": "object", "required": ["name", "type"], "properties": {
                "name": {"type": "string"}, "type": {"type": "string", "enum": ["string", "choice", "boolean"]},
                "choices": {"type": "array", "items": {"type": "string"}}, "default": {}}}},
            "triggers": {"type": "object", "properties": {"cron": {"type": "string"}, "pollSCM": {"type": "string"}}},
            "buildDiscarder": {"type": "object", "properties": {"daysToKeep": {"type": "integer"}, "numToKeep": {"type": "integer"}}}}},
        "tox": {"type": "object", "properties": {
            "envlist": {"type": "array", "items": {"type": "string", "pattern": "^py3[0-9]+$|^lint$|^docs$"}},
            "testenv": {"type": "object", "properties": {"deps": {"type": "array", "items": {"type": "string"}},
                                                         "commands": {"type": "array", "items": {"type": "string"}}}}}},
        "netlify": {"type": "object", "properties": {
            "build": {"type": "object", "properties": {"command": {"type": "string"}, "publish": {"type": "string"},
                                                       "environment": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "redirects": {"type": "array", "items": {"type": "object", "required": ["from", "to"], "properties": {
                "from": {"type": "string"}, "to": {"type": "string"}, "status": {"type": "integer", "enum": [200, 301, 302, 404]},
                "force": {"type": "boolean"}}}}}},
        "vercel": {"type": "object", "properties": {
            "version": {"type": "integer", "const": 2}, "name": {"type": "string", "maxLength": 52, "pattern": "^[a-z0-9-]+$"},
            "regions": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
            "functions": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "memory": {"type": "integer", "minimum": 128, "maximum": 3008}, "maxDuration": {"type": "integer", "minimum": 1}}}}}},
        "eslint": {"type": "object", "properties": {
            "root": {"type": "boolean"}, "extends": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
            "rules": {"type": "object", "additionalProperties": {"oneOf": [
                {"type": "string", "enum": ["off", "warn", "error"]}, {"type": "integer", "enum": [0, 1, 2]},
                {"type": "array", "prefixItems": [{"type": ["string", "integer"]}], "minItems": 1}]}},
            "env": {"type": "object", "additionalProperties": {"type": "boolean"}}}},
        "tsconfig": {"type": "object", "properties": {
            "compilerOptions": {"type": "object", "properties": {
                "target": {"type": "string", "enum": ["ES5", "ES2015", "ES2020", "ESNext"]}, "strict": {"type": "boolean"},
                "outDir": {"type": "string"}, "paths": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}}}},
            "include": {"type": "array", "items": {"type": "string"}}, "exclude": {"type": "array", "items": {"type": "string"}}}},
        "codecov": {"type": "object", "properties": {"coverage": {"type": "object", "properties": {
            "precision": {"type": "integer", "minimum": 0, "maximum": 5},
            "range": {"type": "string", "pattern": "^[0-9]{1,3}\\.\\.[0-9]{1,3}$"},
            "status": {"type": "object", "properties": {"project": {"type": "object", "additionalProperties": {"type": "object", "properties": {
                "target": {"type": "string"}, "threshold": {"type": "string"}}}}}}}}}},
        "mkdocs": {"type": "object", "required": ["site_name"], "properties": {
            "site_name": {"type": "string"}, "site_url": {"type": "string", "format": "uri"},
            "nav": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "string"}}},
            "theme": {"oneOf": [{"type": "string"}, {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}]}}},
        "semantic-release": {"type": "object", "properties": {
            "branches": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "prerelease": {"type": ["boolean", "string"]}}}]}},
            "plugins": {"type": "array", "items": {"type": ["string", "array"]}}}},
        "helm-chart": {"type": "object", "required": ["apiVersion", "name", "version"], "properties": {
            "apiVersion": {"type": "string", "enum": ["v1", "v2"]}, "name": {"type": "string"},
            "version": {"type": "string", "pattern": "^(0|[1-9]\\d*)\\.(0|[1-9]\\d*)\\.(0|[1-9]\\d*)(?:-[0-9A-Za-z.-]+)?$"},
            "appVersion": {"type": "string"}, "type": {"type": "string", "enum": ["application", "library"]},
            "dependencies": {"type": "array", "items": {"type": "object", "required": ["name", "version"], "properties": {
                "name": {"type": "string"}, "version": {"type": "string"}, "repository": {"type": "string"},
                "condition": {"type": "string"}}}}}},
        "ansible-task": {"type": "object", "properties": {
            "name": {"type": "string"}, "become": {"type": "boolean"}, "when": {"type": "string"},
            "loop": {"type": "array"}, "register": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
            "notify": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}},
            "dependencies": {"loop": ["name"]}},
    }
    refusals: dict[str, str] = {}   # dependencies is rewritten exactly as an anyOf over presence
    for name, schema in tools.items():
        out.append((name, {"$schema": "http://json-schema.org/draft-07/schema#", **schema}, refusals.get(name)))
    return [(f"ci/{n}", s, r) for n, s, r in out]


# ---- OpenAPI-generated models -----------------------------------------------------------------
def openapi() -> list[tuple[str, dict, str | None]]:
    base = {"type": "object", "required": ["id"], "properties": {
        "id": {"type": "integer", "format": "int64", "readOnly": True},
        "createdAt": {"type": "string", "format": "date-time", "readOnly": True},
        "updatedAt": {"type": "string", "format": "date-time", "nullable": True}}}
    category = {"type": "object", "properties": {"id": {"type": "integer", "format": "int64"}, "name": {"type": "string"}},
                "xml": {"name": "Category"}}
    tag = {"type": "object", "properties": {"id": {"type": "integer", "format": "int64"}, "name": {"type": "string"}}}
    address = {"type": "object", "required": ["street", "city"], "properties": {
        "street": {"type": "string", "example": "437 Lytton"}, "city": {"type": "string"},
        "state": {"type": "string", "minLength": 2, "maxLength": 2, "pattern": "^[A-Z]{2}$"},
        "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"}}}
    money = {"type": "object", "required": ["amount", "currency"], "properties": {
        "amount": {"type": "number", "format": "double"}, "currency": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    defs = {"Base": base, "Category": category, "Tag": tag, "Address": address, "Money": money}
    ref = lambda n: {"$ref": f"#/components/schemas/{n}"}  # noqa: E731

    def model(name: str, body: dict, inherit: bool = True) -> dict:
        schema = {"allOf": [ref("Base"), body]} if inherit else body
        return {**schema, "title": name, "components": {"schemas": defs}}

    models = {
        "Pet": model("Pet", {"type": "object", "required": ["name", "photoUrls"], "properties": {
            "name": {"type": "string", "example": "doggie"}, "category": ref("Category"),
            "photoUrls": {"type": "array", "items": {"type": "string"}, "xml": {"wrapped": True}},
            "tags": {"type": "array", "items": ref("Tag")},
            "status": {"type": "string", "enum": ["available", "pending", "sold"], "description": "pet status in the store"}}}),
        "Order": model("Order", {"type": "object", "properties": {
            "petId": {"type": "integer", "format": "int64"}, "quantity": {"type": "integer", "format": "int32"},
            "shipDate": {"type": "string", "format": "date-time"},
            "status": {"type": "string", "enum": ["placed", "approved", "delivered"]}, "complete": {"type": "boolean"}}}),
        "User": model("User", {"type": "object", "properties": {
            "username": {"type": "string"}, "firstName": {"type": "string"}, "lastName": {"type": "string"},
            "email": {"type": "string", "format": "email"}, "password": {"type": "string", "format": "password", "writeOnly": True},
            "phone": {"type": "string"}, "userStatus": {"type": "integer", "format": "int32", "description": "User Status"}}}),
        "ApiResponse": model("ApiResponse", {"type": "object", "properties": {
            "code": {"type": "integer", "format": "int32"}, "type": {"type": "string"}, "message": {"type": "string"}}}, inherit=False),
        "Customer": model("Customer", {"type": "object", "required": ["name", "address"], "properties": {
            "name": {"type": "string", "maxLength": 80}, "address": {**ref("Address"), "description": "billing address"},
            "shipping": {"allOf": [ref("Address")], "nullable": True},
            "vatId": {"type": "string", "pattern": "^[A-Z]{2}[0-9A-Z]{8,12}$"}}}),
        "Invoice": model("Invoice", {"type": "object", "required": ["number", "total", "lines"], "properties": {
            "number": {"type": "string", "pattern": "^INV-[0-9]{6}$"},
            "total": ref("Money"), "issuedOn": {"type": "string", "format": "date"},
            "lines": {"type": "array", "minItems": 1, "maxItems": 50, "items": {"type": "object", "required": ["sku", "qty", "price"], "properties": {
                "sku": {"type": "string"}, "qty": {"type": "integer", "format": "int32", "minimum": 1},
                "price": {"type": "number", "format": "float", "minimum": 0}, "discount": {"type": "number", "format": "double"}}}},
            "notes": {"type": "string", "maxLength": 500}}}),
        "Product": model("Product", {"type": "object", "required": ["sku", "price"], "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z0-9-]{4,20}$"}, "price": ref("Money"),
            "weightKg": {"type": "number", "format": "float", "exclusiveMinimum": 0},
            "dimensions": {"type": "array", "items": {"type": "number", "format": "double"}, "minItems": 3, "maxItems": 3},
            "image": {"type": "string", "format": "byte"}, "manual": {"type": "string", "format": "binary"},
            "barcode": {"type": "string", "format": "ean13"}}}),
        "Account": model("Account", {"type": "object", "required": ["iban"], "properties": {
            "iban": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}$"},
            "balance": {"type": "integer", "format": "int64", "description": "in cents"},
            "overdraftLimit": {"type": "integer", "format": "int64", "minimum": 0, "maximum": 18446744073709551615},
            "openedAt": {"type": "integer", "format": "utc-millisec"}}}),
        "Shipment": model("Shipment", {"type": "object", "required": ["trackingNumber", "carrier"], "properties": {
            "trackingNumber": {"type": "string"}, "carrier": {"type": "string", "enum": ["UPS", "FEDEX", "DHL", "USPS"]},
            "weight": {"type": "number", "format": "double"}, "from": ref("Address"), "to": ref("Address"),
            "events": {"type": "array", "items": {"type": "object", "required": ["at", "status"], "properties": {
                "at": {"type": "string", "format": "date-time"}, "status": {"type": "string"},
                "location": {"type": "object", "properties": {"lat": {"type": "number", "format": "double", "minimum": -90, "maximum": 90},
                                                              "lng": {"type": "number", "format": "double", "minimum": -180, "maximum": 180}}}}}}}}),
        "Review": model("Review", {"type": "object", "required": ["rating"], "properties": {
            "rating": {"type": "integer", "minimum": 1, "maximum": 5}, "title": {"type": "string", "maxLength": 120},
            "body": {"type": "string"}, "helpfulVotes": {"type": "integer", "format": "int32", "minimum": 0}}}),
        "Subscription": model("Subscription", {"type": "object", "required": ["plan", "status"], "properties": {
            "plan": {"type": "string", "enum": ["free", "pro", "enterprise"]},
            "status": {"type": "string", "enum": ["active", "past_due", "canceled"]},
            "seats": {"type": "integer", "format": "int32", "minimum": 1},
            "renewsAt": {"type": "string", "format": "date-time", "nullable": True},
            "price": ref("Money")}}),
        "Event": model("Event", {"type": "object", "required": ["type", "payload"], "properties": {
            "type": {"type": "string", "pattern": "^[a-z]+\\.[a-z_]+$"},
            "payload": {"type": "object", "additionalProperties": True},
            "version": {"type": "string", "format": "date-type"}}}),
        "Error": model("Error", {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "integer", "format": "int32"}, "message": {"type": "string"},
            "details": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "string"}}}}}, inherit=False),
        "Page": model("Page", {"type": "object", "required": ["items", "total"], "properties": {
            "items": {"type": "array", "items": ref("Tag")}, "total": {"type": "integer", "format": "int64"},
            "next": {"type": "string", "format": "uri", "nullable": True}}}, inherit=False),
    }
    # discriminated unions, as generators write them
    cat = {"type": "object", "required": ["petType", "huntingSkill"], "properties": {
        "petType": {"type": "string", "enum": ["cat"]}, "huntingSkill": {"type": "string", "enum": ["clueless", "lazy", "adventurous"]}}}
    dog = {"type": "object", "required": ["petType", "packSize"], "properties": {
        "petType": {"type": "string", "enum": ["dog"]}, "packSize": {"type": "integer", "format": "int32", "minimum": 0}}}
    models["PetUnion"] = {"oneOf": [{"$ref": "#/components/schemas/Cat"}, {"$ref": "#/components/schemas/Dog"}],
                          "discriminator": {"propertyName": "petType"}, "components": {"schemas": {"Cat": cat, "Dog": dog}}}
    card = {"type": "object", "required": ["kind", "last4"], "properties": {"kind": {"const": "card"},
                                                                           "last4": {"type": "string", "pattern": "^[0-9]{4}$"}}}
    bank = {"type": "object", "required": ["kind", "iban"], "properties": {"kind": {"const": "bank"}, "iban": {"type": "string"}}}
    models["PaymentMethod"] = {"type": "object", "required": ["method"], "properties": {
        "method": {"oneOf": [card, bank]}, "default": {"type": "boolean"}}}
    models["Overlapping"] = {"type": "object", "properties": {"value": {"oneOf": [
        {"type": "number"}, {"type": "integer", "minimum": 0}]}}}
    models["Tags"] = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}
    refusals = {"Overlapping": "oneOf", "Tags": "uniqueItems"}
    # more small generated models, the shapes repeated with other fields
    for i, (name, fields) in enumerate([
            ("Coupon", {"code": {"type": "string", "pattern": "^[A-Z0-9]{6,12}$"}, "percentOff": {"type": "number", "format": "float", "minimum": 0, "maximum": 100}}),
            ("Warehouse", {"name": {"type": "string"}, "capacity": {"type": "integer", "format": "int64"}, "address": {"$ref": "#/components/schemas/Address", "nullable": True}}),
            ("Employee", {"name": {"type": "string"}, "salary": {"$ref": "#/components/schemas/Money"}, "startDate": {"type": "string", "format": "date"}, "managerId": {"type": "integer", "format": "int64"}}),
            ("Ticket", {"title": {"type": "string", "maxLength": 200}, "priority": {"type": "string", "enum": ["low", "normal", "high", "urgent"]}, "assignee": {"type": "string", "format": "email"}, "estimate": {"type": "number", "format": "double"}}),
            ("Measurement", {"sensor": {"type": "string"}, "value": {"type": "number", "format": "double"}, "unit": {"type": "string", "enum": ["C", "F", "K"]}, "takenAt": {"type": "integer", "format": "int64"}}),
    ]):
        models[name] = model(name, {"type": "object", "required": list(fields)[:2], "properties": fields})
    return [(f"openapi/{n}", s, refusals.get(n)) for n, s in models.items()]


# ---- Azure resource definitions ---------------------------------------------------------------
def azure() -> list[tuple[str, dict, str | None]]:
    expression = {"type": "string", "pattern": "^\\[([^\\[].*)?\\]$", "description": "Deployment template expression."}

    def resource(rtype: str, api_versions: list[str], properties: dict, required_props: list[str], closed: bool = False) -> dict:
        props_def = {"type": "object", "properties": properties, **({"required": required_props} if required_props else {})}
        if closed:
            props_def["additionalProperties"] = False
        short = rtype.split("/")[-1]
        return {
            "id": f"https://schema.example.com/schemas/2021-01-01/{short}.json#",
            "$schema": "http://json-schema.org/draft-04/schema#",
            "title": rtype, "type": "object",
            "properties": {"resource": {"$ref": f"#/resourceDefinitions/{short}"}},
            "required": ["resource"],
            "resourceDefinitions": {short: {
                "type": "object", "required": ["name", "type", "apiVersion", "properties", "location"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 80},
                    "type": {"type": "string", "enum": [rtype]},
                    "apiVersion": {"type": "string", "enum": api_versions},
                    "location": {"type": "string"},
                    "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                    "properties": {"oneOf": [{"$ref": f"#/definitions/{short}Properties"}, {"$ref": "#/definitions/expression"}]},
                    "dependsOn": {"type": "array", "items": {"type": "string"}}},
                "description": rtype}},
            "definitions": {f"{short}Properties": props_def, "expression": expression,
                            "sku": {"type": "object", "required": ["name"], "properties": {
                                "name": {"type": "string", "enum": ["Basic", "Standard", "Premium"]},
                                "capacity": {"oneOf": [{"type": "integer", "minimum": 0}, {"$ref": "#/definitions/expression"}]}}}},
        }
    out = [
        ("applicationGateways", resource("Microsoft.Network/applicationGateways", ["2020-11-01", "2021-02-01"], {
            "sku": {"$ref": "#/definitions/sku"}, "enableHttp2": {"oneOf": [{"type": "boolean"}, {"$ref": "#/definitions/expression"}]},
            "gatewayIPConfigurations": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}},
            ["sku", "frontendPorts"]), None),
        ("storageAccounts", resource("Microsoft.Storage/storageAccounts", ["2021-04-01"], {
            "accessTier": {"type": "string", "enum": ["Hot", "Cool"]},
            "supportsHttpsTrafficOnly": {"oneOf": [{"type": "boolean"}, {"$ref": "#/definitions/expression"}]},
            "minimumTlsVersion": {"type": "string", "enum": ["TLS1_0", "TLS1_1", "TLS1_2"]}}, ["accessTier"]), None),
        ("virtualNetworks", resource("Microsoft.Network/virtualNetworks", ["2020-11-01"], {
            "addressSpace": {"type": "object", "required": ["addressPrefixes"], "properties": {
                "addressPrefixes": {"type": "array", "items": {"type": "string"}}}},
            "enableDdosProtection": {"type": "boolean"}}, ["addressSpace", "subnets"]), None),
        ("sites", resource("Microsoft.Web/sites", ["2020-12-01"], {
            "serverFarmId": {"type": "string"}, "httpsOnly": {"type": "boolean"},
            "siteConfig": {"type": "object", "properties": {"alwaysOn": {"type": "boolean"},
                                                            "numberOfWorkers": {"type": "integer", "format": "int32"}}}}, ["serverFarmId"]), None),
        ("vaults", resource("Microsoft.KeyVault/vaults", ["2019-09-01"], {
            "tenantId": {"type": "string", "format": "uuid"}, "sku": {"$ref": "#/definitions/sku"},
            "enableSoftDelete": {"type": "boolean"}, "softDeleteRetentionInDays": {"type": "integer", "minimum": 7, "maximum": 90}},
            ["tenantId", "sku"], closed=True), None),
        ("databaseAccounts", resource("Microsoft.DocumentDB/databaseAccounts", ["2021-04-15"], {
            "databaseAccountOfferType": {"type": "string", "enum": ["Standard"]},
            "consistencyPolicy": {"type": "object", "required": ["defaultConsistencyLevel"], "properties": {
                "defaultConsistencyLevel": {"type": "string", "enum": ["Eventual", "Session", "BoundedStaleness", "Strong", "ConsistentPrefix"]},
                "maxStalenessPrefix": {"type": "integer", "format": "int64", "minimum": 1, "maximum": 2147483647}}}},
            ["databaseAccountOfferType", "locations"]), None),
        ("registries", resource("Microsoft.ContainerRegistry/registries", ["2021-06-01-preview"], {
            "adminUserEnabled": {"type": "boolean"}, "sku": {"$ref": "#/definitions/sku"}}, ["sku"]), None),
        ("managedClusters", resource("Microsoft.ContainerService/managedClusters", ["2021-05-01"], {
            "kubernetesVersion": {"type": "string"}, "dnsPrefix": {"type": "string", "maxLength": 54, "pattern": "^[a-zA-Z0-9][a-zA-Z0-9-]*$"},
            "agentPoolProfiles": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string", "pattern": "^[a-z][a-z0-9]{0,11}$"}, "count": {"type": "integer", "format": "int32"},
                "vmSize": {"type": "string"}}}}}, ["dnsPrefix"]), None),
        ("workspaces", resource("Microsoft.OperationalInsights/workspaces", ["2020-08-01"], {
            "retentionInDays": {"type": "integer", "format": "int32", "minimum": 30, "maximum": 730},
            "sku": {"type": "object", "properties": {"name": {"type": "string", "enum": ["PerGB2018", "Free"]}}}}, ["sku"]), None),
        ("publicIPAddresses", resource("Microsoft.Network/publicIPAddresses", ["2020-11-01"], {
            "publicIPAllocationMethod": {"type": "string", "enum": ["Static", "Dynamic"]},
            "idleTimeoutInMinutes": {"type": "integer", "format": "int32"},
            "dnsSettings": {"type": "object", "properties": {"domainNameLabel": {"type": "string"}}}}, ["publicIPAllocationMethod"]), None),
        ("serverfarms", resource("Microsoft.Web/serverfarms", ["2020-12-01"], {
            "reserved": {"type": "boolean"}, "perSiteScaling": {"type": "boolean"},
            "maximumElasticWorkerCount": {"type": "integer", "format": "int32"}}, ["reserved"]), None),
        ("networkSecurityGroups", resource("Microsoft.Network/networkSecurityGroups", ["2020-11-01"], {
            "securityRules": {"type": "array", "items": {"type": "object", "required": ["name", "properties"], "properties": {
                "name": {"type": "string"}, "properties": {"type": "object", "required": ["protocol", "access", "priority", "direction"], "properties": {
                    "protocol": {"type": "string", "enum": ["Tcp", "Udp", "*"]}, "access": {"type": "string", "enum": ["Allow", "Deny"]},
                    "priority": {"type": "integer", "minimum": 100, "maximum": 4096},
                    "direction": {"type": "string", "enum": ["Inbound", "Outbound"]},
                    "destinationPortRange": {"type": "string"}}}}}}}, ["securityRules"]), None),
        ("eventHubs", resource("Microsoft.EventHub/namespaces", ["2021-01-01-preview"], {
            "isAutoInflateEnabled": {"type": "boolean"},
            "maximumThroughputUnits": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 20}}, ["isAutoInflateEnabled"]), None),
        ("redis", resource("Microsoft.Cache/redis", ["2020-12-01"], {
            "enableNonSslPort": {"type": "boolean"}, "redisConfiguration": {"type": "object", "additionalProperties": {"type": "string"}},
            "shardCount": {"type": "integer", "format": "int32"}}, ["sku"], closed=True), "required"),
        ("loadBalancers", resource("Microsoft.Network/loadBalancers", ["2020-11-01"], {
            "frontendIPConfigurations": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "probes": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"}, "port": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
                "intervalInSeconds": {"type": "integer", "format": "int32"}}}}}, ["frontendIPConfigurations"]), None),
        ("disks", resource("Microsoft.Compute/disks", ["2020-12-01"], {
            "diskSizeGB": {"type": "integer", "format": "int32", "minimum": 1},
            "creationData": {"type": "object", "required": ["createOption"], "properties": {
                "createOption": {"type": "string", "enum": ["Empty", "Copy", "FromImage", "Import"]}}},
            "encryption": {"type": "object", "properties": {"type": {"type": "string"}}}}, ["creationData"]), None),
        ("servers", resource("Microsoft.Sql/servers", ["2021-02-01-preview"], {
            "administratorLogin": {"type": "string"}, "administratorLoginPassword": {"type": "string", "format": "password"},
            "version": {"type": "string", "enum": ["12.0"]}, "minimalTlsVersion": {"type": "string", "pattern": "^1\\.[0-2]$"}},
            ["administratorLogin"]), None),
        ("userAssignedIdentities", resource("Microsoft.ManagedIdentity/userAssignedIdentities", ["2018-11-30"], {
            "clientId": {"type": "string", "format": "uuid", "readOnly": True}}, []), None),
        ("actionGroups", resource("Microsoft.Insights/actionGroups", ["2019-06-01"], {
            "groupShortName": {"type": "string", "maxLength": 12}, "enabled": {"type": "boolean"},
            "emailReceivers": {"type": "array", "items": {"type": "object", "required": ["name", "emailAddress"], "properties": {
                "name": {"type": "string"}, "emailAddress": {"type": "string", "format": "email"},
                "useCommonAlertSchema": {"type": "boolean"}}}}}, ["groupShortName", "enabled"]), None),
    ]
    return [(f"azure/{n}", s, r) for n, s, r in out]


# ---- function calling ---------------------------------------------------------------------------
def functions() -> list[tuple[str, dict, str | None]]:
    obj = lambda props, req=None, closed=True: {"type": "object", "properties": props,  # noqa: E731
                                                 "required": list(props) if req is None else req,
                                                 **({"additionalProperties": False} if closed else {})}
    s, i, n, b = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
    enum = lambda *v: {"type": "string", "enum": list(v)}  # noqa: E731
    fns = {
        "get_weather": obj({"location": {**s, "description": "City and country, e.g. Paris, France"},
                            "unit": enum("celsius", "fahrenheit")}),
        "get_forecast": obj({"latitude": {**n, "minimum": -90, "maximum": 90}, "longitude": {**n, "minimum": -180, "maximum": 180},
                             "days": {**i, "minimum": 1, "maximum": 14}}),
        "search_web": obj({"query": s, "num_results": {**i, "minimum": 1, "maximum": 20}, "safe_search": b}, ["query"]),
        "send_email": obj({"to": {"type": "array", "items": {**s, "format": "email"}, "minItems": 1}, "subject": {**s, "maxLength": 120},
                           "body": s, "cc": {"type": "array", "items": {**s, "format": "email"}}}, ["to", "subject", "body"]),
        "create_calendar_event": obj({"title": s, "start": {**s, "format": "date-time"}, "end": {**s, "format": "date-time"},
                                      "attendees": {"type": "array", "items": s}, "location": {"anyOf": [s, {"type": "null"}]}}),
        "book_flight": obj({"origin": {**s, "pattern": "^[A-Z]{3}$"}, "destination": {**s, "pattern": "^[A-Z]{3}$"},
                            "date": {**s, "format": "date"}, "passengers": {**i, "minimum": 1, "maximum": 9},
                            "cabin": enum("economy", "premium", "business", "first")}),
        "calculate": obj({"expression": s, "precision": {**i, "minimum": 0, "maximum": 10}}, ["expression"]),
        "convert_currency": obj({"amount": n, "from_currency": {**s, "pattern": "^[A-Z]{3}$"}, "to_currency": {**s, "pattern": "^[A-Z]{3}$"}}),
        "set_thermostat": obj({"temperature": {**n, "minimum": 10, "maximum": 30}, "mode": enum("heat", "cool", "auto", "off")}),
        "add_todo": obj({"title": s, "due": {**s, "format": "date"}, "priority": {**i, "enum": [1, 2, 3]},
                         "tags": {"type": "array", "items": s, "maxItems": 5}}, ["title"]),
        "get_stock_price": obj({"ticker": {**s, "pattern": "^[A-Z]{1,5}$"}, "exchange": enum("NYSE", "NASDAQ", "LSE")}, ["ticker"]),
        "translate": obj({"text": s, "source_language": {**s, "minLength": 2, "maxLength": 5}, "target_language": {**s, "minLength": 2, "maxLength": 5}}),
        "run_sql": obj({"query": s, "database": s, "timeout_seconds": {**n, "exclusiveMinimum": 0}}, ["query"]),
        "resize_image": obj({"url": {**s, "format": "uri"}, "width": {**i, "minimum": 1}, "height": {**i, "minimum": 1},
                             "keep_aspect": b}, ["url", "width"]),
        "create_invoice": obj({"customer_id": s, "items": {"type": "array", "minItems": 1, "items": obj({
            "description": s, "quantity": {**i, "minimum": 1}, "unit_price": n})}, "currency": enum("USD", "EUR", "GBP")}),
        "schedule_meeting": obj({"participants": {"type": "array", "items": obj({"name": s, "email": {**s, "format": "email"}}, ["email"])},
                                 "duration_minutes": {**i, "enum": [15, 30, 45, 60]}, "topic": s}),
        "update_user_profile": obj({"user_id": s, "changes": obj({"display_name": s, "bio": {**s, "maxLength": 160},
                                                                  "birthday": {**s, "format": "date"}}, [], closed=True)}),
        "navigate": obj({"waypoints": {"type": "array", "items": obj({"lat": n, "lng": n}), "minItems": 2, "maxItems": 10},
                         "avoid_tolls": b}),
        "log_workout": obj({"activity": enum("run", "bike", "swim", "lift"), "duration_min": n, "distance_km": {"anyOf": [n, {"type": "null"}]},
                            "calories": i}),
        "order_pizza": obj({"size": enum("small", "medium", "large"), "toppings": {"type": "array", "items": enum("cheese", "pepperoni", "mushroom", "olive")},
                            "address": s, "tip_percent": {**n, "minimum": 0, "maximum": 30}}),
        "classify_ticket": obj({"category": enum("billing", "bug", "feature", "other"), "confidence": {**n, "minimum": 0, "maximum": 1},
                                "summary": {**s, "maxLength": 200}}),
        "extract_entities": obj({"entities": {"type": "array", "items": obj({"text": s, "type": enum("PERSON", "ORG", "LOC", "DATE"),
                                                                              "start": i, "end": i})}}),
        "rate_limit_config": obj({"requests_per_minute": i, "burst": i, "scope": enum("user", "ip", "global")}),
        "geocode": obj({"address": s, "country_code": {**s, "pattern": "^[A-Z]{2}$"}}, ["address"]),
        "sentiment": obj({"score": n, "label": enum("negative", "neutral", "positive")}),
        "create_github_issue": obj({"repo": {**s, "pattern": "^[\\w.-]+/[\\w.-]+$"}, "title": s, "body": s,
                                    "labels": {"type": "array", "items": s}}, ["repo", "title"]),
        "play_music": obj({"query": s, "shuffle": b, "volume": {**i, "minimum": 0, "maximum": 100}}, ["query"]),
        "reserve_table": obj({"restaurant": s, "party_size": {**i, "minimum": 1, "maximum": 20}, "time": {**s, "format": "date-time"},
                              "notes": {"anyOf": [s, {"type": "null"}]}}),
        "file_expense": obj({"amount": {**n, "exclusiveMinimum": 0}, "category": enum("travel", "meals", "office", "other"),
                             "date": {**s, "format": "date"}, "receipt_url": {**s, "format": "uri"}}, ["amount", "category"]),
        "lookup_order": obj({"order_id": {**s, "pattern": "^[0-9]{8}$"}, "include_items": b}, ["order_id"]),
    }
    out = [(name, {"type": "object", **schema} if "type" not in schema else schema, None) for name, schema in fns.items()]
    # Pydantic-generated parameter schemas: $defs, titles, anyOf-with-null defaults, $ref with a description
    out.append(("pydantic_Itinerary", {
        "$defs": {"Stop": {"title": "Stop", "type": "object", "required": ["city", "nights"], "properties": {
            "city": {"title": "City", "type": "string"}, "nights": {"title": "Nights", "type": "integer", "minimum": 1},
            "budget": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None, "title": "Budget"}}}},
        "title": "Itinerary", "type": "object", "required": ["traveller", "stops"], "properties": {
            "traveller": {"title": "Traveller", "type": "string"},
            "stops": {"title": "Stops", "type": "array", "items": {"$ref": "#/$defs/Stop"}},
            "first_stop": {"$ref": "#/$defs/Stop", "description": "the first stop"}}}, None))
    out.append(("pydantic_Measurement", {"title": "Measurement", "type": "object", "required": ["value", "unit"], "properties": {
        "value": {"title": "Value", "type": "number"}, "unit": {"title": "Unit", "type": "string"},
        "error": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None}}}, None))
    out.append(("pydantic_Tree", {"$defs": {"Node": {"type": "object", "required": ["label"], "properties": {
        "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []}}}},
        "$ref": "#/$defs/Node"}, None))
    out.append(("search_with_filter_not", {"type": "object", "properties": {"q": s, "exclude": {"not": {"type": "null"}}}}, "not"))
    return [(f"functions/{n}", sch, r) for n, sch, r in out]


def main() -> None:
    entries = []
    for family, build in (("kubernetes", kubernetes), ("ci", ci), ("openapi", openapi), ("azure", azure),
                          ("functions", functions)):
        for name, schema, refuse in build():
            entry = {"name": name, "family": family, "schema": copy.deepcopy(schema)}
            if refuse:
                entry["refuse"] = refuse
            entries.append(entry)
    OUT.write_text(json.dumps(entries, indent=1) + "\n")
    print(f"{len(entries)} schemas -> {OUT}")


if __name__ == "__main__":
    main()
