"""`mlx-spec models | pull | rm | import`: presets, downloads, GGUF files and disk, in the
terminal."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from . import hub
from .errors import MlxSpecError
from .hub.download import cache_root, gb
from .hub.presets import GPU_SHARE


def add_commands(sub) -> None:
    m = sub.add_parser("models", help="presets, what fits this machine, what is downloaded")
    m.add_argument("--json", action="store_true")

    p = sub.add_parser("pull", help="download a preset or hub repo (and its drafter)")
    p.add_argument("name", help="a preset (see `mlx-spec models`) or a hub repo id")
    p.add_argument("--drafter", help="hub repo of the drafter: a draft model or a sidecar MTP head")
    p.add_argument("--verify", action="store_true", help="hash every file, not only new ones")
    p.add_argument("--quantize-mtp", nargs="?", type=int, choices=[4, 8], const=0, default=None,
                   metavar="BITS", help="quantize an MTP head read out of the original "
                   "checkpoint: like the target, or to BITS (4 or 8)")
    p.add_argument("--progress-json", action="store_true", help=argparse.SUPPRESS)  # the app's

    r = sub.add_parser("rm", help="delete a preset's or repo's files from the cache")
    r.add_argument("name")

    i = sub.add_parser("import", help="convert a GGUF file into an mlx-lm model directory "
                                      "(every command also takes a .gguf file as a model)")
    i.add_argument("file", help="a .gguf file")
    i.add_argument("--out", help="the directory to write (default: the cache every command "
                                 "reads, MLX_SPEC_HOME/gguf/)")
    i.add_argument("--weights", choices=["f32", "quantized"], default=None,
                   help="f32: decoded exactly and kept dense (what pays on a CPU); quantized: "
                        "Q4_0/Q4_1/Q8_0 repacked without loss, other types requantized (what "
                        "pays on Metal). Default: what pays on this device")


def cmd_models(args: argparse.Namespace) -> int:
    memory = hub.memory_bytes()
    have = {i.repo: i for i in hub.installed()}
    rows = []
    for p in hub.presets():
        ready = hub.missing(p.name) is None
        rows.append({"name": p.name, "title": p.title, "target": p.target,
                     "drafter": p.drafter or (f"MTP from {p.mtp_from}" if p.mtp_from else
                                              f"shipped head {p.shipped_head}" if p.shipped_head
                                              else "-"),
                     "kind": p.drafter_kind, "loadable": p.loadable,
                     "download_gb": p.download_gb, "ram_gb": p.ram_gb, "tier_gb": p.tier_gb,
                     "fits": hub.fits(p, memory), "downloaded": ready})
    local = local_ggufs()
    if args.json:
        print(json.dumps({"memory_bytes": memory, "presets": rows,
                          "installed": [{"repo": i.repo, "bytes": i.bytes, "path": str(i.path)}
                                        for i in have.values()], "gguf": local}, indent=2))
        return 0
    mem = f"{memory / 2**30:.0f} GB" if memory else "unknown memory"
    print(f"Presets (this machine: {mem}; 'fits' means RAM needed <= "
          f"{GPU_SHARE:.0%} of it, what Metal lets the GPU use by default)")
    w = max([len("name"), *(len(r["name"]) for r in rows)]) + 2  # the longest name, and a gap
    print(f"  {'name':<{w}}{'drafter':<17}{'download':>9}{'RAM':>8}  {'fits':<5}{'here':<5}"
          "target + drafter")
    for r in rows:
        fits = {True: "yes", False: "no", None: "?"}[r["fits"]]
        kind = r["kind"] + ("" if r["loadable"] else "*")
        print(f"  {r['name']:<{w}}{kind:<17}{r['download_gb']:>6.1f} GB{r['ram_gb']:>5.1f} GB"
              f"  {fits:<5}{'✓' if r['downloaded'] else '-':<5}{r['target']} + {r['drafter']}")
    if not all(r["loadable"] for r in rows):
        print("  * this drafter kind cannot be loaded yet: the preset runs target-only")
    print()
    if have:
        print(f"Downloaded ({cache_root()}):")
        for i in have.values():
            print(f"  {i.repo:<56}{gb(i.bytes):>10}")
    else:
        print("Nothing downloaded yet: `mlx-spec pull NAME` (the bundled demo needs nothing).")
    if local:
        print("\nGGUF files here (installed with mlx-spec, Ollama, LM Studio, llama.cpp, "
              "Hugging Face cache): open one "
              "with `mlx-spec chat NAME`")
        for g in local:
            draft = (f"  (drafter: the EAGLE-3 head shipped for it, {Path(g['head']).name})"
                     if g["head"] else f"  (draft: {g['draft']})" if g["draft"] else "")
            print(f"  {g['architecture'] or '?':<8}{g['label']:<8}{gb(g['bytes']):>9}  "
                  f"{g['name']}{draft}")
    return 0


def local_ggufs() -> list[dict]:
    """The GGUF files found on this machine, each with the draft model `auto` pairs it with."""
    from .errors import ModelLoadError
    from .gguf import draft_for, find_local

    found, out = find_local(), []
    for g in found:
        try:
            d = g.describe()
        except ModelLoadError:
            continue
        draft, head = draft_for(g, found), g.shipped_head()
        out.append({"name": g.name, "source": g.source, "path": str(g.path), "bytes": g.size,
                    "architecture": d["architecture"], "label": d["label"],
                    "draft": draft.name if draft else None,
                    "head": str(head) if head else None})
    return out


def cmd_pull(args: argparse.Namespace) -> int:
    show = _json_progress if args.progress_json else ProgressBar()
    quantize = None
    if args.quantize_mtp is not None:  # 0: like the target
        from functools import partial

        from .loading import quantize_mtp_head

        quantize = partial(quantize_mtp_head, bits=args.quantize_mtp or None)
    launch = hub.pull(args.name, drafter=args.drafter, progress=show, verify=args.verify,
                      quantize_mtp=quantize)
    if args.progress_json:
        print(json.dumps({"event": "done", "launch": launch.to_dict()}), flush=True)
        return 0
    show.finish()
    for w in launch.warnings:
        print(f"mlx-spec: warning: {w}", file=sys.stderr)
    warn_if_too_big(args.name)
    print(f"ready: mlx-spec chat {args.name}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from . import gguf

    if not gguf.is_gguf(args.file):
        raise MlxSpecError(f"{args.file} is not a .gguf file")
    if args.out:
        out = gguf.convert(args.file, args.out, weights=args.weights or gguf.default_format(),
                           progress=_tensors_done)
    else:
        out = gguf.converted(args.file, weights=args.weights, progress=_tensors_done)
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    source = gguf.source_of(out) or {}
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(source.get("tensor_types", {}).items()))
    stored = ", ".join(f"{n} {k}" for k, n in sorted(source.get("converted_as", {}).items()))
    print(f"{out}\n  {source.get('architecture')}: {kinds} → {stored}")
    return 0


def _tensors_done(done: int, total: int) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rconverting: {done}/{total} tensors\x1b[K")
        sys.stderr.flush()


def warn_if_too_big(name: str) -> None:
    preset = hub.find(name)
    if preset is not None and hub.fits(preset) is False:
        memory = hub.memory_bytes() or 0
        print(f"mlx-spec: warning: {preset.name} needs about {preset.ram_gb:.0f} GB of memory; "
              f"this machine has {memory / 2**30:.0f} GB: expect swapping or a failed load",
              file=sys.stderr)


def cmd_rm(args: argparse.Namespace) -> int:
    gone = hub.remove(args.name)
    if not gone:
        print(f"nothing of {args.name} is downloaded")
    for i in gone:
        print(f"removed {i.repo} ({gb(i.bytes)})")
    return 0


def _json_progress(p: hub.Progress) -> None:
    print(json.dumps({"event": "progress", **asdict(p)}), flush=True)


class ProgressBar:
    """One line on stderr, redrawn: repo, file, bytes, speed, ETA."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_repo = ""
        self.last_print = 0.0
        self.last: hub.Progress | None = None  # shown at the end when not a terminal

    def __call__(self, p: hub.Progress) -> None:
        if p.repo != self.last_repo:
            if self.last_repo:
                self.finish()
            self.last_repo = p.repo
        self.last = p
        now = time.monotonic()
        if not self.tty and now - self.last_print < 5:  # a log, not an animation
            return
        self.last_print = now
        sys.stderr.write(("\r" if self.tty else "") + progress_line(p) + ("\x1b[K" if self.tty
                                                                          else "\n"))
        sys.stderr.flush()

    def finish(self) -> None:
        if self.tty and self.last_repo:
            sys.stderr.write("\n")
        elif self.last is not None:
            sys.stderr.write(progress_line(self.last) + "\n")
        self.last_repo, self.last = "", None


def progress_line(p: hub.Progress) -> str:
    if p.verifying:
        return f"{p.repo}: checking {p.file}"
    frac = p.done / p.total if p.total else 1.0
    bar = "█" * int(frac * 20) + "·" * (20 - int(frac * 20))
    eta = "" if p.eta_s is None else f", ETA {_clock(p.eta_s)}"
    return (f"{p.repo} {bar} {frac:4.0%} {gb(p.done)}/{gb(p.total)}, "
            f"{p.rate / 1e6:.1f} MB/s{eta}")


def _clock(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"
