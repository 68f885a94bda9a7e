"""The budgets against a real kube-apiserver and etcd (``KUBEBUILDER_ASSETS``, skipped without it):
what Volcano would produce past a limit is rejected there, and what the chain produces instead is
accepted. This is where the limits in ``plugins/budget.py`` were measured."""

from __future__ import annotations

import base64
import copy
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.podgen import make_pod

ASSETS = os.environ.get("KUBEBUILDER_ASSETS")
pytestmark = pytest.mark.skipif(not ASSETS, reason="KUBEBUILDER_ASSETS is not set (a kube-apiserver and etcd)")
NAMESPACE = "default"
TOKEN = "budgets-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_keys(directory: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "budgets-ca")])
    now = time.time()
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.fromtimestamp(now - 60, UTC))
        .not_valid_after(datetime.fromtimestamp(now + 86400, UTC))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(
        sa.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())
    )
    (directory / "sa.pub").write_bytes(
        sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    (directory / "tokens.csv").write_text(f'{TOKEN},admin,1,"system:masters"\n')


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    assets = Path(str(ASSETS))
    if not (assets / "kube-apiserver").exists() or not (assets / "etcd").exists():
        pytest.skip(f"no kube-apiserver and etcd in {assets}")
    work = tmp_path_factory.mktemp("apiserver")
    write_keys(work)
    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd = subprocess.Popen(
        [str(assets / "etcd"), "--name=budgets", f"--data-dir={work / 'etcd'}",
         f"--listen-client-urls=http://127.0.0.1:{etcd_port}", f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
         f"--listen-peer-urls=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync=true", "--log-level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    apiserver = subprocess.Popen(
        [str(assets / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
         "--advertise-address=127.0.0.1", f"--secure-port={api_port}", f"--cert-dir={work / 'certs'}",
         f"--client-ca-file={work / 'ca.crt'}", f"--token-auth-file={work / 'tokens.csv'}",
         f"--service-account-key-file={work / 'sa.pub'}", f"--service-account-signing-key-file={work / 'sa.key'}",
         "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
         "--api-audiences=https://kubernetes.default.svc.cluster.local", "--authorization-mode=RBAC",
         "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none", "--profiling=false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = httpx.Client(base_url=f"https://127.0.0.1:{api_port}", verify=False, timeout=60,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/readyz").text == "ok":
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("kube-apiserver did not become ready in 60 s")
            time.sleep(0.5)
        # No controller manager: the namespace's default ServiceAccount must be made by hand.
        client.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", json={"metadata": {"name": "default"}})
        yield client
    finally:
        client.close()
        stop(apiserver)
        stop(etcd)
        shutil.rmtree(work / "etcd", ignore_errors=True)


def create(api: httpx.Client, obj: dict[str, Any]) -> httpx.Response:
    """Create ``obj`` for real (stored in etcd, so etcd's limit applies), then delete it."""
    group = "/apis/networking.k8s.io/v1" if obj["kind"] == "NetworkPolicy" else "/api/v1"
    path = f"{group}/namespaces/{NAMESPACE}/{obj['kind'].lower()}s".replace("policys", "policies")
    body = copy.deepcopy(obj)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k != "ownerReferences"}  # no Job here to own it
    response = api.post(path, json=body)
    if response.status_code == 201:
        api.delete(f"{path}/{body['metadata']['name']}")
    return response


def job_of(plugins: dict[str, list[str]], tasks: list[tuple[str, int]], **template: Any) -> Job:
    spec = {"containers": [{"name": "main", "image": "x:1"}], **template}
    return Job.from_object({
        "metadata": {"name": "big", "namespace": NAMESPACE, "uid": "u-1"},
        "spec": {"plugins": plugins, "tasks": [{"name": t, "replicas": r, "template": {"spec": spec}} for t, r in tasks]},
    })


def test_duplicate_mount_path_rejected_there_refused_here(api: httpx.Client) -> None:
    job = job_of({"svc": []}, [("main", 1)],
                 containers=[{"name": "main", "image": "x:1", "volumeMounts": [{"name": "conf", "mountPath": "/etc/volcano"}]}],
                 volumes=[{"name": "conf", "emptyDir": {}}])
    volcano = make_pod(job, "main", 0)  # what Volcano's svc makes of it: a second mount at the path
    volcano["spec"]["volumes"].append({"name": "big-svc", "configMap": {"name": "big-svc"}})
    volcano["spec"]["containers"][0]["volumeMounts"].append({"name": "big-svc", "mountPath": "/etc/volcano"})
    response = create(api, volcano)
    assert response.status_code == 422 and "mountPath: Invalid value: \"/etc/volcano\": must be unique" in response.json()["message"]
    with pytest.raises(PluginError, match="'/etc/volcano'"):
        Chain().mutate(job, make_pod(job, "main", 0))


def test_duplicate_port_name_rejected_there_refused_here(api: httpx.Client) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 1)],
                 containers=[{"name": "main", "image": "x:1", "ports": [{"name": "mpijob-port", "containerPort": 2222}]}])
    volcano = make_pod(job, "worker", 0)
    volcano["spec"]["containers"][0]["ports"].append({"name": "mpijob-port", "containerPort": 22})
    response = create(api, volcano)
    assert response.status_code == 422 and 'ports[1].name: Duplicate value: "mpijob-port"' in response.json()["message"]
    with pytest.raises(PluginError, match="'mpijob-port'"):
        Chain().mutate(job, make_pod(job, "worker", 0))


def test_port_number_already_there_is_accepted(api: httpx.Client) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 1)],
                 containers=[{"name": "main", "image": "x:1", "ports": [{"name": "ssh", "containerPort": 22}]}])
    pod = Chain().mutate(job, make_pod(job, "worker", 0)).pod
    assert create(api, pod).status_code == 201


def test_ten_thousand_tasks_accepted(api: httpx.Client) -> None:
    job = job_of({"svc": []}, [(f"t{i}", 1) for i in range(10_000)])
    chain = Chain()
    assert create(api, chain.mutate(job, make_pod(job, "t0", 0)).pod).status_code == 201
    for obj in chain.resources(job):
        assert create(api, obj).status_code == 201, obj["kind"]


def test_config_map_keys_left_out_accepted_volcano_rejected(api: httpx.Client) -> None:
    job = job_of({"svc": []}, [("w", 40_000)])
    ours = Chain().resources(job)[0]
    assert create(api, ours).status_code == 201
    volcano = copy.deepcopy(ours)
    volcano["data"]["VC_W_HOSTS"] = volcano["data"]["w.host"].replace("\n", ",")
    response = create(api, volcano)
    assert response.status_code == 422 and "may not be more than 1048576 bytes" in response.json()["message"]


def test_mpi_ten_thousand_workers_accepted(api: httpx.Client) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 10_000)])
    chain = Chain()
    assert create(api, chain.mutate(job, make_pod(job, "master", 0)).pod).status_code == 201
    for obj in chain.resources(job):
        assert create(api, obj).status_code == 201, obj["kind"]


def test_ssh_config_without_host_entries_accepted_volcano_rejected(api: httpx.Client) -> None:
    job = job_of({"ssh": []}, [("master", 1), ("worker", 20_000)])
    (ours,) = Chain().resources(job)
    assert create(api, ours).status_code == 201
    volcano = copy.deepcopy(ours)
    hosts = [f"Host {h}\n  HostName {h}.big\n  Port 22\n" for t in job.tasks for h in job.host_labels(t)]
    volcano["data"]["config"] = base64.b64encode(("StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n" + "".join(hosts)).encode()).decode()
    response = create(api, volcano)
    assert response.status_code == 422 and "may not be more than 1048576 bytes" in response.json()["message"]


def test_pod_over_etcd_limit_rejected_there_refused_here(api: httpx.Client) -> None:
    containers = [{"name": f"c{i}", "image": "x:1"} for i in range(14)]
    job = job_of({"mpi": ["--port=2222"]}, [("master", 1), ("worker", 6_000)], containers=containers)
    with pytest.raises(PluginError, match="plugin mpi: Pod: "):
        Chain().mutate(job, make_pod(job, "master", 0))
    volcano = make_pod(job, "master", 0)
    hosts = ",".join(job.host_names(job.task("worker")))
    for container in volcano["spec"]["containers"]:
        container["env"] = [{"name": "MPI_HOST", "value": hosts}]
    response = create(api, volcano)
    assert response.status_code == 500 and "request is too large" in response.json()["message"]
