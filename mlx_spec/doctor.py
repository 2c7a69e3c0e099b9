"""`mlx-spec --version` and `mlx-spec doctor`: what the program sees, and a fix for each problem.

Every check is a small function returning a `Check`; `doctor` runs them all. Nothing here changes
anything or touches the network.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata

from ._platform import OPENBLAS


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # one line, when not ok


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def device() -> str:
    """MLX's default device, and the accelerator behind it (Metal, CUDA or none)."""
    try:
        import mlx.core as mx
    except ImportError:
        return "unavailable (mlx is not installed)"
    kind = "Metal" if _available(mx, "metal") else "CUDA" if _available(mx, "cuda") else "CPU only"
    name = str(mx.default_device().type).rsplit(".", 1)[-1]  # DeviceType.gpu -> gpu
    return f"{name} ({kind})"


def _available(mx, backend: str) -> bool:
    module = getattr(mx, backend, None)
    try:
        return bool(module is not None and module.is_available())
    except Exception:  # noqa: BLE001 - a backend that cannot answer is not there
        return False


def version_line() -> str:
    return (f"mlx-spec {version('mlx-spec')} (mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, "
            f"Python {platform.python_version()}, device {device()})")


def check_platform() -> Check:
    system, machine = platform.system(), platform.machine()
    if system == "Darwin" and machine == "arm64":
        return Check("platform", True, f"macOS {platform.mac_ver()[0]} on Apple silicon")
    if system == "Darwin":
        return Check("platform", False, f"macOS on {machine}",
                     "MLX needs Apple silicon (M1 or later); Intel Macs are not supported")
    return Check("platform", True, f"{system} {machine}: MLX runs on its CPU backend here "
                 "(speculation pays on f32 targets; Metal is where it is meant to run)")


def check_python() -> Check:
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, f"{platform.python_version()} at {sys.executable}",
                 "" if ok else "install Python 3.11 or later (uv python install 3.12)")


def check_mlx() -> Check:
    where = device()
    ok = not where.startswith("unavailable")
    fix = "" if ok else "reinstall: uv tool install --force mlx-spec (or pip install mlx)"
    if ok and platform.system() == "Darwin" and "Metal" not in where:
        ok, fix = False, "MLX sees no Metal device: update macOS (14 or later) and reinstall mlx"
    return Check("mlx", ok, f"mlx {version('mlx')}, mlx-lm {version('mlx-lm')}, {where}", fix)


def check_memory() -> Check:
    from .hub import memory_bytes, presets
    from .hub.presets import fits

    memory = memory_bytes()
    if memory is None:
        return Check("memory", False, "cannot be read", "presets cannot say what fits here")
    fitting = [p.name for p in presets() if fits(p, memory)]
    return Check("memory", True, f"{memory / 2**30:.0f} GB; presets that fit: "
                 f"{', '.join(fitting) if fitting else 'none (the demo still runs)'}")


def check_disk() -> Check:
    from .hub.download import cache_root

    root = cache_root()
    probe = next((p for p in (root, *root.parents) if p.exists()), root.anchor)
    free = shutil.disk_usage(probe).free
    ok = free > 5e9
    return Check("disk", ok, f"{free / 1e9:.0f} GB free for the model cache",
                 "" if ok else "free some space, `mlx-spec rm NAME`, or set HF_HOME to a "
                               "larger disk")


def check_cache() -> Check:
    from .hub import installed
    from .hub.download import cache_root

    have = installed()
    held = ", ".join(i.repo for i in have[:6]) + (" …" if len(have) > 6 else "")
    return Check("model cache", True,
                 f"{cache_root()}: " + (f"{len(have)} repos ({held})" if have else "empty"))


def check_calibration() -> Check:
    """What is calibrated for which model on this device (`auto` and the app's speedup read
    these; without one they start from a prior and calibrate when idle)."""
    from .engine.calibration import CalibrationStore, device_name

    store = CalibrationStore()
    found, here = store.all(), device_name()
    mine = [c for c in found if c.device == here]
    shown = "; ".join(_calibrated(c) for c in mine[:6]) + (" …" if len(mine) > 6 else "")
    other = f" ({len(found) - len(mine)} more for other devices or versions)" if (
        len(found) > len(mine)) else ""
    detail = (f"{len(mine)} model{'s' * (len(mine) != 1)} on this device: {shown}" if mine else
              "nothing yet: a model calibrates the first time the app or server is idle")
    return Check("calibration", True, f"{store.root}: {detail}{other}")


def _calibrated(c) -> str:
    name = c.model.rstrip("/").rsplit("/", 1)[-1]
    parts = [f"c(1) {c.costs.verify[0] * 1e3:.1f} ms" if c.costs else "costs not yet",
             f"target-only {c.baseline['tok_s']:.1f} tok/s" if c.baseline else "no baseline"]
    return f"{name} ({', '.join(parts)})"


def check_openblas() -> Check:
    if not sys.platform.startswith("linux"):
        return Check("openblas", True, "not needed (Linux only)")
    if not os.path.exists(OPENBLAS):
        return Check("openblas", False, f"{OPENBLAS} is missing: f32 matmul is ~2x slower",
                     "apt-get install libopenblas0-pthread")
    active = OPENBLAS in os.environ.get("LD_PRELOAD", "")
    if active:
        core = os.environ.get("OPENBLAS_CORETYPE")
        return Check("openblas", True, "preloaded" + (f", {core} kernels" if core else ""))
    if os.environ.get("MLX_SPEC_NO_PRELOAD"):
        return Check("openblas", False, "installed, but MLX_SPEC_NO_PRELOAD is set",
                     "unset MLX_SPEC_NO_PRELOAD")
    return Check("openblas", True, "installed; the mlx-spec command preloads it")


def check_terminal() -> Check:
    term, colorterm = os.environ.get("TERM", ""), os.environ.get("COLORTERM", "")
    if not sys.stdout.isatty():
        return Check("terminal", True, "not a terminal (output is piped)")
    if colorterm in ("truecolor", "24bit"):
        return Check("terminal", True, f"{term}, true colour")
    if "256" in term:
        return Check("terminal", True, f"{term}, 256 colours (the app's colours are approximated;"
                     " token kinds also differ by style)")
    return Check("terminal", False, f"TERM={term or 'unset'}: few colours",
                 "use a terminal with 256 colours (export TERM=xterm-256color)")


CHECKS: tuple[Callable[[], Check], ...] = (
    check_platform, check_python, check_mlx, check_memory, check_disk, check_cache,
    check_calibration, check_openblas, check_terminal,
)


def run_checks() -> list[Check]:
    out = []
    for check in CHECKS:
        try:
            out.append(check())
        except Exception as e:  # noqa: BLE001 - a check that fails is a finding, not a crash
            out.append(Check(check.__name__.removeprefix("check_"), False,
                             f"could not check: {type(e).__name__}: {e}"))
    return out


def check_hosts(hostfile: str, model: str | None) -> list[Check]:
    """Every host of a hostfile: reachable, the same mlx-spec / MLX / mlx-lm, the model's files
    the same as here (when a model is named), then the backend itself: a group joined."""
    import json
    import subprocess

    from .distributed.hosts import HostfileError, read_hostfile

    try:
        hf = read_hostfile(hostfile)
    except HostfileError as e:
        return [Check("hostfile", False, str(e), "mlx.distributed_config writes one")]
    probe = [sys.executable, "-m", "mlx_spec.distributed.probe", "about"] + ([model] if model
                                                                              else [])
    out, first = [], None
    for rank, host in enumerate(hf.hosts):
        cmd = probe if host.local else ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
                                        host.ssh, "cd " + os.getcwd() + " 2>/dev/null; "
                                        + " ".join(probe)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 \
                else None
        except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, OSError):
            done, answer = None, None
        name = f"rank {rank}"
        if answer is None:
            why = (done.stderr.strip().splitlines() or ["no answer"])[-1] if done else "timed out"
            out.append(Check(name, False, f"{host.ssh}: {why}",
                             "make `ssh HOST` work without a password (ssh-copy-id HOST) and "
                             f"install mlx-spec at {sys.executable} there"))
            continue
        first = first or answer
        problems = []
        if answer["versions"] != first["versions"]:
            problems.append((f"runs {answer['versions']}",
                             f"install {first['versions']} on {host.ssh}"))
        if answer["model"] == "missing":
            problems.append((f"no model at {model}", f"copy {model} to {host.ssh}, same path"))
        elif answer["model"] != first["model"]:
            problems.append((f"different files at {model}", f"copy {model} to {host.ssh} again"))
        detail = "; ".join(p for p, _ in problems) or f"{host.ssh}: {answer['versions']}"
        out.append(Check(name, not problems, detail, "; ".join(f for _, f in problems)))
    if all(c.ok for c in out):
        join = [sys.executable, "-m", "mlx_spec.distributed.probe", "join", hostfile]
        try:
            done = subprocess.run(join, capture_output=True, text=True, timeout=120)
            ok, why = done.returncode == 0, (done.stderr.strip().splitlines() or [""])[-1]
        except subprocess.TimeoutExpired:
            ok, why = False, "timed out"
        out.append(Check(hf.backend, ok, f"{hf.size} ranks joined" if ok else why,
                         "" if ok else "check that every host reaches the hostfile's ips on "
                         "its ports (a firewall, the wrong interface) and MLX_SPEC_PORT.."))
    return out


def cmd_doctor(args) -> int:
    checks = run_checks()
    if getattr(args, "hostfile", None):
        checks += check_hosts(args.hostfile, getattr(args, "model", None))
    if getattr(args, "json", False):
        import json

        print(json.dumps({"version": version_line(), "checks": [asdict(c) for c in checks]},
                         indent=2))
    else:
        print(version_line())
        for c in checks:
            print(f"  {'ok ' if c.ok else 'fix'}  {c.name:<12}{c.detail}")
            if c.fix:
                print(f"       {'':<12}→ {c.fix}")
    return 0 if all(c.ok for c in checks) else 1
