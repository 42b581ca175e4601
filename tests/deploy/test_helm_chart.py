"""The Helm chart, rendered by Helm's engine: lint clean, every object valid for Kubernetes (strict
schemas, oldest and newest supported versions) and for the Prometheus Operator CRDs, and the
ports, probes and drain timing the server's own command line implies."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from server.cli import build_parser
from tests.deploy.manifests import (
    CHART,
    KUBERNETES_VERSIONS,
    chart_manifests,
    chart_values,
    describe,
    one,
    validation_errors,
)

DEFAULTS = build_parser().parse_args(["--model-repository", "/models"])
# Helm's lint severities (pkg/lint/support): info 1, warning 2, error 4.
LINT_WARNING = 2

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "ascend": chart_values("values-ascend.yaml"),
    "grpc-probes": {"probes": {"type": "grpc"}, "server": {"extraArgs": ["--allow-http=false"]}},
    "init-container": {
        "modelRepository": {
            "source": "initContainer",
            "initContainer": {
                "image": "amazon/aws-cli:2.17.0",
                "command": ["aws", "s3", "sync", "s3://models/repository", "/models"],
            },
        }
    },
    "model-image": {
        "modelRepository": {"source": "image", "image": {"repository": "registry.local/models"}}
    },
    "monitoring": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "fixed-replicas": {
        "autoscaling": {"enabled": False},
        "podDisruptionBudget": {"enabled": False},
        "serviceAccount": {"create": False},
    },
}


def server_container(manifests: list[dict]) -> dict:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "ascend-serve")


def test_chart_lints_without_warnings():
    report = helm.lint(str(CHART))
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= LINT_WARNING] == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_every_rendered_object_validates(variant, kubernetes_version):
    manifests = chart_manifests(VARIANTS[variant])
    errors = [e for m in manifests for e in validation_errors(m, kubernetes_version)]
    assert errors == []
    kinds = {m["kind"] for m in manifests}
    assert {"Deployment", "Service"} <= kinds


def test_validation_refuses_misspelt_fields_in_built_in_and_custom_kinds():
    """The check above would be worthless if unknown fields passed (strict schemas)."""
    extra = {"extraEnv": [{"name": "A", "valu": "1"}]}
    errors = [e for m in chart_manifests(extra) for e in validation_errors(m, "1.37.0")]
    assert len(errors) == 1 and "'valu' was unexpected" in errors[0]
    assert errors[0].startswith("Deployment/demo-ascend-serve: ")
    monitor = one(chart_manifests(VARIANTS["monitoring"]), "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    assert validation_errors(monitor, "1.37.0") == [
        "ServiceMonitor/demo-ascend-serve: Additional properties are not allowed ('intervall' was "
        "unexpected) at /spec/endpoints/0"
    ]


def test_default_render_has_the_expected_objects():
    kinds = sorted(describe(m) for m in chart_manifests())
    assert kinds == [
        "Deployment/demo-ascend-serve",
        "HorizontalPodAutoscaler/demo-ascend-serve",
        "PodDisruptionBudget/demo-ascend-serve",
        "Service/demo-ascend-serve",
        "ServiceAccount/demo-ascend-serve",
    ]
    monitored = {m["kind"] for m in chart_manifests(VARIANTS["monitoring"])}
    assert {"ServiceMonitor", "PrometheusRule"} <= monitored


def test_container_args_parse_with_the_servers_cli_and_ports_are_its_defaults():
    manifests = chart_manifests()
    container = server_container(manifests)
    args = build_parser().parse_args(container["args"])
    assert [str(p) for p in args.model_repositories] == ["/models"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (
        ports
        == {
            "http": DEFAULTS.http_port,
            "grpc": DEFAULTS.grpc_port,
            "metrics": DEFAULTS.metrics_port,
        }
        == {"http": 8000, "grpc": 8001, "metrics": 8002}
    )
    assert (args.http_port, args.grpc_port, args.metrics_port) == (8000, 8001, 8002)
    service = one(manifests, "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        name: (port, name) for name, port in ports.items()
    }
    assert args.exit_timeout_secs == DEFAULTS.exit_timeout_secs


def test_http_probes_use_the_servers_health_routes():
    container = server_container(chart_manifests())
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] == 600  # slow model loads


def test_grpc_probe_variant_uses_grpc_health_on_the_grpc_port():
    container = server_container(chart_manifests(VARIANTS["grpc-probes"]))
    assert container["readinessProbe"]["grpc"] == {"port": DEFAULTS.grpc_port}
    assert container["startupProbe"]["grpc"] == {"port": DEFAULTS.grpc_port}
    # The health service reports readiness; liveness must not restart a live, unready server.
    assert container["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert "--allow-http=false" in container["args"]
    assert build_parser().parse_args(container["args"]).allow_http is False


@pytest.mark.parametrize("exit_timeout", [30, 7.5, 120])
def test_grace_period_covers_prestop_and_the_servers_drain(exit_timeout):
    manifests = chart_manifests({"server": {"exitTimeoutSecs": exit_timeout}})
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = server_container(manifests)
    drain = build_parser().parse_args(container["args"]).exit_timeout_secs
    assert drain == exit_timeout
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] >= sleep + drain + 5


def test_security_context_is_non_root_with_a_read_only_root():
    manifests = chart_manifests()
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    container = server_container(manifests)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # What the server writes: /tmp (load-API overrides) and /dev/shm.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]]["emptyDir"] == {}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/models"]]["persistentVolumeClaim"] == {
        "claimName": "ascend-serve-models",
        "readOnly": True,
    }


def test_ascend_values_request_the_device_plugin_resource_and_mount_the_driver():
    manifests = chart_manifests(VARIANTS["ascend"])
    container = server_container(manifests)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    for side in ("limits", "requests"):
        assert container["resources"][side]["huawei.com/Ascend910"] == 1
    hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert hostpaths["ascend-driver"] == "/usr/local/Ascend/driver"
    mounted = {m["name"]: m for m in container["volumeMounts"]}
    assert all(mounted[name]["readOnly"] for name in hostpaths)
    assert {
        "name": "ASCEND_SET_ENV",
        "value": "/usr/local/Ascend/ascend-toolkit/set_env.sh",
    } in container["env"]
    assert pod["securityContext"]["supplementalGroups"] == [1000]
    rolling = one(manifests, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxUnavailable": 1, "maxSurge": 0}  # no spare NPU needed to roll
    default = one(chart_manifests(), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert default == {"maxUnavailable": 0, "maxSurge": 1}

    other = chart_manifests(
        {
            **VARIANTS["ascend"],
            "ascend": {"enabled": True, "resourceName": "huawei.com/Ascend310P", "count": 2},
        }
    )
    assert server_container(other)["resources"]["limits"]["huawei.com/Ascend310P"] == 2
    assert "huawei.com/Ascend910" not in server_container(other)["resources"]["limits"]
    assert "huawei.com/Ascend910" not in str(chart_manifests())


def test_model_repository_sources():
    init = one(chart_manifests(VARIANTS["init-container"]), "Deployment")["spec"]["template"][
        "spec"
    ]
    assert init["initContainers"][0]["image"] == "amazon/aws-cli:2.17.0"
    assert {"mountPath": "/models", "name": "models"} in init["initContainers"][0]["volumeMounts"]
    assert "emptyDir" in next(v for v in init["volumes"] if v["name"] == "models")

    image = one(chart_manifests(VARIANTS["model-image"]), "Deployment")["spec"]["template"]["spec"]
    copier = image["initContainers"][0]
    assert copier["image"] == "registry.local/models:latest"
    assert copier["command"] == ["cp", "-R", "/models/.", "/model-repository/"]


def test_bad_values_fail_with_a_message():
    with pytest.raises(
        helm.HelmError, match='modelRepository.source must be pvc, initContainer or image, not "s3"'
    ):
        chart_manifests({"modelRepository": {"source": "s3"}})
    with pytest.raises(helm.HelmError, match="modelRepository.initContainer.image is required"):
        chart_manifests({"modelRepository": {"source": "initContainer"}})


def test_hpa_scales_on_pending_requests_per_pod_with_cpu_as_fallback():
    hpa = one(chart_manifests(), "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "demo-ascend-serve",
    }
    pods, cpu = hpa["spec"]["metrics"]
    assert pods == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "nv_inference_pending_request_count"},
            "target": {"type": "AverageValue", "averageValue": "16"},
        },
    }
    assert cpu["resource"]["name"] == "cpu"
    assert "replicas" not in one(chart_manifests(), "Deployment")["spec"]  # the HPA owns it
    cpu_only = one(
        chart_manifests({"autoscaling": {"pendingRequests": {"enabled": False}}}),
        "HorizontalPodAutoscaler",
    )
    assert [m["type"] for m in cpu_only["spec"]["metrics"]] == ["Resource"]


def test_service_monitor_scrapes_the_metrics_port():
    monitor = one(chart_manifests(VARIANTS["monitoring"]), "ServiceMonitor")
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    service = one(chart_manifests(), "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
