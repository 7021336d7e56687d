"""A small async Kubernetes REST client for plain-dict manifests.

The builders produce dicts; typed client models would only add a translation layer. This client
speaks the REST paths directly with the same credentials kopf logs in with (a kopf
ConnectionInfo), so the operator needs one login and tests point both kopf and this client at
the in-memory API (kmock). Updates are JSON merge patches of the fields the operator owns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from delayq.kube.builders.common import Manifest

# kind -> plural for everything the operator touches (no discovery round trips needed).
PLURALS = {
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Service": "services",
    "Pod": "pods",
    "StatefulSet": "statefulsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "ServiceMonitor": "servicemonitors",
    "DelayTopic": "delaytopics",
    "Lease": "leases",
    "Event": "events",
    "EndpointSlice": "endpointslices",
    "CronJob": "cronjobs",
}
REQUEST_TIMEOUT_S = 30.0


class KubeApiError(Exception):
    """A non-2xx answer; `status` tells transient (409, 429, 5xx) from permanent."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status in (409, 429) or self.status >= 500


def resource_path(api_version: str, kind: str, namespace: str | None, name: str | None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}" if namespace else base
    path = f"{path}/{PLURALS[kind]}"
    return f"{path}/{name}" if name else path


class KubeClient:
    """get/list/create/patch/delete on namespaced objects, plus API discovery."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self._server = info.server.rstrip("/")
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
            headers=info.as_http_headers(),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        data = json.dumps(body) if body is not None else None
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._session.request(
            method, self._server + path, data=data, headers=headers, params=params
        ) as response:
            text = await response.text()
            if response.status >= 300:
                raise KubeApiError(response.status, _message(text))
            return json.loads(text) if text else None

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            result: Manifest = await self._request(
                "GET", resource_path(api_version, kind, namespace, name)
            )
        except KubeApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Manifest]:
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        result = await self._request(
            "GET",
            resource_path(api_version, kind, namespace, None),
            params={"labelSelector": selector},
        )
        items: list[Manifest] = [item for item in result.get("items", []) if _matches(item, labels)]
        return items

    async def create(self, manifest: Manifest) -> Manifest:
        meta = manifest["metadata"]
        path = resource_path(manifest["apiVersion"], manifest["kind"], meta["namespace"], None)
        result: Manifest = await self._request("POST", path, manifest)
        return result

    async def patch(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Manifest:
        result: Manifest = await self._request(
            "PATCH",
            resource_path(api_version, kind, namespace, name),
            patch,
            content_type="application/merge-patch+json",
        )
        return result

    async def delete(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        preconditions: Mapping[str, str],
    ) -> bool:
        """Delete one object, only if it still has these `uid`/`resourceVersion` (the API
        answers 409 otherwise, so an object replaced since it was read is kept); False when it
        was already gone."""
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        try:
            await self._request(
                "DELETE", resource_path(api_version, kind, namespace, name), options
            )
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def patch_status(
        self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> Manifest:
        """Merge-patch the status subresource (the main resource ignores status changes)."""
        result: Manifest = await self._request(
            "PATCH",
            resource_path(api_version, kind, namespace, name) + "/status",
            patch,
            content_type="application/merge-patch+json",
        )
        return result

    async def has_resource(self, group_version: str, plural: str) -> bool:
        """Whether the API server serves `plural` in `group_version` (e.g. ServiceMonitor)."""
        try:
            result = await self._request("GET", f"/apis/{group_version}")
        except KubeApiError as error:
            if error.status == 404:
                return False
            raise
        return any(item.get("name") == plural for item in result.get("resources", []))


def _matches(item: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Client-side label check: a server that ignores the selector cannot widen a listing."""
    present = (item.get("metadata") or {}).get("labels") or {}
    return all(present.get(key) == value for key, value in labels.items())


def _message(text: str) -> str:
    try:
        return str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        return text[:500]
