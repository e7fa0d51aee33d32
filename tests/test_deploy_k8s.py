"""deploy/k8s renders with `kubectl kustomize` and every object is valid against the Kubernetes schemas
(kubernetes-validate ships them: no network), strictly (an unknown field fails). Then what the schemas cannot
say: probes on the right paths, the grace period above the drain, /data on the PVC, selectors that select, the GPU,
no root. The RayService is a custom resource: its pod templates are validated as PodTemplates, its serve config
as basal's. Each check has a negative control on a deliberately broken copy of the render."""

from __future__ import annotations

import ast
import copy
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES = "1.33.0"  # validated against this version's schemas (kubernetes-validate ships them)
PRESTOP_S = 10


def render(name: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is needed to render deploy/k8s (kustomize v5)")
        pytest.skip("no kubectl: deploy/k8s is not rendered here")
    done = subprocess.run([kubectl, "kustomize", str(K8S / name)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def schema_problems(objects: list[dict]) -> list[str]:
    problems = []
    for obj in objects:
        checked = [obj]
        if obj["kind"] == "RayService":  # a custom resource: its pod templates are core objects
            cluster = obj["spec"]["rayClusterConfig"]
            groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
            checked = [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": g["template"]}
                       for g in groups]  # fmt: skip
        for item in checked:
            try:
                kubernetes_validate.validate(item, KUBERNETES, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
    return problems


def pod_templates(objects: list[dict]) -> list[tuple[str, dict]]:
    out = []
    for obj in objects:
        if obj["kind"] == "Deployment":
            out.append((obj["metadata"]["name"], obj["spec"]["template"]))
        elif obj["kind"] == "RayService":
            cluster = obj["spec"]["rayClusterConfig"]
            for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
                out.append((obj["metadata"]["name"], group["template"]))
    return out


def drain_s(objects: list[dict]) -> float:
    (config,) = [o for o in objects if o["kind"] == "ConfigMap"]
    return float(yaml.safe_load(config["data"]["basal.yml"]).get("shutdown_grace_s", 30))


def deployment_problems(objects: list[dict], gpu: bool) -> list[str]:
    """What a basal server Deployment must have beyond its schema."""
    problems = []
    claims = {o["metadata"]["name"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for dep in [o for o in objects if o["kind"] == "Deployment"]:
        name, pod = dep["metadata"]["name"], dep["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        for probe, path in (("startupProbe", "/health/live"), ("livenessProbe", "/health/live"),
                            ("readinessProbe", "/health/ready")):  # fmt: skip
            got = container.get(probe, {}).get("httpGet", {})
            if got.get("path") != path or got.get("port") not in ports:
                problems.append(f"{name}: {probe} must GET {path} on a named container port, has {got}")
        command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if command[:1] != ["sleep"]:
            problems.append(f"{name}: no preStop sleep (the endpoint must go before SIGTERM starts the drain)")
        needed = drain_s(objects) + (float(command[1]) if len(command) > 1 else 0)
        if pod.get("terminationGracePeriodSeconds", 30) <= needed:
            problems.append(f"{name}: terminationGracePeriodSeconds must exceed preStop + drain = {needed:g} s")
        mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        data = volumes.get(mounts.get("/data"), {})
        if name == "basal" and data.get("persistentVolumeClaim", {}).get("claimName") not in claims:
            problems.append(f"{name}: /data must be the PersistentVolumeClaim of the render")
        if gpu and "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {}):
            problems.append(f"{name}: no nvidia.com/gpu limit")
    return problems


def security_problems(objects: list[dict]) -> list[str]:
    problems = []
    for name, template in pod_templates(objects):
        pod = template["spec"]
        for container in pod["containers"]:
            context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            if not context.get("runAsNonRoot") or context.get("runAsUser", 0) == 0:
                problems.append(f"{name}/{container['name']}: must run as a non-root user")
            if context.get("allowPrivilegeEscalation", True):
                problems.append(f"{name}/{container['name']}: allowPrivilegeEscalation must be false")
    return problems


def selector_problems(objects: list[dict]) -> list[str]:
    """Every Service and PodDisruptionBudget selects the pods of some template in the render."""
    labels = [t.get("metadata", {}).get("labels", {}) for _, t in pod_templates(objects)]
    problems = []
    for obj in objects:
        if obj["kind"] == "Service":
            selector = obj["spec"]["selector"]
        elif obj["kind"] == "PodDisruptionBudget":
            selector = obj["spec"]["selector"]["matchLabels"]
        else:
            continue
        if not any(selector.items() <= pod.items() for pod in labels):
            problems.append(f"{obj['kind']}/{obj['metadata']['name']} selects no pod: {selector}")
    return problems


def ray_problems(objects: list[dict]) -> list[str]:
    problems = []
    for obj in [o for o in objects if o["kind"] == "RayService"]:
        serve = yaml.safe_load(obj["spec"]["serveConfigV2"])
        config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["basal.yml"])
        names = [m.get("name") for m in config["models"]]
        for app in serve["applications"]:
            module, _, attr = app["import_path"].partition(":")
            source = ROOT.joinpath(*module.split(".")).with_suffix(".py")
            defined = source.exists() and attr in {
                n.name for n in ast.parse(source.read_text()).body if isinstance(n, ast.FunctionDef)
            }
            if not defined:
                problems.append(f"{app['name']}: {app['import_path']} is not a function of basal")
            if app["args"]["model"] not in names or app["name"] != f"basal-{app['args']['model']}":
                problems.append(f"{app['name']}: model {app['args']['model']} is not served as basal-<name>")
    return problems


RENDERS = {"base": True, "cpu": False, "ray": True, "shared-batches": False}  # name: has a GPU


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: render(name) for name in RENDERS}


@pytest.mark.parametrize("name", RENDERS)
def test_the_manifests_render_and_are_valid(rendered, name):
    objects = rendered[name]
    kinds = sorted(o["kind"] for o in objects)
    expected = {
        "base": ["ConfigMap", "Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"],
        "cpu": ["ConfigMap", "Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"],
        "ray": ["ConfigMap", "Deployment", "PodDisruptionBudget", "RayService", "Service"],
        "shared-batches": ["ConfigMap", "Deployment", "PersistentVolumeClaim", "PodDisruptionBudget", "Service"],
    }[name]
    assert kinds == expected
    assert schema_problems(objects) == []
    assert deployment_problems(objects, gpu=RENDERS[name] and name != "ray") == []
    assert security_problems(objects) == []
    assert selector_problems(objects) == []
    assert ray_problems(objects) == []


def test_the_cpu_render_asks_for_no_gpu(rendered):
    assert "nvidia.com/gpu" not in yaml.safe_dump_all(rendered["cpu"])


def find(objects: list[dict], kind: str) -> dict:
    return next(o for o in objects if o["kind"] == kind)


def container(objects: list[dict]) -> dict:
    return find(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


BREAKS = {  # what is broken -> (how, which check must see it)
    "a count that is a string": (lambda o: find(o, "Deployment")["spec"].update(replicas="two"), schema_problems),
    "a misspelt field": (lambda o: container(o).update(livenesProbe={}), schema_problems),
    "no readiness probe": (lambda o: container(o).pop("readinessProbe"), deployment_problems),
    "liveness on /health": (lambda o: container(o)["livenessProbe"]["httpGet"].update(path="/health"),
                            deployment_problems),
    "a grace period under the drain": (
        lambda o: find(o, "Deployment")["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=30),
        deployment_problems),
    "no preStop": (lambda o: container(o).pop("lifecycle"), deployment_problems),
    "no GPU": (lambda o: container(o)["resources"]["limits"].pop("nvidia.com/gpu"), deployment_problems),
    "/data not on the PVC": (
        lambda o: find(o, "Deployment")["spec"]["template"]["spec"]["volumes"][0].update(
            persistentVolumeClaim={"claimName": "elsewhere"}), deployment_problems),
    "root": (lambda o: find(o, "Deployment")["spec"]["template"]["spec"]["securityContext"].update(runAsUser=0),
             security_problems),
    "a Service selecting nothing": (lambda o: find(o, "Service")["spec"]["selector"].update(tier="none"),
                                    selector_problems),
    "a PDB selecting nothing": (
        lambda o: find(o, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].update(tier="none"),
        selector_problems),
}  # fmt: skip


@pytest.mark.parametrize("broken", BREAKS)
def test_each_check_fails_on_a_broken_render(rendered, broken):
    """Negative controls: the untouched base passes every check (above); each break is seen by its check."""
    objects = copy.deepcopy(rendered["base"])
    how, check = BREAKS[broken]
    how(objects)
    args = {"gpu": True} if check is deployment_problems else {}
    assert check(objects, **args), f"{check.__name__} did not see: {broken}"


def test_the_ray_checks_fail_on_a_broken_render(rendered):
    objects = copy.deepcopy(rendered["ray"])
    ray = find(objects, "RayService")
    ray["spec"]["serveConfigV2"] = ray["spec"]["serveConfigV2"].replace("app:replicas", "app:replica")
    template = ray["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]
    template["spec"]["containers"][0]["imagePolicy"] = "Always"  # a misspelt field in a custom resource's pod
    assert ray_problems(objects) and schema_problems(objects)


def shared_batches_problems(objects: list[dict]) -> list[str]:
    """Several replicas on one batch store: the database URL from a Secret, the files on the shared volume."""
    from basal.serve.config import parse_config

    problems = []
    deployment = find(objects, "Deployment")
    if deployment["spec"].get("replicas", 1) < 2:
        problems.append("fewer than two replicas")
    env = {e["name"]: e for e in container(objects).get("env", [])}
    if "secretKeyRef" not in env.get("BASAL_BATCHES__DATABASE", {}).get("valueFrom", {}):
        problems.append("BASAL_BATCHES__DATABASE does not come from a Secret")
    config = parse_config(yaml.safe_load(find(objects, "ConfigMap")["data"]["basal.yml"]))
    if not config.batches.enabled or not (config.batches.dir or "").startswith("/data/"):
        problems.append("batches must be on, their dir on the shared /data volume")
    claim = find(objects, "PersistentVolumeClaim")["spec"]["accessModes"]
    if "ReadWriteMany" not in claim:
        problems.append("the files' volume must be ReadWriteMany (every replica mounts it)")
    return problems


def test_the_shared_batches_variant_runs_replicas_on_one_store(rendered):
    assert shared_batches_problems(rendered["shared-batches"]) == []
    broken = copy.deepcopy(rendered["shared-batches"])
    find(broken, "Deployment")["spec"]["replicas"] = 1
    container(broken)["env"] = [e for e in container(broken)["env"] if e["name"] != "BASAL_BATCHES__DATABASE"]
    assert len(shared_batches_problems(broken)) == 2
