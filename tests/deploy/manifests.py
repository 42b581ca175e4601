"""Render and check the deployment files in deploy/ without a cluster.

The Helm chart is rendered by Helm's own Go engine (`helm-python-sdk`, Helm's SDK as a shared
library: no helm binary is installable here); built-in kinds are validated with
`kubernetes-validate`'s strict schemas, custom resources (KServe, Prometheus Operator) against
the CRD schemas committed in tests/deploy/crds (SOURCES.json says where each comes from).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "ascend-serve"
KSERVE = DEPLOY / "kserve"
DASHBOARD = DEPLOY / "grafana" / "ascend-serve-dashboard.json"
CRDS = Path(__file__).resolve().parent / "crds"
# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
RELEASE, NAMESPACE = "demo", "inference"

Manifest = dict[str, Any]


def chart_values(*files: str) -> dict[str, Any]:
    """The values of the named files in the chart directory, merged left to right as Helm does
    with repeated -f (maps merge, everything else is replaced)."""
    merged: dict[str, Any] = {}
    for name in files:
        _merge(merged, yaml.safe_load((CHART / name).read_text()) or {})
    return merged


def _merge(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def render_chart(values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """`helm template demo deploy/helm/ascend-serve -n inference` with these user values:
    template path -> rendered text."""
    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)


def chart_manifests(values: Mapping[str, Any] | None = None) -> list[Manifest]:
    """Every Kubernetes object the chart renders (NOTES.txt and empty documents left out)."""
    documents: list[Manifest] = []
    for path, text in sorted(render_chart(values).items()):
        if path.endswith(".yaml"):
            documents += [d for d in yaml.safe_load_all(text) if d]
    return documents


def file_manifests(paths: Iterable[Path]) -> list[Manifest]:
    return [d for path in paths for d in yaml.safe_load_all(path.read_text()) if d]


def one(manifests: Iterable[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def describe(manifest: Manifest) -> str:
    return f"{manifest.get('kind')}/{manifest.get('metadata', {}).get('name')}"


# ----- schema validation ------------------------------------------------------------------
def validation_errors(manifest: Manifest, kubernetes_version: str) -> list[str]:
    """Why the API server would refuse this object (empty when it validates). Unknown fields
    count as errors for custom resources too, where a real API server would silently drop them:
    a misspelt field must not pass."""
    group = manifest.get("apiVersion", "").split("/")[0]
    if group in crd_groups():
        return _crd_errors(manifest)
    try:
        kubernetes_validate.validate(manifest, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{describe(manifest)}: {error.message} at /{'/'.join(map(str, error.path))}"]
    return []


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, made strict."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
                schemas[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = schema
    return schemas


@cache
def crd_groups() -> frozenset[str]:
    return frozenset(api_version.split("/")[0] for api_version, _ in crd_schemas())


def _strict(schema: Any) -> Any:
    """additionalProperties: false wherever a structural schema lists its properties and does
    not preserve unknown fields (what kubeconform's --strict does)."""
    if isinstance(schema, dict):
        for value in schema.values():
            _strict(value)
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            # metadata is validated by the API server's ObjectMeta, not the CRD schema.
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        for value in schema:
            _strict(value)
    return schema


def _crd_errors(manifest: Manifest) -> list[str]:
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    schema = crd_schemas().get(key)
    if schema is None:
        return [f"{describe(manifest)}: no CRD schema for {key} in {CRDS}"]
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{describe(manifest)}: {error.message} at /{'/'.join(map(str, error.path))}"
        for error in sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))
    ]


def crd_sources() -> dict[str, Any]:
    return json.loads((CRDS / "SOURCES.json").read_text())
