"""``ssh``: password-less SSH between the Pods of a job (SPEC Part 2 §6.3).

The job gets a Secret ``<job>-ssh`` holding an RSA key pair (PKCS#1 PEM and OpenSSH public key, as
Go's ``x509``/``ssh`` packages write them), ``authorized_keys`` and an ssh ``config`` listing every
Pod; every container and init container mounts it at ``--ssh-key-file-path`` (sub-path ``.ssh``).
Keys are generated here; the reconciler keeps an existing Secret's keys (SPEC Part 1 §1.6).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from .base import Existing, Plugin, PodContext
from .flags import Flag, port_flag
from .pod import Obj, ensure_mount, ensure_volume

DEFAULT_PATH = "/root/.ssh"
KEY_FILES = ("id_rsa", "id_rsa.pub", "authorized_keys", "config")
SUB_PATH = ".ssh"


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
        self.require_name("label", secret_name(self.job.name), "volume name")
        path = self.options["ssh-key-file-path"]
        if not path.startswith("/"):
            raise self.error("--ssh-key-file-path", f"{path!r} is not an absolute path")
        warnings = []
        if self.options["ssh-public-key"] and not self.options["ssh-private-key"]:
            warnings.append(self.warning("--ssh-public-key is ignored without --ssh-private-key; keys are generated"))
        elif self.options["ssh-private-key"] and not self.options["ssh-public-key"]:
            warnings.append(self.warning("--ssh-private-key without --ssh-public-key leaves id_rsa.pub and authorized_keys empty"))
        return warnings

    def mutate(self, ctx: PodContext) -> None:
        name = secret_name(self.job.name)
        self.require_name("label", name, "volume name")
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
        problem = ensure_volume(ctx.pod, volume)
        if problem:
            raise self.error("spec.volumes", problem)
        for container in ctx.all_containers():
            ensure_mount(container, {"name": name, "mountPath": path, "subPath": SUB_PATH})

    def ssh_config(self) -> str:
        """Volcano's ``generateSSHConfig``: no host-key checks, then a ``Host`` block per Pod."""
        lines = ["StrictHostKeyChecking no", "UserKnownHostsFile /dev/null"]
        port = self.options["ssh-port"]
        for task in self.job.tasks:
            subdomain = task.subdomain or self.job.name
            for host in self.job.host_labels(task):
                lines += [f"Host {host}", f"  HostName {host}.{subdomain}", f"  Port {port}"]
        return "\n".join(lines) + "\n"

    def key_data(self, existing: Existing | None = None) -> dict[str, bytes]:
        """``id_rsa``, ``id_rsa.pub`` and ``authorized_keys``: the user's keys; else the keys of the
        job's existing Secret, kept for the job's life (SPEC Part 1 §1.6); else fresh ones."""
        private, public = self.options["ssh-private-key"], self.options["ssh-public-key"]
        if private:
            return {"id_rsa": private.encode(), "id_rsa.pub": public.encode(), "authorized_keys": public.encode()}
        current = (existing or {}).get(("Secret", secret_name(self.job.name)))
        data = (current or {}).get("data") or {}
        if all(data.get(key) for key in KEY_FILES[:3]):
            try:
                return {key: base64.b64decode(data[key], validate=True) for key in KEY_FILES[:3]}
            except ValueError:
                pass  # unreadable: replace with a fresh pair rather than keep a broken Secret
        pair = generate_key_pair()
        return {"id_rsa": pair.private_pem, "id_rsa.pub": pair.public_openssh, "authorized_keys": pair.public_openssh}

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        data = {**self.key_data(existing), "config": self.ssh_config().encode()}
        return [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": self.job.object_meta(secret_name(self.job.name)),
                "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
            }
        ]
