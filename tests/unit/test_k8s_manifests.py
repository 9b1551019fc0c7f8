"""deploy/k8s/ is valid: the Kubernetes objects against the schemas kubernetes-validate ships (offline,
strict: an unknown field fails), KEDA's against the CRD schemas vendored in deploy/k8s/schemas/, and
the parts that must agree with rewardq (probes, stream, group, grace) checked against the code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rewardq.config import WorkerConfig
from rewardq.consumers.compose import EXIT_AFTER_GRACE
from rewardq.queue.keys import GROUP, Keyspace

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KEDA_SCHEMAS = {
    "ScaledObject": K8S / "schemas" / "keda-scaledobject-v1alpha1.json",
    "TriggerAuthentication": K8S / "schemas" / "keda-triggerauthentication-v1alpha1.json",
}
#: The trigger metadata KEDA's redis-streams scaler reads (pkg/scalers/redis_streams_scaler.go and
#: the connection fields of redis_scaler.go); anything else is ignored by KEDA, so a typo would be silent.
REDIS_STREAMS_METADATA = {
    "pendingEntriesCount", "streamLength", "lagCount", "stream", "consumerGroup", "databaseIndex",
    "activationLagCount", "enableTLS", "address", "addresses", "host", "hosts", "port", "ports",
    "username", "password", "sentinelUsername", "sentinelPassword", "sentinelMaster", "unsafeSsl",
}  # fmt: skip


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return out


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def test_there_are_a_deployment_and_a_scaledobject() -> None:
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"Deployment", "ScaledObject", "TriggerAuthentication", "ConfigMap", "Secret"} <= kinds


@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_each_object_is_valid_against_its_schema(name: str, doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("keda.sh/"):
        schema = json.loads(KEDA_SCHEMAS[doc["kind"]].read_text())
        jsonschema.validate(doc, schema)
    else:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_the_validators_refuse_a_broken_object() -> None:
    (deployment,) = by_kind("Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["comand"] = ["x"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.latest_version(), strict=True)
    (so,) = by_kind("ScaledObject")
    broken = json.loads(json.dumps(so))
    del broken["spec"]["scaleTargetRef"]["name"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, json.loads(KEDA_SCHEMAS["ScaledObject"].read_text()))


def test_probes_run_rewardq_health_and_the_grace_covers_a_graceful_stop() -> None:
    from click.testing import CliRunner

    from rewardq.cli import cli

    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["rewardq", "health"], probe
        assert CliRunner().invoke(cli, [*command[1:], "--help"]).exit_code == 0  # every flag exists
    (cm,) = by_kind("ConfigMap")
    grace = yaml.safe_load(cm["data"]["worker.yaml"]).get("shutdown_grace", WorkerConfig.shutdown_grace)
    assert pod["terminationGracePeriodSeconds"] >= grace + EXIT_AFTER_GRACE + 1
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_scaler_watches_the_workers_stream_and_group_on_pending_entries() -> None:
    (so,) = by_kind("ScaledObject")
    (deployment,) = by_kind("Deployment")
    assert so["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "redis-streams"
    meta = trigger["metadata"]
    assert set(meta) <= REDIS_STREAMS_METADATA, set(meta) - REDIS_STREAMS_METADATA
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert meta["stream"] == Keyspace(env["REWARDQ_NAMESPACE"]).stream(0)
    assert meta["consumerGroup"] == GROUP and int(meta["pendingEntriesCount"]) > 0
    auth = trigger["authenticationRef"]["name"]
    assert auth in {doc["metadata"]["name"] for doc in by_kind("TriggerAuthentication")}
