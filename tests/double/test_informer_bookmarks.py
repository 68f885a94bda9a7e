"""A quiet watch's bookmarks (webhook/kube/informer.py): the informer resumes a watch that ends from the
version its last BOOKMARK carried, not from its list's, and lists nothing again. Why the API double:
a bookmark on cue (a real server sends one when it chooses, about once a minute) and its request log
showing the version each watch asked for (fault injection)."""

from __future__ import annotations

import functools

from kubernetes import client

from tests.helpers.apiserver import FakeApiServer, RequestRecord
from tests.helpers.envtest import wait_until
from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.reconciler.owned import OWNED
from volcano_job_webhook.reconciler.transforms import OwnedRecord

wait_for = functools.partial(wait_until, timeout=10.0, interval=0.02)


def config_map_calls(server: FakeApiServer, verb: str) -> list[RequestRecord]:
    return [r for r in server.requests if r.resource == "configmaps" and r.verb == verb]


def resumed(server: FakeApiServer, watches: int) -> str:
    """The resourceVersion the informer's next watch of ConfigMaps asked for."""
    wait_for(lambda: len(config_map_calls(server, "watch")) > watches, what="the watch resumed")
    return config_map_calls(server, "watch")[watches].query["resourceVersion"]


def test_a_quiet_watch_resumes_from_its_last_bookmark_without_a_relist(api_double: FakeApiServer):
    core = client.CoreV1Api(api_double.api_client())
    core.create_namespaced_config_map("default", {"metadata": {"name": "listed"}})  # a list at a version of a write
    informer = Informer(api_double.api_client(), OWNED["ConfigMap"], transform=OwnedRecord)
    informer.start()
    try:
        wait_for(lambda: informer.synced and config_map_calls(api_double, "watch"), what="synced and watching")
        listed = config_map_calls(api_double, "watch")[0].query["resourceVersion"]
        # Writes of another kind move the server's version on; the ConfigMap watch sees none of them.
        for name in ("a", "b"):
            latest = core.create_namespaced_secret("default", {"metadata": {"name": name}}).metadata.resource_version
        # The control: ended with no bookmark, the watch resumes where it was.
        api_double.close_watches()
        assert resumed(api_double, 1) == listed
        # A bookmark, then the end: resumed from the bookmark's version. ``connected`` is set again by
        # the next event the watch reads, so it tells when a bookmark has been read; they are sent
        # until then, as the resumed watch may not be streaming yet when the first goes out.
        informer.connected = False
        wait_for(lambda: informer.connected or api_double.send_bookmarks(), what="a bookmark read")
        api_double.close_watches()
        assert resumed(api_double, 2) == latest != listed
        assert len(config_map_calls(api_double, "list")) == 1, "no list again"
        assert [r.key[1] for r in informer.items()] == ["listed"]
    finally:
        informer.stop()
