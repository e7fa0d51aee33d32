"""Models from the Hugging Face hub: `--model owner/name[@revision]`, `repo:` entries and `basal download`.

The hub's cache is read here directly (its layout: `models--owner--name/snapshots/<commit>/` with `refs/<branch>`
holding a branch's commit), so a model that `basal download` or any Hugging Face tool fetched serves offline and
without `huggingface_hub`. With `huggingface_hub` installed (the `hub` extra) and the network allowed, it is asked
first (it checks the revision's latest commit and fetches what is missing, or serves its cache when the hub cannot
be reached), honouring `HF_HOME`, `HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE` itself.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from basal.core.errors import ModelDirError

COMMIT = re.compile(r"[0-9a-f]{40}")
INSTALL_HUB = "pip install 'basal-bitwise[hub]'"


def hub_cache() -> Path:
    """Where the hub's files are: $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub (as
    huggingface_hub decides)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cached_snapshot(repo: str, revision: str | None = None) -> Path | None:
    """The snapshot folder of `repo` at `revision` (a branch, tag or commit; default main) in the hub cache, or
    None when it is not there."""
    folder = hub_cache() / ("models--" + repo.replace("/", "--"))
    revision = revision or "main"
    commit = revision if COMMIT.fullmatch(revision) else None
    if commit is None:
        ref = folder / "refs" / revision
        if not ref.is_file():
            return None
        commit = ref.read_text(encoding="utf-8").strip()
    snapshot = folder / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _hub_module():
    try:
        import huggingface_hub
    except ImportError:
        return None
    return huggingface_hub


def snapshot(repo: str, revision: str | None = None) -> Path:
    """A local folder with the files of `repo` at `revision`: fetched (or checked) through huggingface_hub when it
    is installed and the network is allowed, else read from the hub cache. The error says what to do."""
    where = f"{repo}@{revision}" if revision else repo
    hub = _hub_module()
    if hub is not None and not offline():
        try:
            # the cache named explicitly: huggingface_hub reads HF_HOME once, at its import
            folder = hub.snapshot_download(
                repo, revision=revision, cache_dir=hub_cache(), token=os.environ.get("HF_TOKEN")
            )
            return Path(folder)
        except Exception as e:  # a wrong name, a gated repo, or no network: a cached snapshot still serves
            if (cached := cached_snapshot(repo, revision)) is not None:
                return cached
            raise ModelDirError(
                f"{where}: download failed ({type(e).__name__}: {e}); check the network, the name and HF_TOKEN, "
                "or give a local directory"
            ) from e
    if (cached := cached_snapshot(repo, revision)) is not None:
        return cached
    why = "HF_HUB_OFFLINE is set" if hub is not None else f"huggingface_hub is not installed ({INSTALL_HUB})"
    raise ModelDirError(
        f"{where} is not in the Hugging Face cache {hub_cache()} and {why}: fetch it first with "
        f"`basal download {where}` (HF_HOME chooses the cache), or give a local directory"
    )


def download(repo: str, revision: str | None = None) -> Path:
    """`basal download`: fetch a model into the hub cache (image baking, init containers); needs huggingface_hub."""
    hub = _hub_module()
    if hub is None:
        raise ModelDirError(f"basal download needs huggingface_hub: {INSTALL_HUB}")
    return snapshot(repo, revision)
