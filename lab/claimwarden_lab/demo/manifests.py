"""The manifests the scenes apply, as the YAML a user would type: pods, claims, templates, requests.

Pure text builders. A request (``one_gpu``, ``gpus``, ``first_available``) is indented for a
template by default and for a standalone claim with ``indent=CLAIM_INDENT``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import driver

IMAGE = "registry.example/app:1"  # kwok runs pods without pulling anything
MODEL_CEL = "device.attributes['{driver}'].model == '{model}'"
CLAIM_INDENT = "    "


def pod_yaml(name: str, claim: str, source: str, containers: Sequence[str] = ("ctr",),
             node: str | None = None) -> str:
    """A pod whose containers all use pod claim ``claim``; ``source`` is `resourceClaimTemplateName: x`
    or `resourceClaimName: x`."""
    lines = ["apiVersion: v1", "kind: Pod", f"metadata: {{name: {name}}}", "spec:"]
    if node:
        lines.append(f"  nodeSelector: {{kubernetes.io/hostname: {node}}}")
    lines.append("  containers:")
    lines += [f"  - {{name: {c}, image: {IMAGE}, resources: {{claims: [{{name: {claim}}}]}}}}" for c in containers]
    lines.append(f"  resourceClaims: [{{name: {claim}, {source}}}]")
    return "\n".join(lines) + "\n"


def template_yaml(name: str, request: str) -> str:
    return (f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: {name}}}\n"
            f"spec:\n  spec:\n    devices:\n      requests:\n{request}")


def claim_yaml(name: str, request: str) -> str:
    """A standalone claim; ``request`` is indented for it (``indent=CLAIM_INDENT``)."""
    return (f"apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}}}\n"
            f"spec:\n  devices:\n    requests:\n{request}")


def one_gpu(indent: str = "      ") -> str:
    return f"{indent}- name: gpu\n{indent}  exactly: {{deviceClassName: {driver.DEVICE_CLASS}}}\n"


def gpus(count: int, indent: str = "      ") -> str:
    return (f"{indent}- name: gpus\n{indent}  exactly: {{deviceClassName: {driver.DEVICE_CLASS}, "
            f"allocationMode: ExactCount, count: {count}}}\n")


def first_available(models: Sequence[str], indent: str = "      ") -> str:
    lines = [f"{indent}- name: gpu", f"{indent}  firstAvailable:"]
    for model in models:
        cel = MODEL_CEL.format(driver=driver.DRIVER, model=model)
        lines.append(f'{indent}  - {{name: {model.lower()}, deviceClassName: {driver.DEVICE_CLASS}, '
                     f'selectors: [{{cel: {{expression: "{cel}"}}}}]}}')
    return "\n".join(lines) + "\n"


def documents(*texts: str) -> str:
    return "---\n".join(texts)
