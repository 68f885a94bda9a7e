"""The one way this package gets a Kubernetes client."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """A client for the cluster: the given kubeconfig, else in-cluster config, else ``~/.kube/config``."""
    if kubeconfig is not None:
        return config.new_client_from_config(config_file=str(kubeconfig))
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        return config.new_client_from_config()
