"""Where the self-signed root is kept between restarts and shared between replicas: the
`CAStorage` protocol, `DirectoryStorage` (file mode) and `KubeSecretStorage` (the Secret
``istio-ca-secret`` in the system namespace, through `KubeSecrets`)."""

from __future__ import annotations

import asyncio
import base64
import fcntl
import os
from pathlib import Path
from typing import Any, Protocol

from pilot.security.ca_errors import CAStorageError
from pilot.security.pki import BUNDLE_FILES, CA_CERT_FILE, CA_KEY_FILE, _text
from pilot.sources.kube.rbac import Rule

# Secret key names, istiod's.
PRIVATE_KEY_FILE = "key.pem"  # always empty in istio-ca-secret; kept for istiod compatibility
CA_SECRET_NAME = "istio-ca-secret"
CA_SECRET_TYPE = "istio.io/ca-root"

# KubeSecrets reads and creates istio-ca-secret in the control plane's namespace (never updates
# or deletes it: a stored root is only ever adopted). See pilot/sources/kube/rbac.py.
RBAC = (Rule("namespace", "", "secrets", frozenset({"get", "create"})),)


def read_bundle_dir(directory: str | os.PathLike) -> dict[str, str]:
    """The bundle files present in `directory` (absent ones are left out)."""
    out = {}
    for name in BUNDLE_FILES:
        p = Path(directory, name)
        try:
            out[name] = p.read_text()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise CAStorageError(f"cannot read {p}: {e}") from None
    return out


# ----------------------------------------------------------------------------------------- storage

class CAStorage(Protocol):
    """Where the self-signed root lives between restarts and is shared between replicas."""

    description: str

    async def load(self) -> dict[str, str] | None:
        """The stored files, or None when nothing is stored. Incomplete material raises."""

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        """Store `files` unless a CA is stored already; return what is stored afterwards (ours,
        or the one another writer stored first)."""


class DirectoryStorage:
    """Files in a directory (file mode). An advisory lock serialises processes on one host."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.description = f"directory {self.directory}"

    async def load(self) -> dict[str, str] | None:
        return await asyncio.to_thread(self._locked, fcntl.LOCK_SH, self._load)

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        return await asyncio.to_thread(self._create, files)

    def _locked(self, mode: int, fn: Any, *args: Any) -> Any:
        try:
            fd = os.open(self.directory / ".ca.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:
            return fn(*args)  # no directory: nothing stored, nothing to lock
        except OSError:
            return fn(*args)  # read-only mount: nobody can be writing here either
        try:
            fcntl.flock(fd, mode)
            return fn(*args)
        finally:
            os.close(fd)

    def _load(self) -> dict[str, str] | None:
        files = read_bundle_dir(self.directory)
        has_cert, has_key = CA_CERT_FILE in files, CA_KEY_FILE in files
        if not has_cert and not has_key:
            return None
        if not (has_cert and has_key):
            missing = CA_KEY_FILE if has_cert else CA_CERT_FILE
            raise CAStorageError(f"{self.description} holds a partial CA ({missing} is missing); "
                                 "refusing to mint a new root over it: restore or remove the files")
        return files

    def _create(self, files: dict[str, str]) -> dict[str, str]:
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise CAStorageError(f"cannot create {self.directory}: {e}") from None
        return self._locked(fcntl.LOCK_EX, self._create_locked, files)

    def _create_locked(self, files: dict[str, str]) -> dict[str, str]:
        existing = self._load()
        if existing is not None:
            return existing
        # Each file is replaced atomically and the key is written last; readers take the lock, so
        # none sees a partial set (a crash midway leaves one that load() reports, not overwrites).
        order = [n for n in BUNDLE_FILES if n != CA_KEY_FILE] + [CA_KEY_FILE]
        try:
            for name in order:
                target = self.directory / name
                tmp = self.directory / f".{name}.tmp"
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                             0o600 if name == CA_KEY_FILE else 0o644)
                with os.fdopen(fd, "w") as f:
                    f.write(files.get(name, ""))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
        except OSError as e:
            raise CAStorageError(f"cannot write the CA to {self.description}: {e}") from None
        return {n: files.get(n, "") for n in BUNDLE_FILES}


class SecretsClient(Protocol):
    """What KubeSecretStorage needs from Kubernetes. `create_secret` raises on conflict with an
    exception whose ``status`` is 409 (ApiError does), or `SecretExistsError`."""

    async def get_secret(self, namespace: str, name: str) -> dict[str, str | bytes] | None: ...

    async def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None: ...


class SecretExistsError(Exception):
    pass


class KubeSecrets:
    """`SecretsClient` over the apiserver through `pilot.sources.kube.client.Kube`."""

    def __init__(self, kube: Any, secret_type: str = CA_SECRET_TYPE) -> None:
        self.kube = kube
        self.secret_type = secret_type

    async def get_secret(self, namespace: str, name: str) -> dict[str, str | bytes] | None:
        from pilot.sources.kube.client import ApiError

        try:
            obj = await self.kube.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v) for k, v in ((obj or {}).get("data") or {}).items()}

    async def create_secret(self, namespace: str, name: str, data: dict[str, str]) -> None:
        body = {"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": self.secret_type,
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        await self.kube.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body=body)


def _is_conflict(e: BaseException) -> bool:
    return isinstance(e, SecretExistsError) or getattr(e, "status", None) == 409


class KubeSecretStorage:
    """The Secret ``istio-ca-secret`` in the system namespace, with istiod's keys."""

    def __init__(self, client: SecretsClient, namespace: str, name: str = CA_SECRET_NAME) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.description = f"secret {namespace}/{name}"

    async def load(self) -> dict[str, str] | None:
        try:
            data = await self.client.get_secret(self.namespace, self.name)
        except Exception as e:  # noqa: BLE001 - any client failure: transport, auth, ApiError
            raise CAStorageError(f"cannot read {self.description}: {e}") from None
        if data is None:
            return None
        files = {k: _text(v) for k, v in data.items()}
        missing = [k for k in (CA_CERT_FILE, CA_KEY_FILE) if not files.get(k, "").strip()]
        if missing:
            raise CAStorageError(f"{self.description} exists but {', '.join(missing)} is empty or missing; "
                                 "refusing to mint a new root over it: fix or delete the Secret")
        return files

    async def create(self, files: dict[str, str]) -> dict[str, str]:
        data = {n: files.get(n, "") for n in BUNDLE_FILES}
        data[PRIVATE_KEY_FILE] = ""
        try:
            await self.client.create_secret(self.namespace, self.name, data)
            return data
        except Exception as e:  # noqa: BLE001 - any client failure; 409 is the expected race
            if not _is_conflict(e):
                raise CAStorageError(f"cannot create {self.description}: {e}") from None
        # Another replica created it between our read and our write: theirs is the root.
        existing = await self.load()
        if existing is None:
            raise CAStorageError(f"{self.description}: create conflicted (409) but the Secret is gone; retry")
        return existing
