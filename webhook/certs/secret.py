"""The serving Secret as files: ``serve`` follows a ``kubernetes.io/tls`` Secret through the API
into its certificates directory, where the reloader (:mod:`.reload`) picks them up. Not a mounted
volume: in the one-Pod install the reconciler beside the webhook makes the Secret, and the kubelet
fills an optional volume only at its next sync of the Pod, a minute or more later.
"""

from __future__ import annotations

import base64
import logging
import threading
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.kinds import SECRET

from .files import write_changed
from .issue import CA_CERT, TLS_CERT, TLS_KEY

log = logging.getLogger(__name__)


class SecretFiles:
    """Keeps ``certs_dir`` holding what Secret ``namespace/name`` holds, polling every ``interval`` seconds."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, certs_dir: Path, interval: float = 10.0) -> None:
        self.rest = Rest(api, timeout=10)
        self.namespace, self.name = namespace, name
        self.certs_dir = Path(certs_dir)
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="serving-secret", daemon=True)

    @property
    def secret(self) -> str:
        return f"{self.namespace}/{self.name}"

    def sync(self) -> bool:
        """Write what the Secret holds where it differs (key before certificate, as a watcher of
        ``tls.crt`` expects); whether the directory now holds a certificate and its key."""
        secret = self.rest.get(SECRET, self.namespace, self.name)
        if secret is None:
            return False
        data = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
        if not data.get(TLS_CERT) or not data.get(TLS_KEY):
            return False
        if TLS_CERT in write_changed(self.certs_dir, {name: data[name] for name in (TLS_KEY, CA_CERT, TLS_CERT) if name in data}):
            log.info("serving certificate from Secret %s written to %s", self.secret, self.certs_dir / TLS_CERT)
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the Secret has given a certificate (True), or ``timeout`` or :meth:`stop` (False)."""
        waited = 0.0
        while not self._stop.is_set():
            try:
                if self.sync():
                    return True
                log.info("waiting for the serving certificate in Secret %s", self.secret)
            except (ApiException, OSError) as exc:
                log.warning("reading Secret %s: %s", self.secret, getattr(exc, "reason", None) or exc)
            if timeout is not None and waited >= timeout:
                return False
            self._stop.wait(1.0)
            waited += 1.0
        return False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except (ApiException, OSError) as exc:
                # The files on disk keep being served: a renewal is days ahead of expiry.
                log.warning("reading Secret %s: %s", self.secret, getattr(exc, "reason", None) or exc)
