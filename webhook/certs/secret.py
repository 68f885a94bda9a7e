"""The serving Secret, watched: ``serve`` lists and watches the one ``kubernetes.io/tls`` Secret by
name (the :class:`~volcano_job_webhook.kube.informer.Informer`, with a ``metadata.name`` field
selector so that RBAC can grant it by name) and hands each new ``tls.crt`` and ``tls.key`` to the
served context (:class:`.reload.CertReloader`), as Kyverno's informers feed its TLS config: a
renewal is served as soon as its watch event arrives, and nothing is asked of the API server
between renewals. Not a mounted volume: in the one-Pod install the reconciler beside the webhook
makes the Secret, and the kubelet fills an optional volume only at its next sync of the Pod, a
minute or more later.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
from typing import Any

from kubernetes import client

from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import ObjectRecord
from volcano_job_webhook.plugins.kinds import SECRET

from .issue import TLS_CERT, TLS_KEY
from .reload import CertReloader, Pair

log = logging.getLogger(__name__)


def _record(secret: dict[str, Any]) -> ObjectRecord:
    # The pair only: the Secret's other keys are not serve's to hold.
    data = secret.get("data") or {}
    return ObjectRecord({"metadata": secret.get("metadata") or {}, "data": {name: data.get(name) for name in (TLS_CERT, TLS_KEY)}})


class ServingSecret:
    """Secret ``namespace/name``, watched from construction; :meth:`follow` waits for its first
    certificate and serves it and every later one."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.name = f"{namespace}/{name}"
        self.pair: Pair | None = None  # the Secret's last complete pair
        self.reloader: CertReloader | None = None
        self._given = threading.Event()
        self.informer = Informer(api, SECRET, [namespace], transform=_record, field_selector=f"metadata.name={name}")
        self.informer.add_event_handler(self._changed)
        self.informer.start()

    def _changed(self, event: str, record: ObjectRecord) -> None:
        data = record.object["data"]
        if event == "DELETED" or not data[TLS_CERT] or not data[TLS_KEY]:
            # The reconciler or cert-manager makes it again; meanwhile what is served stays valid.
            log.warning("Secret %s %s; still serving the certificate it held", self.name,
                        "deleted" if event == "DELETED" else "has no tls.crt or tls.key")
            return
        self.pair = base64.b64decode(data[TLS_CERT]), base64.b64decode(data[TLS_KEY])
        self._given.set()
        if self.reloader is not None:
            self.reloader.reload_now()

    def follow(self, client_ca_file: str | os.PathLike[str] | None = None) -> CertReloader:
        """Block until the Secret holds a certificate, then serve it and each renewal from its watch."""
        while not self._given.wait(10.0):
            log.info("waiting for the serving certificate in Secret %s", self.name)
        self.reloader = CertReloader(lambda: self.pair, f"Secret {self.name}", client_ca_file)
        self.reloader.reload_now()  # a change that came while it was being made
        return self.reloader
