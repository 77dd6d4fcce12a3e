"""``export --to k8s``: a Kubernetes Job that runs the command in the locked image.

Image by digest, ``nvidia.com/gpu`` limits from the lock's GPUs (or ``--gpus``), a non-root,
no-privilege-escalation security context, the locked numerics variables, and the workspace as
a volume (a PersistentVolumeClaim when named, else an emptyDir). Written as YAML whose every
string is a double-quoted, all-ASCII scalar (``escape.yaml_scalar``), so no value can change the
document's structure and every value reads back as written.
"""

from __future__ import annotations

from typing import Any

from envlock.export.common import environment, gpu_count, job_name, pinned_image
from envlock.lock import Lock
from envlock.text import escape

UID = 1000
def _yaml(value: Any, indent: int = 0) -> list[str]:
    pad = "  " * indent
    if isinstance(value, dict):
        lines: list[str] = []
        for k, v in value.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{escape.yaml_key(k)}:")
                lines += _yaml(v, indent + 1)
            else:
                lines.append(f"{pad}{escape.yaml_key(k)}: {escape.yaml_scalar(v)}")
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            sub = _yaml(item, indent + 1)
            if isinstance(item, (dict, list)) and item:
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines += sub[1:]
            else:
                lines.append(f"{pad}- {escape.yaml_scalar(item)}")
        return lines
    return [f"{pad}{escape.yaml_scalar(value)}"]


def job(lock: Lock, *, argv: list[str], image: str | None = None, gpus: int | None = None,
        workspace_claim: str | None = None) -> dict[str, Any]:
    n = gpu_count(lock, gpus)
    labels = {"app.kubernetes.io/name": "envlock", "app.kubernetes.io/instance": job_name(lock)}
    container: dict[str, Any] = {
        "name": "main",
        "image": pinned_image(lock, image),
        "imagePullPolicy": "IfNotPresent",
        "command": argv,
        "workingDir": "/workspace",
        "env": [{"name": k, "value": v} for k, v in environment(lock)],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                            "runAsNonRoot": True},
        "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
    }
    if n:
        container["resources"] = {"limits": {"nvidia.com/gpu": n}}
    volume: dict[str, Any] = ({"name": "workspace", "persistentVolumeClaim": {"claimName": workspace_claim}}
                              if workspace_claim else {"name": "workspace", "emptyDir": {}})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(lock), "labels": labels,
                     "annotations": {"envlock/id": lock.short_id,
                                     "envlock/fingerprint": lock.envlock.fingerprint or ""}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID,
                                        "fsGroup": UID, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [container],
                    "volumes": [volume],
                },
            },
        },
    }


def render(lock: Lock, **kw: Any) -> str:
    head = f"# Kubernetes Job for envlock {escape.comment(lock.short_id)}; kubectl apply -f THIS_FILE\n"
    return head + "\n".join(_yaml(job(lock, **kw))) + "\n"
