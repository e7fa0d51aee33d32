"""What the Dockerfile and compose.yaml promise, read statically (building and running the image is
`make image-check`, too slow for `make test`): each target ends as a non-root user with an init process,
`basal serve`, a HEALTHCHECK and the /data volume, from the lock; compose reserves a GPU, keeps /data in a volume,
passes HF_TOKEN and waits longer than basal drains. Negative controls: the same checks on broken copies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
UID = 10001  # the image's user; deploy/k8s runs as it too


def stages(dockerfile: str) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    out: dict[str, list[str]] = {}
    current = None
    for line in re.sub(r"\\\n", " ", dockerfile).splitlines():
        line = line.strip()
        if m := re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE):
            current = m.group(1)
            out[current] = []
        elif current and line and not line.startswith("#"):
            out[current].append(line)
    return out


def target_problems(dockerfile: str, target: str, lock: str, script: str | None = None) -> list[str]:
    """What `target` lacks; `script`: the shared steps (deploy/docker/image.sh), both targets' venvs run them."""
    script = IMAGE_SH if script is None else script
    found = stages(dockerfile)
    if target not in found:
        return [f"no stage {target}"]
    lines = found[target]
    text = "\n".join(lines)
    problems = []
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    if not users or users[-1] in ("root", "0"):
        problems.append(f"{target}: does not end as a non-root USER")
    if f"--uid {UID}" not in script or "image.sh user" not in "\n".join(found.get(f"{target}-os", [])):
        problems.append(f"the basal user is not uid {UID}")
    if not re.search(r'^ENTRYPOINT \["tini", "--", "basal", "serve"\]', text, re.MULTILINE):
        problems.append(f"{target}: the entrypoint is not tini -- basal serve")
    if not re.search(r"^HEALTHCHECK .*CMD .*/health", text, re.MULTILINE):
        problems.append(f"{target}: no HEALTHCHECK on /health")
    if "VOLUME /data" not in text:
        problems.append(f"{target}: no /data volume")
    venv = "\n".join(found.get(f"{target}-venv", []))
    steps = re.findall(r"^RUN /usr/local/lib/basal/image\.sh (torch|basal)\b", venv, re.MULTILINE)
    if f"COPY {lock} /tmp/lock.txt" not in venv or steps != ["torch", "basal"] or "-c /tmp/lock.txt" not in script:
        problems.append(f"{target}: its venv does not install from {lock} by the shared steps (image.sh)")
    if not (ROOT / lock).exists():
        problems.append(f"{lock} does not exist")
    return problems


def compose_problems(compose: dict, drain_s: float) -> list[str]:
    service = compose["services"]["basal"]
    problems = []
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    if not any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices):
        problems.append("no GPU reservation")
    if not any(str(v).split(":")[1:2] == ["/data"] and not str(v).startswith((".", "/")) for v in service["volumes"]):
        problems.append("/data is not a named volume")
    if "HF_TOKEN" not in service.get("environment", {}):
        problems.append("HF_TOKEN is not passed")
    grace = float(str(service.get("stop_grace_period", "10s")).rstrip("s"))
    if grace <= drain_s:
        problems.append(f"stop_grace_period {grace:g} s is not above the drain ({drain_s:g} s)")
    return problems


DOCKERFILE = (ROOT / "Dockerfile").read_text()
IMAGE_SH = (ROOT / "deploy" / "docker" / "image.sh").read_text()
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
DRAIN_S = float(yaml.safe_load((ROOT / "deploy" / "compose" / "basal.yml").read_text())["shutdown_grace_s"])
TARGETS = {"cpu": "lock/linux-cpu.txt", "cuda": "lock/linux-cuda.txt"}


@pytest.mark.parametrize("target", TARGETS)
def test_each_target_serves_as_promised(target):
    assert target_problems(DOCKERFILE, target, TARGETS[target]) == []


def test_the_bases_are_build_arguments_with_public_defaults():
    assert re.search(r'^ARG BASE="python:3\.11-slim-bookworm"$', DOCKERFILE, re.MULTILINE)
    assert re.search(r'^ARG CUDA_BASE="nvidia/cuda:[\w.-]+-ubuntu24\.04"$', DOCKERFILE, re.MULTILINE)


def test_compose():
    assert compose_problems(COMPOSE, DRAIN_S) == []


@pytest.mark.parametrize(
    "broken",
    [
        ("USER 10001:10001", "USER root"),
        ('ENTRYPOINT ["tini", "--", "basal", "serve"]', 'ENTRYPOINT ["basal", "serve"]'),
        ("HEALTHCHECK ", "# HEALTHCHECK "),
        ("VOLUME /data", "VOLUME /cache"),
        ("txt /tmp/lock.txt", "txt /tmp/other.txt"),
        ("image.sh torch", "image.sh basal"),
    ],
)
def test_the_dockerfile_checks_fail_on_a_broken_copy(broken):
    old, new = broken
    for target, lock in TARGETS.items():
        assert target_problems(DOCKERFILE.replace(old, new), target, lock), f"{target}: not seen: {new}"


def test_the_shared_steps_install_from_the_lock():
    broken = IMAGE_SH.replace("-c /tmp/lock.txt", "")
    for target, lock in TARGETS.items():
        assert target_problems(DOCKERFILE, target, lock, broken), target


@pytest.mark.parametrize("key", ["deploy", "volumes", "environment", "stop_grace_period"])
def test_the_compose_checks_fail_on_a_broken_copy(key):
    service = dict(COMPOSE["services"]["basal"])
    service[key] = {"volumes": ["./data:/data"], "stop_grace_period": "20s"}.get(key, {})
    assert compose_problems({"services": {"basal": service}}, DRAIN_S)
