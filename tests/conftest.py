"""Shared fixtures: the example jobs, an in-process webhook client, the API-server double
(tests/helpers/apiserver.py), a real API server (tests/helpers/envtest.py), and a cluster where Volcano's job
controller runs (tests/helpers/cluster.py)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as kube_client

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.cluster import RealVolcano, VolcanoCluster, find_controller, real_missing
from tests.helpers.envtest import ASSETS_ENV, WEBHOOK_USER, ApiServerFactory, EnvTest, find_assets, new_namespace, wait_until
from tests.helpers.jobs import loaded
from tests.helpers.kustomize import kubectl_or_skip
from tests.helpers.paths import EXAMPLES
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.reconciler import Reconciler
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.jobs import DirectoryJobSource


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.name == "test_mypy_finds_nothing" for item in items):
        from tests.unit.repo.test_gates import start_mypy

        start_mypy()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """A copy of examples/jobs that a test may add broken jobs to."""
    target = tmp_path / "jobs"
    shutil.copytree(EXAMPLES / "jobs", target)
    return target


@pytest.fixture
async def client(jobs_dir: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app over ``jobs_dir``, through httpx's ASGI transport, lifespan included."""
    source = DirectoryJobSource(jobs_dir, interval=0)
    app = create_app(source, Chain(), max_body_bytes=64 * 1024)
    async with app.router.lifespan_context(app):
        await loaded(source)  # the first load runs in a worker thread; the tests want it done
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://webhook.test") as c:
            c.app = app  # type: ignore[attr-defined]
            c.source = source  # type: ignore[attr-defined]
            yield c


# The API-server double (tests/helpers/apiserver.py) -------------------------------------------------------


@pytest.fixture
def api_double() -> Iterator[FakeApiServer]:
    """A fresh API-server double (each test file that takes it says why: docs/architecture.md's tests table)."""
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def k8s(api_double: FakeApiServer) -> Iterator[kube_client.ApiClient]:
    """An official client of ``api_double``."""
    with api_double.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(k8s: kube_client.ApiClient) -> kube_client.CoreV1Api:
    """``CoreV1Api`` of ``api_double``."""
    return kube_client.CoreV1Api(k8s)


@pytest.fixture
def certs_cluster(api_double: FakeApiServer) -> FakeApiServer:
    """``api_double`` as ``volcano-webhook certs`` finds a cluster: the namespace, and the webhook
    configurations without a caBundle (two mutating webhooks, so that each is seen to get one)."""
    admission = kube_client.AdmissionregistrationV1Api(api_double.api_client())
    hook = {"name": "pods.volcano-job-webhook.io", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "volcano-job-webhook", "name": "volcano-job-webhook", "path": "/mutate"}}}
    admission.create_mutating_webhook_configuration({"metadata": {"name": "volcano-job-webhook"}, "webhooks": [hook, {**hook, "name": "b.io"}]})
    admission.create_validating_webhook_configuration({"metadata": {"name": "volcano-job-webhook"}, "webhooks": [{**hook, "name": "jobs.io"}]})
    kube_client.CoreV1Api(api_double.api_client()).create_namespace({"metadata": {"name": "volcano-job-webhook"}})
    return api_double


# A real API server (tests/helpers/envtest.py) -----------------------------------------------------------

@pytest.fixture(scope="session")
def apiserver_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerFactory]:
    """``apiserver_factory(admission_plugins=())``: a running :class:`EnvTest` with the Job CRD and the
    manifests' RBAC (:meth:`EnvTest.install_prerequisites`), one per set of extra admission plugins
    for the whole session. Shared, so work in your own namespace, name cluster-scoped objects so
    they cannot collide, and narrow ``audit_events`` by ``since``. Skips without
    ``KUBEBUILDER_ASSETS`` or kubectl."""
    servers: dict[frozenset[str], EnvTest] = {}
    failures: dict[frozenset[str], BaseException] = {}  # a server that failed to start is not retried

    def get(admission_plugins: Sequence[str] = ()) -> EnvTest:
        assets = find_assets()
        if assets is None:
            pytest.skip(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
        kubectl_or_skip()  # the manifests' RBAC is rendered before each server is of use
        key = frozenset(admission_plugins)
        if key in failures:
            raise RuntimeError("this API server already failed to start in this session") from failures[key]
        if key not in servers:
            name = "-".join(sorted(key)) or "default"
            server = EnvTest(assets, tmp_path_factory.mktemp(f"envtest-{name}"), tuple(sorted(key)))
            try:
                server.start()
                server.install_prerequisites()
            except Exception as exc:
                server.stop()
                failures[key] = exc
                raise
            servers[key] = server
        return servers[key]

    try:
        yield get
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def envtest(apiserver_factory: ApiServerFactory) -> EnvTest:
    """The session's API server with the default admission plugins (see ``apiserver_factory``)."""
    return apiserver_factory()


@pytest.fixture(scope="session")
def kube_admin(envtest: EnvTest) -> kube_client.ApiClient:
    """An official ``kubernetes.client.ApiClient`` for ``envtest``'s ``system:masters`` admin."""
    return envtest.api_client()


@pytest.fixture
def start_reconciler(envtest: EnvTest) -> Iterator[Callable[..., Reconciler]]:
    """``start_reconciler(namespace, server=envtest, chain=None, leading=True, **settings)``: a
    :class:`Reconciler` as the manifests' ServiceAccount watching ``namespace`` (resync an hour), its caches
    synced; stopped at the end."""
    started: list[Reconciler] = []

    def start(namespace: str, server: EnvTest = envtest, chain: Chain | None = None, leading: bool = True, **options: Any) -> Reconciler:
        settings = WebhookSettings(**{"namespaces": [namespace], "resync_seconds": 3600, "workloads": [], **options})
        reconciler = Reconciler(server.api_client(WEBHOOK_USER), settings, chain or Chain())
        started.append(reconciler)
        reconciler.start(leading)
        wait_until(lambda: reconciler.manager.ready, 15, "the reconciler's caches to sync")
        return reconciler

    yield start
    for reconciler in started:
        reconciler.stop()


@pytest.fixture
def kube_namespace(envtest: EnvTest, kube_admin: kube_client.ApiClient) -> str:
    """A fresh namespace of ``envtest`` with its ``default`` ServiceAccount; not deleted, as without a
    controller-manager it would never finish terminating."""
    return new_namespace(kube_admin)


# Volcano's job controller beside the product (tests/helpers/cluster.py) -----------------------------------


@pytest.fixture(scope="session")
def real_volcano(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVolcano]:
    """kube-apiserver with Volcano's CRDs and vc-controller-manager for the session, not shared with
    ``envtest`` (the controller watches every namespace); skips naming what is missing."""
    missing = real_missing()
    if missing:
        pytest.skip(missing)
    assets, binary = find_assets(), find_controller()
    assert assets is not None and binary is not None
    volcano = RealVolcano(assets, binary, tmp_path_factory.mktemp("volcano"))
    try:
        volcano.start()
        yield volcano
    finally:
        volcano.stop()


@pytest.fixture
def cluster(real_volcano: RealVolcano) -> Iterator[VolcanoCluster]:
    """A fresh namespace where Volcano's real job controller runs; the test's webhooks are removed
    afterwards, as the API server serves the whole session."""
    cluster = real_volcano.cluster()
    try:
        yield cluster
    finally:
        cluster.unregister_webhooks()
