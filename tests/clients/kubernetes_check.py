"""Check that deploy/kubernetes holds together beyond each file's schema (kubernetes-validate
checks those): every kustomization names files that exist, every Secret key, ConfigMap and
port a Deployment uses is defined, the autoscalers target the Deployment, the ServiceMonitor
scrapes a port the Service has, and the CRD-based files (KEDA, ServiceMonitor) have the fields
their operators need. Writes each ConfigMap of tenant manifests to OUT/<configmap name>/ so
the caller can serve them.

Usage: python kubernetes_check.py DEPLOY_KUBERNETES_DIR OUT_DIR
"""

import pathlib
import sys

import yaml


def fail(message):
    print(f"kubernetes check: {message}", file=sys.stderr)
    sys.exit(1)


def load_all(root):
    documents = []
    for path in sorted(root.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                documents.append((path.relative_to(root), document))
    return documents


def by_kind(documents, kind):
    return {doc["metadata"]["name"]: doc for _, doc in documents if doc.get("kind") == kind}


def check_kustomizations(root, documents):
    for path, doc in documents:
        if doc.get("kind") != "Kustomization":
            continue
        for resource in doc.get("resources", []):
            target = (root / path.parent / resource).resolve()
            if not target.exists():
                fail(f"{path} names {resource}, which does not exist")


def check_deployments(documents):
    secrets = by_kind(documents, "Secret")
    configmaps = by_kind(documents, "ConfigMap")
    for name, deployment in by_kind(documents, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in selector.items()):
            fail(f"deployment {name}: the selector does not match the pod's labels")
        for volume in pod.get("volumes", []):
            if "configMap" in volume and volume["configMap"]["name"] not in configmaps:
                fail(f"deployment {name}: no ConfigMap {volume['configMap']['name']}")
        for container in pod["containers"]:
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                port = container.get(probe, {}).get("httpGet", {}).get("port")
                if port is None or port not in ports:
                    fail(f"deployment {name}: {probe} on an unnamed port {port}")
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional") and ref["key"] not in secrets.get(ref["name"], {}).get("stringData", {}):
                    fail(f"deployment {name}: secret {ref['name']} has no key {ref['key']}")
            if "--drain-grace-s" not in " ".join(container.get("args", [])):
                fail(f"deployment {name}: no --drain-grace-s")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace < 45:
            fail(f"deployment {name}: terminationGracePeriodSeconds {grace} is under preStop + grace + timeout")


def check_scalers(documents):
    deployments = by_kind(documents, "Deployment")
    for name, hpa in by_kind(documents, "HorizontalPodAutoscaler").items():
        if hpa["spec"]["scaleTargetRef"]["name"] not in deployments:
            fail(f"hpa {name} scales no shipped Deployment")
    for name, scaled in by_kind(documents, "ScaledObject").items():
        if scaled["apiVersion"] != "keda.sh/v1alpha1":
            fail(f"ScaledObject {name}: apiVersion")
        if scaled["spec"]["scaleTargetRef"]["name"] not in deployments:
            fail(f"ScaledObject {name} scales no shipped Deployment")
        for trigger in scaled["spec"]["triggers"]:
            metadata = trigger["metadata"]
            if trigger["type"] != "prometheus" or not {"serverAddress", "query", "threshold"} <= metadata.keys():
                fail(f"ScaledObject {name}: a prometheus trigger needs serverAddress, query and threshold")


def check_service_monitor(documents):
    services = by_kind(documents, "Service")
    secrets = by_kind(documents, "Secret")
    for name, monitor in by_kind(documents, "ServiceMonitor").items():
        if monitor["apiVersion"] != "monitoring.coreos.com/v1":
            fail(f"ServiceMonitor {name}: apiVersion")
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matching = [s for s in services.values() if all(s["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
        if not matching:
            fail(f"ServiceMonitor {name} selects no Service")
        ports = {p["name"] for s in matching for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            if endpoint["port"] not in ports:
                fail(f"ServiceMonitor {name}: no Service port {endpoint['port']}")
            credentials = endpoint.get("authorization", {}).get("credentials")
            if credentials and credentials["key"] not in secrets.get(credentials["name"], {}).get("stringData", {}):
                fail(f"ServiceMonitor {name}: the metrics token is not in the Secret")


def write_tenants(documents, out):
    for name, configmap in by_kind(documents, "ConfigMap").items():
        tomls = {k: v for k, v in configmap.get("data", {}).items() if k.endswith(".toml")}
        if tomls:
            directory = out / name
            directory.mkdir(parents=True, exist_ok=True)
            for file, text in tomls.items():
                (directory / file).write_text(text)


def main():
    root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    documents = load_all(root)
    check_kustomizations(root, documents)
    check_deployments(documents)
    check_scalers(documents)
    check_service_monitor(documents)
    write_tenants(documents, out)
    print(f"kubernetes check: {len(documents)} documents hold together")


main()
