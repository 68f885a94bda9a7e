"""The one way this package gets a Kubernetes client."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes import client, config


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """A client for the cluster: the given kubeconfig, else in-cluster config, else ``$KUBECONFIG`` or
    ``~/.kube/config``; where there is none, ``ConfigException`` with one line saying what was tried."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise config.ConfigException(f"kubeconfig {kubeconfig} does not exist")
        return _from_kubeconfig(kubeconfig)
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException as in_cluster:
        outside = in_cluster
    try:
        return _from_kubeconfig(None)
    except config.ConfigException as exc:
        # The client's own words for a file that is simply absent ("Invalid kube-config file. No
        # configuration found.") send people looking for a broken file: say what was looked for.
        if "No configuration found" not in str(exc):
            raise
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise config.ConfigException(
            f"no cluster to connect to: not in a Pod ({str(outside).rstrip('.')}) and no kubeconfig at {where}"
            " (give --kubeconfig or set KUBECONFIG)") from None


def _from_kubeconfig(path: Path | None) -> client.ApiClient:
    try:
        return config.new_client_from_config(config_file=str(path) if path else None)
    except yaml.YAMLError as exc:
        where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise config.ConfigException(f"kubeconfig {where} is not YAML: {str(exc).splitlines()[0]}") from None
