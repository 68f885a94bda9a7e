"""``ssh``: password-less SSH between a job's Pods: the Secret ``<job>-ssh`` (an RSA key pair as Go
writes it, ``authorized_keys``, a ``config`` of every Pod) mounted in every container
(docs/volcano-behaviour.md#ssh); the reconciler keeps an existing Secret's keys."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from functools import cached_property
from typing import cast

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from ..base import Digest, Existing, Mount, Plugin, PodContext
from ..budget import DATA_LIMIT, DATA_LIMIT_TEXT, digits
from ..flags import Flag, port_flag
from ..helpers import host_suffix, hosts_size, plugin_error, plugin_warning, reject, require_mount_free, require_name
from ..kinds import SECRET
from ..pod import Obj, ensure_mount, ensure_volume

DEFAULT_PATH = "/root/.ssh"
KEY_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys", "config")
SUB_PATH = ".ssh"
CONFIG_HEADER = ("StrictHostKeyChecking no", "UserKnownHostsFile /dev/null")
# Room for generated keys in the Secret: a 2048-bit PKCS#1 PEM key is under 1,700 bytes and its
# OpenSSH public key (id_rsa.pub, authorized_keys) under 400.
GENERATED_KEYS_BYTES = 4096


def secret_name(job_name: str) -> str:
    return f"{job_name}-ssh"


@dataclass(frozen=True, repr=False)
class KeyPair:
    """An RSA key pair in the formats Volcano stores. ``repr`` hides the key material."""

    private_pem: bytes
    public_openssh: bytes

    def __repr__(self) -> str:
        return "KeyPair(<redacted>)"


def generate_key_pair() -> KeyPair:
    """A fresh 2048-bit RSA key (exponent 65537): PKCS#1 PEM private key, ``ssh-rsa ...\\n`` public key
    with no comment, as Go's ``MarshalPKCS1PrivateKey`` and ``ssh.MarshalAuthorizedKey`` write them."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return KeyPair(private, public + b"\n")


class SSHPlugin(Plugin):
    name = "ssh"
    flags = (
        Flag("ssh-key-file-path", "string", DEFAULT_PATH, "where containers mount the keys"),
        Flag("ssh-private-key", "string", "", "use this private key instead of generating one"),
        Flag("ssh-public-key", "string", "", "public key that goes with --ssh-private-key"),
        port_flag("ssh-port", 22, "Port written to the generated ssh config"),
    )

    def check(self) -> list[str]:
        require_name(self, "label", secret_name(self.job.name), "volume name")
        path = self.options["ssh-key-file-path"]
        if not path.startswith("/"):
            raise plugin_error(self, "--ssh-key-file-path", f"{path!r} is not an absolute path")
        require_mount_free(self, self.job.tasks, self.mounts()[0])
        warnings = []
        if self._config_left_out:
            warnings.append(plugin_warning(self, self._config_left_out))
        if self.options["ssh-public-key"] and not self.options["ssh-private-key"]:
            warnings.append(plugin_warning(self, "--ssh-public-key is ignored without --ssh-private-key; keys are generated"))
        elif self.options["ssh-private-key"] and not self.options["ssh-public-key"]:
            warnings.append(plugin_warning(self, "--ssh-private-key without --ssh-public-key leaves id_rsa.pub and authorized_keys empty"))
        return warnings

    def mounts(self) -> list[Mount]:
        return [Mount(self.options["ssh-key-file-path"], secret_name(self.job.name), "--ssh-key-file-path")]

    def config_size(self) -> int:
        """``len(self.ssh_config())`` from counts alone: per host ``Host <h>``, ``  HostName
        <h>.<suffix>`` and ``  Port <port>``, each line ending in a newline."""
        size = sum(len(line) + 1 for line in CONFIG_HEADER)
        port = digits(self.options["ssh-port"])
        for task in self.job.tasks:
            hosts = hosts_size(self, task)
            size += 2 * hosts.label_chars + hosts.count * (hosts.suffix + port + len("Host \n  HostName .\n  Port \n"))
        return size

    @cached_property
    def _config_left_out(self) -> str:
        """Why the ``Host`` entries are left out of ``config``, or "". They only give each Pod's short
        name its domain name and port; past a Secret's limit the job still runs on the header's
        options, reaching Pods by domain name (as MPI_HOST lists them). Keys that alone pass the
        limit cannot be left out: that is an error."""
        private, public = self.options["ssh-private-key"], self.options["ssh-public-key"]
        keys = len(private.encode()) + 2 * len(public.encode()) if private else GENERATED_KEYS_BYTES
        header = sum(len(line) + 1 for line in CONFIG_HEADER)
        if keys + header > DATA_LIMIT:
            raise plugin_error(self, "--ssh-private-key", f"the keys are {keys} bytes; the Secret {secret_name(self.job.name)!r} would be over {DATA_LIMIT_TEXT}")
        size = self.config_size()
        if keys + size <= DATA_LIMIT:
            return ""
        return (
            f"the ssh config would be {size} bytes, which with the keys is over {DATA_LIMIT_TEXT}; its Host entries are "
            "left out of the Secret: reach Pods by domain name (<pod>.<subdomain>, as MPI_HOST lists them), on port 22 "
            "unless given with -p"
        )

    def mutate(self, ctx: PodContext) -> None:
        name = secret_name(self.job.name)
        require_name(self, "label", name, "volume name")
        path = self.options["ssh-key-file-path"]
        volume = {
            "name": name,
            "secret": {
                "secretName": name,
                "items": [{"key": key, "path": f"{SUB_PATH}/{key}"} for key in KEY_FILES],
                # 0600 at the default path, 0644 anywhere else (even "/root/.ssh/"), as Volcano does.
                "defaultMode": 0o600 if path == DEFAULT_PATH else 0o644,
            },
        }
        reject(self, "spec.volumes", ensure_volume(ctx.pod, volume))
        for where, container in ctx.located_containers():
            problem = ensure_mount(container, {"name": name, "mountPath": path, "subPath": SUB_PATH})
            if problem:
                raise plugin_error(self, "--ssh-key-file-path", f"{where}: {problem}")
        if not self._config_left_out:
            ctx.names_hosts(self.name)  # the config's HostName lines

    def ssh_config(self) -> str:
        """Volcano's ``generateSSHConfig``: no host-key checks, then a ``Host`` block per Pod (left
        out when they do not fit the Secret, see :attr:`_config_left_out`)."""
        lines = list(CONFIG_HEADER)
        port = self.options["ssh-port"]
        for task in () if self._config_left_out else self.job.tasks:
            suffix = host_suffix(self, task)
            for host in self.job.host_labels(task):
                lines += [f"Host {host}", f"  HostName {host}.{suffix}", f"  Port {port}"]
        return "\n".join(lines) + "\n"

    def key_data(self, existing: Existing | None = None) -> dict[str, str]:
        """``id_rsa``, ``id_rsa.pub`` and ``authorized_keys``, base64: the user's keys; else the keys
        of the job's existing Secret, kept for the job's life (docs/volcano-behaviour.md#ssh-the-secret),
        as they are (a :class:`Digest` stays one); else fresh ones."""
        private, public = self.options["ssh-private-key"], self.options["ssh-public-key"]
        if private:
            return _b64({"id_rsa": private.encode(), "id_rsa.pub": public.encode(), "authorized_keys": public.encode()})
        current = (existing or {}).get(("Secret", secret_name(self.job.name)))
        data = (current or {}).get("data") or {}
        kept = {key: data.get(key) for key in KEY_FILES[:3]}
        if all(isinstance(value, str) and value and (isinstance(value, Digest) or _readable(value)) for value in kept.values()):
            return cast("dict[str, str]", kept)
        # Absent or unreadable: a fresh pair rather than keep a broken Secret.
        pair = generate_key_pair()
        return _b64({"id_rsa": pair.private_pem, "id_rsa.pub": pair.public_openssh, "authorized_keys": pair.public_openssh})

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        config = base64.b64encode(self.ssh_config().encode()).decode()
        return [self.job.side_object(SECRET, secret_name(self.job.name), data={**self.key_data(existing), "config": config})]


def _b64(data: dict[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in data.items()}


def _readable(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except ValueError:
        return False
    return True
