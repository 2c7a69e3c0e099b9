"""Pointing the huggingface_hub client in this process (and its subprocesses) at the local Hub
stand-in (hubserver.py).

What `hub_env` patches, and why
-------------------------------
huggingface_hub reads its environment once, at import, into `huggingface_hub.constants`; most
code then reads `constants.X` at call time, but some copies are taken at import time. Setting
`HF_ENDPOINT` after import does nothing in-process. So `hub_env` sets, undoing all on exit:

- env `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_DISABLE_XET=1`, `NO_PROXY` (+= the
  server's host); `HF_HUB_OFFLINE`, `HF_TOKEN`, `HUGGING_FACE_HUB_TOKEN`, `HF_OIDC_RESOURCE`
  removed. Only for subprocesses that import huggingface_hub afresh.
- `constants.ENDPOINT`: read at call time by `HfApi(endpoint=None)` (hence snapshot_download).
- `constants.HUGGINGFACE_CO_URL_TEMPLATE`: `hf_hub_url` builds every /resolve/ URL from it, and
  it was derived from ENDPOINT at import: patching ENDPOINT alone leaves hf_hub_download on
  huggingface.co.
- `hf_api.api.endpoint`: the module-level `HfApi()` behind `huggingface_hub.model_info`,
  `get_safetensors_metadata`, `list_repo_tree`, ... copied ENDPOINT when it was created.
- `constants.HF_HOME`, `HF_HUB_CACHE`, `HF_ASSETS_CACHE`, `HF_TOKEN_PATH`,
  `HF_STORED_TOKENS_PATH`, `AGENT_HARNESSES_PATH`: the default cache dir is
  `constants.HF_HUB_CACHE`, read at call time.
- Module-level copies made by `from ..constants import X` (`utils._cache_manager.HF_HUB_CACHE`,
  `utils._cache_assets.HF_ASSETS_CACHE`, `cli.auth.ENDPOINT`, `utils._git_credential.ENDPOINT`,
  ...): every loaded `huggingface_hub*` module whose global still equals the old value.
- `constants.HF_HUB_OFFLINE = False` (offline mode makes every request raise before it is
  sent), `HF_HUB_DISABLE_IMPLICIT_TOKEN = True` (no token from the machine is sent),
  `HF_HUB_DISABLE_XET = True`, `HF_HUB_DISABLE_TELEMETRY = True`.
- `utils._detect_agent._registry`: set to an empty registry (see agent-harnesses above).
- `utils._http.close_session()` on entry and exit: the shared httpx2 client reads proxy
  settings when it is created and pools connections; a fresh one per test avoids both.

Not covered: `HfFileSystem` (its module-level `hffs` instance and fsspec's instance cache),
and `constants.HF_URL_HOSTS` / `utils._http._HUB_ORIGINS` (only used to follow redirects,
and this server never redirects).

Retries sleep for real: 1 s before each resume in `http_get`, and 1, 2, 4, 8, 8 s in
`utils._http`'s backoff (e.g. `hf_hub_download` offline with nothing cached retries the HEAD
five times: ~23 s). `skip_retry_sleeps(monkeypatch)` makes them instant and records them.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hubserver import HubServer


@contextmanager
def hub_env(server: HubServer, hf_home: Path | str) -> Iterator[Path]:
    """Point huggingface_hub (in this process, and subprocesses via env) at `server`, with
    HF_HOME = `hf_home`; yields the hub cache dir (`hf_home/hub`). See the module docstring
    for each patch and its reason. Everything is undone on exit."""
    import huggingface_hub.hf_api as hf_api
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent, _http

    home = Path(hf_home)
    cache = home / "hub"
    assets = home / "assets"
    new = {
        "ENDPOINT": server.url,
        "HUGGINGFACE_CO_URL_TEMPLATE": server.url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(cache),
        "HF_ASSETS_CACHE": str(assets),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
    }
    old = {name: getattr(constants, name) for name in new}
    _http.close_session()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in new.items():
            mp.setattr(constants, name, value)
        # `from ..constants import X` copies, in every huggingface_hub module loaded so far
        for mod_name, mod in list(sys.modules.items()):
            if mod is constants or not mod_name.startswith("huggingface_hub"):
                continue
            if not isinstance(mod, types.ModuleType):
                continue
            for name, value in new.items():
                if name in vars(mod) and vars(mod)[name] == old[name]:
                    mp.setattr(mod, name, value)
        mp.setattr(hf_api.api, "endpoint", server.url)
        for name, value in (("HF_HUB_OFFLINE", False), ("HF_HUB_DISABLE_IMPLICIT_TOKEN", True),
                            ("HF_HUB_DISABLE_XET", True), ("HF_HUB_DISABLE_TELEMETRY", True)):
            mp.setattr(constants, name, value)
        mp.setattr(_detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}})
        mp.setenv("HF_ENDPOINT", server.url)
        mp.setenv("HF_HOME", str(home))
        mp.setenv("HF_HUB_CACHE", str(cache))
        mp.setenv("HF_HUB_DISABLE_XET", "1")
        for var in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
            mp.delenv(var, raising=False)
        for var in ("NO_PROXY", "no_proxy"):
            mp.setenv(var, ",".join(filter(None, [os.environ.get(var), "127.0.0.1", "localhost"])))
        try:
            yield cache
        finally:
            _http.close_session()


def skip_retry_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Make huggingface_hub's retry waits instant (`file_download.http_get`'s 1 s before a
    resume, `utils._http`'s backoff); returns the list of waits it asked for, in order."""
    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    sleeps: list[float] = []
    fake_time = types.SimpleNamespace(sleep=sleeps.append)
    monkeypatch.setattr(file_download, "time", fake_time)
    monkeypatch.setattr(_http, "time", fake_time)
    return sleeps
