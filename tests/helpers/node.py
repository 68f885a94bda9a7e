"""A one-node Kubernetes cluster on this machine from real parts, for the tests that install the
product and run jobs as its users do (tests/on_node/), as ../shared/real-kubernetes.md describes:
envtest's API server on the node's address (Node and RBAC authorizers), kube-controller-manager,
kube-scheduler, and in a mount namespace of their own containerd, kubelet and kube-proxy, with
CoreDNS when asked. :func:`missing` says what this machine lacks (root among it); tests skip with it.

Nothing leaves the machine: the node's bridge is on a free ``10.244.N.0/24``, Pods route only to it
and the Service range, and a mangle rule drops whatever would cross the bridge. Every change to the
machine (bridge, rules, chains, sysctls, cgroups, mounts, processes) is recorded in a
:class:`Footprint` before it is made, so :func:`erase` undoes it at :meth:`Node.stop`, after a failed
start, or at the next start when the test process was killed (:func:`clean_stale`).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import ipaddress
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml
from kubernetes import client

from tests.helpers.envtest import (
    ADMIN,
    ASSETS_ENV,
    SERVICE_CIDR,
    EnvTest,
    Process,
    controller_manager,
    find_assets,
    free_port,
    http_ok,
    read,
    wait_until,
)

NODE_ASSETS_ENV = "KUBE_NODE_ASSETS"
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
CNI_BIN = Path("/usr/lib/cni")
# What the node needs of this machine, and the Debian package that has it.
HOST_TOOLS: tuple[tuple[str, str], ...] = (
    ("containerd", "containerd"), ("ctr", "containerd"), ("containerd-shim-runc-v2", "containerd"), ("runc", "runc"),
    ("iptables", "iptables"), ("ip6tables", "iptables"), ("ip", "iproute2"), ("unshare", "util-linux"),
    ("nsenter", "util-linux"), ("mount", "mount"), ("nft", "nftables"),
    (str(CNI_BIN / "bridge"), "containernetworking-plugins"), (str(CNI_BIN / "host-local"), "containernetworking-plugins"),
    (str(CNI_BIN / "loopback"), "containernetworking-plugins"), ("busybox", "busybox"),
)
NODE_NAME = "vjw-node"
PAUSE_IMAGE = "localhost/vjw-pause:busybox"
# The sandbox's process: sleeps until it is told to stop, as the real pause does (a PID 1 with no
# handler would ignore SIGTERM and every Pod deletion would wait for SIGKILL).
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
# Users of the components, each with the built-in RBAC that Kubernetes grants that name.
KUBELET_USER = f"system:node:{NODE_NAME}"
PROXY_USER = "system:kube-proxy"
SCHEDULER_USER = "system:kube-scheduler"
KCM_USER = "system:kube-controller-manager"
# Written by kubelet (its kernel tunables) and kube-proxy (conntrack, route_localnet) whatever their
# flags say, or by the CNI bridge plugin; restored afterwards when changed.
SYSCTLS = (
    "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes", "net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv4/conf/all/route_localnet",
    "net/netfilter/nf_conntrack_max", "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait", "net/netfilter/nf_conntrack_tcp_be_liberal",
    "net/netfilter/nf_conntrack_udp_timeout", "net/netfilter/nf_conntrack_udp_timeout_stream",
    "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
)
IPTABLES = ("iptables", "ip6tables")
TABLES = ("filter", "nat", "mangle", "raw")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# What this machine lacks ---------------------------------------------------------------------------


def find_node_assets(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The ``KUBE_NODE_ASSETS`` directory when it holds executable kubelet, kube-scheduler and kube-proxy."""
    value = environ.get(NODE_ASSETS_ENV)
    if value and all(os.access(Path(value) / name, os.X_OK) for name in NODE_BINARIES):
        return Path(value)
    return None


def _tool(name: str) -> str | None:
    if name.startswith("/"):
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name, path=PATH)


def is_static(binary: Path) -> bool:
    """Whether an ELF executable has no program interpreter (runs in an image with nothing else)."""
    data = binary.read_bytes()[:4096]
    if data[:4] != b"\x7fELF" or data[4] != 2:  # ELFCLASS64 only
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    size, count = int.from_bytes(data[0x36:0x38], "little"), int.from_bytes(data[0x38:0x3A], "little")
    return all(int.from_bytes(data[phoff + i * size:phoff + i * size + 4], "little") != 3  # PT_INTERP
               for i in range(count))


def missing(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why a node cannot be brought up here (None when it can): each part that is missing, and how
    to get it."""
    reasons = []
    if os.geteuid() != 0:
        reasons.append("not root (a node makes a bridge, iptables rules, mounts and cgroups)")
    assets = find_assets(environ)
    if assets is None:
        reasons.append(f"{ASSETS_ENV} is not set to a directory with kube-apiserver and etcd")
    elif not os.access(assets / "kube-controller-manager", os.X_OK):
        reasons.append(f"{ASSETS_ENV} ({assets}) has no kube-controller-manager")
    if not environ.get(NODE_ASSETS_ENV):
        reasons.append(f"{NODE_ASSETS_ENV} is not set (a directory with {', '.join(NODE_BINARIES)})")
    else:
        absent = [n for n in NODE_BINARIES if not os.access(Path(environ[NODE_ASSETS_ENV]) / n, os.X_OK)]
        if absent:
            reasons.append(f"{NODE_ASSETS_ENV} ({environ[NODE_ASSETS_ENV]}) has no {', '.join(absent)}")
    lacking = [(name, package) for name, package in HOST_TOOLS if _tool(name) is None]
    if lacking:
        packages = " ".join(dict.fromkeys(p for _, p in lacking))
        reasons.append(f"not installed: {', '.join(n for n, _ in lacking)} (apt-get install {packages})")
    if not reasons and _chain_exists("iptables", "nat", "KUBE-SERVICES"):
        reasons.append("kube-proxy's chain KUBE-SERVICES already exists: another node runs on this machine")
    if not reasons and run("ip", "-4", "route", "show", SERVICE_CIDR).stdout.strip():
        reasons.append(f"a route to {SERVICE_CIDR} (the Service range) already exists: another node runs on this machine")
    return "; ".join(reasons) or None


# Running things ----------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of the node's processes: no proxy (nothing they do leaves the machine), no
    KUBECONFIG, a PATH with the sbin directories (kubelet runs iptables and mount)."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and k != "KUBECONFIG"}
    env["PATH"] = PATH
    env.update(extra)
    return env


def run(*argv: str | Path, check: bool = True, timeout: float = 60, env: Mapping[str, str] | None = None,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    """One command; AssertionError with its output when it fails and ``check``."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=dict(env) if env is not None else clean_env(), input=input, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{shlex.join(map(str, argv))} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def _chain_exists(binary: str, table: str, chain: str) -> bool:
    return run(binary, "-w", "-t", table, "-S", chain, check=False).returncode == 0


def _chains(binary: str, table: str) -> set[str]:
    done = run(binary, "-w", "-t", table, "-S", check=False)
    if done.returncode != 0:  # the table (or the family) is not there
        return set()
    return {line.split()[1] for line in done.stdout.splitlines() if line.startswith("-N ")}


def _nft_tables() -> set[tuple[str, str]]:
    """``(family, name)`` of every nftables table (iptables-nft keeps its tables there)."""
    listing = run("nft", "list", "tables").stdout.split("\n")
    return {(words[1], words[2]) for words in map(str.split, listing) if len(words) == 3 and words[0] == "table"}


def _processes_in_mount_namespace(inode: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.stat(entry / "ns" / "mnt").st_ino == inode:
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or a kernel thread
                continue
    return pids


def _kill(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


# The sandbox image -------------------------------------------------------------------------------


def _blob(out: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    out[f"blobs/sha256/{digest}"] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _busybox_files(busybox: Path) -> dict[str, Path]:
    """What an image needs to run ``busybox``, by path in the image: itself, and when it is linked
    dynamically (Debian's ``busybox``, unlike ``busybox-static``) the interpreter and libraries
    ``ldd`` names."""
    files = {"bin/busybox": busybox}
    if not is_static(busybox):
        for line in run("ldd", busybox).stdout.splitlines():
            words = line.split()
            library = words[2] if len(words) > 2 and words[1] == "=>" else words[0]
            if library.startswith("/"):
                files[library.lstrip("/")] = Path(library)
    return files


def pause_image_archive(path: Path, name: str = PAUSE_IMAGE, busybox: Path | None = None) -> Path:
    """An OCI archive of image ``name``: this machine's busybox (``busybox`` when given) at
    /bin/busybox with a link for each of its applets, running :data:`PAUSE_SCRIPT`; written without
    any image tool."""
    found = busybox or _tool("busybox")
    assert found, "busybox is not installed"
    busybox = Path(found)
    sources = _busybox_files(busybox)
    applets = [a for a in run(busybox, "--list").stdout.split() if a != "busybox"]
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        directories = sorted({str(parent) for entry in sources for parent in Path(entry).parents if str(parent) != "."})
        for name_in_image in directories:
            directory = tarfile.TarInfo(name_in_image)
            directory.type, directory.mode = tarfile.DIRTYPE, 0o755
            layer.addfile(directory)
        for name_in_image, source in sources.items():
            data = source.read_bytes()  # through symbolic links: the file itself
            entry = tarfile.TarInfo(name_in_image)
            entry.size, entry.mode = len(data), 0o755
            layer.addfile(entry, io.BytesIO(data))
        for applet in applets:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            layer.addfile(link)
    layer_tar = layer_buffer.getvalue()
    blobs: dict[str, bytes] = {}
    layer_desc = _blob(blobs, gzip.compress(layer_tar, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    config = {"architecture": arch, "os": "linux",
              "config": {"Entrypoint": ["/bin/busybox", "sh", "-c", PAUSE_SCRIPT]},
              "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer_tar).hexdigest()}"]}}
    config_desc = _blob(blobs, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_desc, "layers": [layer_desc]}
    manifest_desc = _blob(blobs, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
    manifest_desc["annotations"] = {"io.containerd.image.name": name,
                                    "org.opencontainers.image.ref.name": name.rpartition(":")[2]}
    files = {"oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
             "index.json": json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode(), **blobs}
    with tarfile.open(path, "w") as archive:
        for member, content in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path


# The node ----------------------------------------------------------------------------------------


def _free_subnet() -> ipaddress.IPv4Network:
    """A ``10.244.N.0/24`` that no address or route of this machine overlaps."""
    used = []
    for line in run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
        used.append(ipaddress.ip_network(line.split()[3], strict=False))
    for line in run("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        target = words[1] if words[0] in ("local", "broadcast", "unicast", "blackhole", "unreachable") else words[0]
        if target != "default":
            try:
                used.append(ipaddress.ip_network(target, strict=False))
            except ValueError:
                continue
    for n in range(256):
        candidate = ipaddress.IPv4Network(f"10.244.{n}.0/24")
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise AssertionError("no 10.244.N.0/24 is free on this machine")


def _cgroup_hierarchies() -> list[Path]:
    """The mount points of this machine's cgroup hierarchies: v1's, and v2's where it is mounted
    beside them (``/sys/fs/cgroup/unified``), where runc makes each container's cgroup too."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split()[0] in ("cgroup", "cgroup2"):
            out.append(Path(before.split()[4]))
    return out


def _start_ticks(pid: int) -> int | None:
    """A process's start time (clock ticks since boot): with its pid, who it is (pids are reused)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class Footprint:
    """What a node has changed on this machine so far, saved in ``RUNTIME/footprint.json`` before each
    change, so that :func:`erase` can undo it from the file alone (also for a killed test process)."""

    runtime: str  # the node's short directory under /tmp (its name is unique: the namespace's tmpfs name too)
    owner: tuple[int, int]  # pid and start ticks of the test process
    sysctls: dict[str, str] = field(default_factory=dict)  # before the start
    chains: dict[str, list[str]] = field(default_factory=dict)  # "iptables nat": chains before the start
    tables: list[tuple[str, str]] = field(default_factory=list)  # nftables tables before the start
    snapshotted: bool = False
    bridge: str = ""
    mangle_rules: list[list[str]] = field(default_factory=list)
    cgroup: str = ""  # kubelet's cgroupRoot, made in every hierarchy
    made_cni_dir: bool = False
    namespace_inode: int = 0
    proxy_binary: str = ""

    @property
    def tag(self) -> str:
        return Path(self.runtime).name

    def save(self) -> None:
        path = Path(self.runtime) / "footprint.json"
        path.with_suffix(".partial").write_text(json.dumps(self.__dict__))
        path.with_suffix(".partial").replace(path)

    @classmethod
    def load(cls, path: Path) -> Footprint:
        data = json.loads(path.read_text())
        data["owner"] = tuple(data["owner"])
        data["tables"] = [tuple(t) for t in data["tables"]]
        return cls(**data)

    def owner_alive(self) -> bool:
        return _start_ticks(self.owner[0]) == self.owner[1]

    # What is still there ---------------------------------------------------------------------------

    def cgroup_dirs(self) -> list[Path]:
        return [h / self.cgroup.lstrip("/") for h in _cgroup_hierarchies()] if self.cgroup else []

    def processes(self) -> list[int]:
        """Every process of the node still running: in its cgroups (the containers), or in its mount
        namespace (containerd and its shims, kubelet, kube-proxy) — recognised by the namespace's
        inode and its tmpfs named after :attr:`tag`, so a namespace that merely reuses the inode
        number is never taken for it."""
        pids = {int(p) for top in self.cgroup_dirs() if top.exists() for procs in top.rglob("cgroup.procs")
                for p in procs.read_text().split()}
        if self.namespace_inode:
            for pid in _processes_in_mount_namespace(self.namespace_inode):
                try:
                    if f" - tmpfs {self.tag} " in Path(f"/proc/{pid}/mountinfo").read_text():
                        pids.add(pid)
                except OSError:
                    continue
        return sorted(pids - {os.getpid()})

    def leftovers(self) -> list[str]:
        """What of the node is still on this machine (empty when nothing): its processes, bridge,
        route, rules, cgroups and directories, and chains, tables and sysctls that differ from
        before the start."""
        found = [f"process {pid}" for pid in self.processes()]
        if self.bridge and run("ip", "link", "show", self.bridge, check=False).returncode == 0:
            found.append(f"bridge {self.bridge}")
        if self.bridge and run("ip", "-4", "route", "show", SERVICE_CIDR).stdout.strip():
            found.append(f"route {SERVICE_CIDR}")
        found += [f"mangle rule {shlex.join(r)}" for r in self.mangle_rules
                  if run("iptables", "-w", "-t", "mangle", "-C", *r, check=False).returncode == 0]
        if self.snapshotted:
            for key, old in self.chains.items():
                binary, table = key.split()
                found += [f"{binary} -t {table} chain {c}" for c in sorted(_chains(binary, table) - set(old))]
            found += [f"nft table {f} {t}" for f, t in sorted(_nft_tables() - set(self.tables))]
        for name, value in self.sysctls.items():
            now = (Path("/proc/sys") / name).read_text()
            if now != value:
                found.append(f"sysctl {name}: {now.strip()} (was {value.strip()})")
        found += [f"cgroup {d}" for d in self.cgroup_dirs() if d.exists()]
        if self.made_cni_dir and Path("/var/lib/cni").exists():
            found.append("/var/lib/cni")
        if Path(self.runtime).exists():
            found.append(self.runtime)
        return found


def erase(footprint: Footprint, seconds: dict[str, float] | None = None) -> list[str]:
    """Undo everything ``footprint`` records, in an order that works (processes first, the state
    directory last); each step runs even when an earlier one fails, and is a no-op when done
    already. Returns what failed; ``seconds`` gets how long each step took."""
    errors: list[str] = []

    def step(what: str, action: Callable[[], object]) -> None:
        started = time.monotonic()
        try:
            action()
        except Exception as exc:  # the next steps must run all the same
            errors.append(f"{what}: {exc}")
        if seconds is not None:
            seconds[what] = time.monotonic() - started

    def no_processes() -> bool:
        left = footprint.processes()
        _kill(left)
        return not left

    step("kill the node's processes", lambda: wait_until(no_processes, 30, "the node's processes to end", interval=0.2))
    if footprint.proxy_binary:  # kube-proxy's own rules, in both families
        step("kube-proxy --cleanup", lambda: run(footprint.proxy_binary, "--cleanup", check=False))
    if footprint.snapshotted:
        step("remove the chains kubelet and kube-proxy made", lambda: _remove_new_chains(footprint))
    step("delete the mangle rules", lambda: _delete_rules(footprint.mangle_rules))
    if footprint.bridge:  # its address, route and forwarding go with it
        step(f"delete bridge {footprint.bridge}", lambda: run("ip", "link", "delete", footprint.bridge)
             if run("ip", "link", "show", footprint.bridge, check=False).returncode == 0 else None)
    step(f"remove cgroup {footprint.cgroup}", lambda: _remove_cgroups(footprint))
    step("restore sysctls", lambda: _restore_sysctls(footprint.sysctls))
    if footprint.made_cni_dir and Path("/var/lib/cni").exists():
        step("remove /var/lib/cni", Path("/var/lib/cni").rmdir)
    # The mounts were the namespace's alone: nothing is mounted under the directory any more.
    step(f"remove {footprint.runtime}", lambda: shutil.rmtree(footprint.runtime, ignore_errors=False)
         if Path(footprint.runtime).exists() else None)
    return errors


def _delete_rules(rules: Sequence[Sequence[str]]) -> None:
    for rule in rules:
        if run("iptables", "-w", "-t", "mangle", "-C", *rule, check=False).returncode == 0:
            run("iptables", "-w", "-t", "mangle", "-D", *rule)


def _remove_new_chains(footprint: Footprint) -> None:
    for key, old in footprint.chains.items():
        binary, table = key.split()
        new = _chains(binary, table) - set(old)
        if not new:
            continue
        for rule in run(binary, "-w", "-t", table, "-S").stdout.splitlines():
            words = shlex.split(rule)
            if words[:1] == ["-A"] and words[1] not in new and any(
                    words[i] in ("-j", "-g") and words[i + 1] in new for i in range(len(words) - 1)):
                run(binary, "-w", "-t", table, "-D", *words[1:])
        for chain in new:
            run(binary, "-w", "-t", table, "-F", chain)
        for chain in new:
            run(binary, "-w", "-t", table, "-X", chain)
    # iptables-nft makes a table on first use and leaves it when emptied.
    for family, table in _nft_tables() - set(footprint.tables):
        run("nft", "delete", "table", family, table)


def _remove_cgroups(footprint: Footprint) -> None:
    def removed() -> bool:
        for top in footprint.cgroup_dirs():
            if top.exists():
                for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                    try:
                        directory.rmdir()
                    except OSError:  # a process still leaving
                        pass
                try:
                    top.rmdir()
                except OSError:
                    pass
        return not any(top.exists() for top in footprint.cgroup_dirs())

    wait_until(removed, 20, f"cgroup {footprint.cgroup} to be removed", interval=0.2)


def _restore_sysctls(before: Mapping[str, str]) -> None:
    for name, value in before.items():
        path = Path("/proc/sys") / name
        # Only what changed: writing ip_forward, even its own value, resets every device's forwarding.
        if path.read_text() != value:
            path.write_text(value)


def clean_stale() -> list[str]:
    """Erase every node whose test process is gone without stopping it (killed outright): what a
    footprint under /tmp records. Returns the state directories erased."""
    erased = []
    for path in sorted(Path("/tmp").glob("vjw-node-*/footprint.json")):
        try:
            footprint = Footprint.load(path)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if not footprint.owner_alive():
            errors = erase(footprint)
            if errors:
                raise AssertionError(f"could not erase the stale node {footprint.runtime}:\n" + "\n".join(errors))
            erased.append(footprint.runtime)
    return erased


@dataclass
class Node:
    """A one-node cluster: see the module docstring. ``workdir`` holds the logs, configurations and
    credentials; :attr:`envtest` is its API server (``api_client``, ``kubeconfig``)."""

    assets: Path  # KUBEBUILDER_ASSETS
    node_assets: Path  # KUBE_NODE_ASSETS
    workdir: Path
    coredns: Path | None = None  # cluster DNS when given: CoreDNS on the node's address, kubelet's clusterDNS
    timings: dict[str, float] = field(default_factory=dict)
    teardown_steps: dict[str, float] = field(default_factory=dict)  # seconds each step of stop() took
    envtest: EnvTest = field(init=False)
    subnet: ipaddress.IPv4Network = field(init=False)
    address: str = field(init=False, default="")
    runtime: Path = field(init=False)  # containerd's and kubelet's state (short: socket paths)
    footprint: Footprint | None = field(default=None, init=False)
    processes: dict[str, Process] = field(default_factory=dict, init=False)
    _stack: ExitStack = field(default_factory=ExitStack, init=False)
    _holder: Process | None = field(default=None, init=False)

    @property
    def socket(self) -> Path:
        return self.runtime / "containerd.sock"

    @property
    def bridge(self) -> str:
        return self.footprint.bridge if self.footprint else ""

    @property
    def _fp(self) -> Footprint:
        assert self.footprint is not None
        return self.footprint

    # Lifecycle ---------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> Self:
        """Bring every part up and return once the node is Ready, kube-proxy has synced and the
        ``default`` ServiceAccount exists; on any failure everything done so far is undone first.
        A node left behind by a killed test process is erased first (:func:`clean_stale`)."""
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            clean_stale()
            reason = missing()
            if reason:
                raise RuntimeError(f"cannot bring up a node here: {reason}")
            self._footprint()
            self._network()
            self._control_plane()
            self._cgroup()
            self._mount_namespace()
            self._containerd()
            self.import_image(pause_image_archive(self.workdir / "pause.oci.tar"))
            self._kubelet()
            self._kube_proxy()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["bring_up"] = time.monotonic() - started
        return self

    def stop(self) -> None:
        """Stop the control plane, then :func:`erase` the node's footprint; AssertionError naming
        what could not be undone (after trying everything). Idempotent."""
        started = time.monotonic()
        errors = []
        try:
            self._stack.close()  # the control plane's processes
        except Exception as exc:  # the footprint must be erased all the same
            errors.append(f"stopping the control plane: {exc}")
        self.teardown_steps["stop the control plane"] = time.monotonic() - started
        if self.footprint is not None:
            errors += erase(self.footprint, self.teardown_steps)
        for process in self.processes.values():  # reaped: erase killed those of the node
            if process.alive:
                process.stop(grace=1.0)
            process.popen.wait()
        if errors:
            raise AssertionError("tearing the node down left something behind:\n" + "\n".join(errors))
        if "bring_up" in self.timings and "teardown" not in self.timings:
            self.timings["teardown"] = time.monotonic() - started

    def leftovers(self) -> list[str]:
        """What of the node is still on this machine (see :meth:`Footprint.leftovers`)."""
        alive = [f"process {p.name} ({p.popen.pid})" for p in self.processes.values() if p.alive]
        return alive + (self.footprint.leftovers() if self.footprint else [])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # The machine's state -------------------------------------------------------------------------

    def _footprint(self) -> None:
        self.runtime = Path(tempfile.mkdtemp(prefix="vjw-node-", dir="/tmp"))
        ticks = _start_ticks(os.getpid())
        assert ticks is not None
        fp = self.footprint = Footprint(str(self.runtime), (os.getpid(), ticks))
        fp.sysctls = {name: (Path("/proc/sys") / name).read_text() for name in SYSCTLS if (Path("/proc/sys") / name).exists()}
        fp.chains = {f"{b} {t}": sorted(_chains(b, t)) for b in IPTABLES for t in TABLES}
        fp.tables = sorted(_nft_tables())
        fp.snapshotted = True
        fp.save()

    def _network(self) -> None:
        self.subnet = _free_subnet()
        self.address = str(self.subnet.network_address + 1)
        fp = self._fp
        fp.bridge = f"vjwbr{self.subnet.network_address.packed[2]}"
        fp.save()
        run("ip", "link", "add", fp.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", fp.bridge)
        run("ip", "link", "set", fp.bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{fp.bridge}/forwarding").write_text("1")
        # Host → a ClusterIP kube-proxy has no rule for: onto the bridge, not the default route.
        run("ip", "route", "add", SERVICE_CIDR, "dev", fp.bridge)
        for rule in (["-i", fp.bridge, "!", "-o", fp.bridge], ["-o", fp.bridge, "!", "-i", fp.bridge]):
            spec = ["FORWARD", *rule, "-m", "comment", "--comment", "vjw-node: nothing crosses the bridge", "-j", "DROP"]
            fp.mangle_rules.append(spec)
            fp.save()
            run("iptables", "-w", "-t", "mangle", "-I", *spec)

    # The control plane ---------------------------------------------------------------------------

    def _control_plane(self) -> None:
        users = (KUBELET_USER, PROXY_USER, SCHEDULER_USER, KCM_USER)
        self.envtest = EnvTest(
            self.assets, self.workdir / "apiserver", address=self.address, users=users,
            groups={KUBELET_USER: ("system:nodes",)},
            admission_plugins=("NodeRestriction",), authorization="Node,RBAC", kubelet_client=True,
            apiserver_args=("--kubelet-preferred-address-types=InternalIP",),
        )
        self._stack.callback(self.envtest.stop)
        self.envtest.start()
        w = self.envtest.workdir
        kcm = controller_manager(self.envtest, self.workdir, ("*",), user=KCM_USER, env=clean_env(), args=(
            "--use-service-account-credentials=true", f"--service-account-private-key-file={w / 'sa.key'}",
            f"--root-ca-file={self.envtest.ca_file}", f"--cluster-cidr={self.subnet}", "--allocate-node-cidrs=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--node-monitor-grace-period=20s",
        ))
        self.processes["kube-controller-manager"] = self._stack.enter_context(kcm)
        port = free_port()
        scheduler = self._start("kube-scheduler", [
            str(self.node_assets / "kube-scheduler"), f"--kubeconfig={self.envtest.kubeconfig(SCHEDULER_USER)}",
            "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={port}",
        ])
        scheduler.wait_for(lambda: http_ok(f"https://127.0.0.1:{port}/healthz"), 30, "kube-scheduler's /healthz")
        if self.coredns is not None:
            self._cluster_dns(self.coredns)

    def _cluster_dns(self, binary: Path) -> None:
        """CoreDNS as a host process on the node's address, serving ``cluster.local`` and the reverse
        zones from the API server and nothing else (every other name NXDOMAIN: nothing leaves here)."""
        corefile = self.workdir / "Corefile"
        corefile.write_text(f"""\
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {self.address}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig()} {ADMIN}@envtest
        pods insecure
        ttl 5
    }}
}}
.:53 {{
    bind {self.address}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
""")
        dns = self._start("coredns", [str(binary), "-conf", str(corefile)])
        dns.wait_for(lambda: "CoreDNS-" in dns.log(), 30, "CoreDNS to serve")

    def _start(self, name: str, argv: Sequence[str], *, namespaced: bool = False) -> Process:
        """A process of the node: in its mount namespace (then :func:`erase` kills it), or of the
        control plane (stopped first by :meth:`stop`)."""
        if namespaced:
            assert self._holder is not None
            argv = ["nsenter", "-t", str(self._holder.popen.pid), "-m", "--", *argv]
        process = Process.start(name, argv, self.workdir / f"{name}.log", env=clean_env())
        self.processes[name] = process
        if not namespaced:
            self._stack.callback(process.stop)
        return process

    # The node's runtime --------------------------------------------------------------------------

    def _cgroup(self) -> None:
        fp = self._fp
        fp.cgroup = f"/{fp.tag}"
        fp.save()
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / fp.tag
            path.mkdir()
            for name in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset is empty: give it its parent's
                if (path / name).exists():
                    (path / name).write_text((hierarchy / name).read_text())

    def _mount_namespace(self) -> None:
        fp = self._fp
        if not Path("/var/lib/cni").exists():
            fp.made_cni_dir = True
            fp.save()
            Path("/var/lib/cni").mkdir(parents=True)
        ready = self.runtime / "namespace-ready"
        # Each tmpfs is named after the node (its runtime directory): how erase() knows the
        # namespace's processes from those of a namespace that got the same inode number later.
        script = (
            "set -e; mount --make-rprivate /; "
            f"for d in /run /var/log /var/lib/cni; do mount -t tmpfs -o mode=0755 {fp.tag} \"$d\"; done; "
            f"touch {ready}; exec sleep infinity"
        )
        self._holder = holder = self._start(
            "mount-namespace", ["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
        holder.wait_for(ready.exists, 10, "the mount namespace")
        fp.namespace_inode = os.stat(f"/proc/{holder.popen.pid}/ns/mnt").st_ino
        fp.save()

    def _containerd(self) -> None:
        r = self.runtime
        cni = r / "cni" / "net.d"
        cni.mkdir(parents=True)
        (cni / "10-vjw-node.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "vjw-node",
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(r / "cni" / "ipam"),
                         "ranges": [[{"subnet": str(self.subnet), "rangeStart": str(self.subnet.network_address + 10),
                                      "gateway": self.address}]],
                         # The Pods' only routes: their subnet, and the Service range through the host.
                         "routes": [{"dst": SERVICE_CIDR, "gw": self.address}]},
            }],
        }, indent=1))
        config = r / "containerd.toml"
        config.write_text(f"""\
version = 2
root = "{r / 'containerd' / 'root'}"
state = "{r / 'containerd' / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = ""
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{r / 'containerd' / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower a sandbox's oom_score_adj as kubelet asks.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{r / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni}"
    max_conf_num = 1
""")
        containerd = self._start("containerd", ["containerd", f"--config={config}", "--log-level=warn"], namespaced=True)

        containerd.wait_for(lambda: self.socket.exists() and self.ctr("version", check=False).returncode == 0, 30,
                            "containerd's socket")

    def ctr(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``ctr -n k8s.io ARGS`` against the node's containerd (the namespace the CRI uses)."""
        return run("ctr", f"--address={self.socket}", "-n", "k8s.io", *args, check=check, timeout=timeout)

    def import_image(self, archive: Path, base_name: str | None = None) -> None:
        """Import an OCI archive's image into the node (unpacked for the CRI). ``base_name``: the
        repository of an archive whose references are tags only (see ``ctr images import --help``)."""
        self.ctr("images", "import", *([f"--base-name={base_name}"] if base_name else []), str(archive), timeout=300)

    def _kubelet(self) -> None:
        r, w = self.runtime, self.workdir
        port, health = free_port(), free_port()
        config = w / "kubelet.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            # cgroup v1 here, which 1.36 refuses unless told; cgroupfs, as containerd's runc (SystemdCgroup false).
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self._fp.cgroup, "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": self.address, "port": port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": health,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.envtest.ca_file)}},
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local", "resolvConf": "/etc/resolv.conf",
            **({"clusterDNS": [self.address]} if self.coredns is not None else {}),
            "podLogsDir": str(w / "pod-logs"), "volumePluginDir": str(r / "volume-plugins"),
            # Nothing here is worth evicting for, or garbage-collecting images over: the node lives minutes.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "syncFrequency": "10s", "shutdownGracePeriod": "0s",
        }))
        kubelet = self._start("kubelet", [
            str(self.node_assets / "kubelet"), f"--config={config}", f"--kubeconfig={self.envtest.kubeconfig(KUBELET_USER)}",
            f"--root-dir={r / 'kubelet'}", f"--cert-dir={r / 'kubelet' / 'pki'}", f"--hostname-override={NODE_NAME}",
            f"--node-ip={self.address}", "-v=1",
        ], namespaced=True)
        kubelet.wait_for(lambda: http_ok(f"http://127.0.0.1:{health}/healthz"), 60, "kubelet's /healthz")

    def _kube_proxy(self) -> None:
        metrics, health = free_port(), free_port()
        proxy = self._start("kube-proxy", [
            str(self.node_assets / "kube-proxy"), f"--kubeconfig={self.envtest.kubeconfig(PROXY_USER)}",
            f"--hostname-override={NODE_NAME}", "--proxy-mode=iptables", f"--cluster-cidr={self.subnet}",
            # Not loopback: route_localnet stays off. 0: the conntrack settings are left as they are.
            f"--nodeport-addresses={self.subnet}", "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
            f"--metrics-bind-address=127.0.0.1:{metrics}", f"--healthz-bind-address=127.0.0.1:{health}",
        ], namespaced=True)
        self._fp.proxy_binary = str(self.node_assets / "kube-proxy")
        self._fp.save()

        def synced() -> bool:
            # Its /healthz answers before the first sync: the kubernetes Service's rule is the sign.
            done = run("iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES", check=False)
            return done.returncode == 0 and "default/kubernetes:https" in done.stdout

        proxy.wait_for(synced, 60, "kube-proxy's rules for the kubernetes Service", interval=0.2)

    def _wait_ready(self, timeout: float) -> None:
        api = self.api_client()

        def ready() -> bool:
            for name in ("kubelet", "kube-proxy", "containerd"):
                self.processes[name].running()
            node = read(api, "v1", "Node", NODE_NAME) or {}
            conditions = {c["type"]: c["status"] for c in (node.get("status") or {}).get("conditions") or []}
            return conditions.get("Ready") == "True" and not (node.get("spec") or {}).get("taints") and bool(
                read(api, "v1", "ServiceAccount", "default", "default"))

        wait_until(ready, timeout, f"node {NODE_NAME} Ready, untainted, and the default ServiceAccount",
                   interval=0.2, log=lambda: self.processes["kubelet"].log(tail=40))

    # Access ------------------------------------------------------------------------------------

    def api_client(self, user: str = ADMIN) -> client.ApiClient:
        return self.envtest.api_client(user)

    def kubeconfig(self, user: str = ADMIN) -> Path:
        return self.envtest.kubeconfig(user)

    def logs(self, tail: int = 30) -> str:
        """The last lines of every component's log, for a failure message."""
        return "\n".join(f"--- {name}:\n{p.log(tail=tail)}" for name, p in self.processes.items())

    def tool_env(self) -> dict[str, str]:
        """The environment for kubectl and helm against this node: its admin kubeconfig, and
        their caches and settings in the work directory rather than the user's home."""
        home = self.workdir / "home"
        return clean_env(KUBECONFIG=str(self.kubeconfig()), KUBECACHEDIR=str(home / "kube-cache"),
                         HELM_CACHE_HOME=str(home / "helm-cache"), HELM_CONFIG_HOME=str(home / "helm-config"),
                         HELM_DATA_HOME=str(home / "helm-data"))
