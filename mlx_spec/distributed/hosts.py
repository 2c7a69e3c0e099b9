"""The machines: mlx's own hostfile format (what `mlx.distributed_config` writes), read without
MLX, and what each rank's backend wants in its environment.

A hostfile is a JSON list of hosts, or an object {"backend", "envs", "hosts"}; each host is
{"ssh": name, "ips": [...], "rdma": [...]}. Host 0 is this machine: it becomes rank 0, runs the
CLI / app / server and the drafter; every other host runs one worker rank."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError

BACKENDS = ("ring", "jaccl")  # the ones our launcher starts (mlx.launch knows more)
LOCAL = ("127.0.0.1", "localhost")
DEFAULT_PORT = 32323  # mlx.launch's starting port


class HostfileError(MlxSpecError):
    """A hostfile that cannot be used, in one line."""


@dataclass(frozen=True)
class Host:
    ssh: str  # how to reach it ("127.0.0.1": this machine, no ssh)
    ips: tuple[str, ...]  # where its ring ports listen
    rdma: tuple[str | None, ...] = ()  # JACCL: its RDMA device towards each rank

    @property
    def local(self) -> bool:
        return self.ssh in LOCAL


@dataclass(frozen=True)
class Hostfile:
    hosts: tuple[Host, ...]
    backend: str = "ring"
    envs: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.hosts)

    def rank_env(self, rank: int, *, port: int = DEFAULT_PORT) -> tuple[dict[str, str],
                                                                        dict[str, str]]:
        """(environment variables, files: variable -> content) that rank `rank` needs for the
        backend to find the others, as mlx.launch sets them: the ring's per-rank "ip:port"
        lists, or JACCL's RDMA device matrix and coordinator."""
        env = dict(e.split("=", 1) for e in self.envs if "=" in e)
        env["MLX_RANK"] = str(rank)
        if self.backend == "jaccl":
            env["MLX_JACCL_COORDINATOR"] = f"{self.hosts[0].ips[0]}:{port}"
            return env, {"MLX_IBV_DEVICES": json.dumps([list(h.rdma) for h in self.hosts])}
        ring = [[f"{h.ips[0]}:{port + i}"] for i, h in enumerate(self.hosts)]
        return env, {"MLX_HOSTFILE": json.dumps(ring)}


def read_hostfile(path: str | Path) -> Hostfile:
    """Parse a hostfile; HostfileError in one line if it cannot be used."""
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise HostfileError(f"hostfile not found: {p}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HostfileError(f"{p} is not a JSON hostfile: {e}") from None
    backend, envs, hosts = "ring", [], data
    if isinstance(data, dict):
        backend = data.get("backend") or "ring"
        envs, hosts = data.get("envs") or [], data.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise HostfileError(f"{p}: expected a list of hosts like "
                            '{"ssh": "mac2.local", "ips": ["10.0.0.2"]}')
    if backend not in BACKENDS:
        raise HostfileError(f"{p}: backend {backend!r} is not one mlx-spec starts "
                            f"({', '.join(BACKENDS)}); run the ranks with mlx.launch instead")
    parsed = []
    for i, h in enumerate(hosts):
        ssh, ips = h.get("ssh"), h.get("ips") or []
        if not isinstance(ssh, str) or not ssh:
            raise HostfileError(f"{p}: host {i} has no \"ssh\" name")
        if backend == "ring" and not ips:
            ips = [ssh] if ssh in LOCAL else []
        if backend == "ring" and not ips:
            raise HostfileError(f"{p}: host {i} ({ssh}) needs \"ips\" for the ring backend "
                                "(mlx.distributed_config writes them)")
        parsed.append(Host(ssh, tuple(ips), tuple(h.get("rdma") or ())))
    if len(parsed) < 2:
        raise HostfileError(f"{p}: a split needs at least 2 hosts, found {len(parsed)}")
    if backend == "jaccl" and not all(len(h.rdma) == len(parsed) for h in parsed):
        raise HostfileError(f"{p}: JACCL needs every host's \"rdma\" list, one per host")
    return Hostfile(tuple(parsed), backend, tuple(envs))
