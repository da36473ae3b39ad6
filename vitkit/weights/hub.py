"""Where published weights come from: Hugging Face Hub repositories ("hf-hub:ORG/REPO", "hf-hub:ORG/REPO@REVISION")
through `huggingface_hub` (its cache, `HF_HOME`, `HF_HUB_OFFLINE`, its progress bars and its token for gated
repositories), and torchvision's files through torch.hub's cache (`torch.hub.get_dir()`), with its hash check.

Nothing here downloads unless asked, and only the files vitkit reads come down: a repository's config.json, its
weights (`model.safetensors`, else `pytorch_model.bin`, read with `torch.load(weights_only=True)`) and, where there is
one, its `preprocessor_config.json`; never code. A file is checked against the hash it was published with (the Hub's
sha256 of a large file, the prefix in a torchvision file's name) when a process first reads it. What failed gets its own
error: `NotCached` (no network, or `HF_HUB_OFFLINE=1`, and not in the cache: the command that fetches it and how to
pass a local folder instead), `DamagedDownload` (a partial file, a hash that does not match) and `HubRepositoryError`
(no such repository or revision, a gated one without access, one with no files vitkit reads).

`HF_HUB_OFFLINE=1` stops torch.hub's downloads too: one switch for a machine without network.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import socket
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitkit.models.registry import LABEL_SETS, weights_at
from vitkit.weights.hf import PREPROCESSOR_NAME
from vitkit.weights.io import CONFIG_NAME, DIRECTORY_WEIGHTS, is_hf_config, read_json

log = logging.getLogger(__name__)

HUB_PREFIX = "hf-hub:"  # a Hub repository as a model source, as timm writes it
OPTIONAL_FILES = (PREPROCESSOR_NAME,)  # a transformers directory's, read where it has them
SHA256 = re.compile(r"[0-9a-f]{64}")  # the name of a large file's blob in the Hub cache: its content's sha256
HASH_PREFIX = re.compile(r"-([a-f0-9]{6,})\.")  # torch.hub's: a file name's hash prefix, "resnet50-0676ba61.pth"
CHUNK = 1 << 24


class NotCached(FileNotFoundError):
    """Weights that are not on this machine and cannot be downloaded now (no network, or `HF_HUB_OFFLINE=1`)."""


class DamagedDownload(ValueError):
    """A downloaded file that is incomplete, or whose content does not match the hash it was published with."""


class HubRepositoryError(ValueError):
    """A repository that cannot be read: not on the Hub, gated, without the revision asked, without the files
    vitkit reads."""


@dataclass(frozen=True)
class HubSnapshot:
    """The files of a Hub repository at one commit, in huggingface_hub's cache."""

    repo: str  # "ORG/REPO"
    revision: str  # the commit
    directory: Path  # the snapshot folder: config.json, the weights and what else came down

    @property
    def source(self) -> str:
        """Where the weights came from, at which commit: "hf-hub:ORG/REPO@COMMIT" (what a saved model records)."""
        return f"{HUB_PREFIX}{self.repo}@{self.revision}"


def is_hub(source: Any) -> bool:
    """Whether `source` names a Hub repository ("hf-hub:ORG/REPO[@REVISION]")."""
    return isinstance(source, str) and source.startswith(HUB_PREFIX)


def parse_hub(source: str) -> tuple[str, str | None]:
    """(repository id, revision or None) of "hf-hub:ORG/REPO[@REVISION]"; ValueError for a malformed one."""
    repo, _, revision = source[len(HUB_PREFIX) :].partition("@")
    parts = repo.split("/")
    if not is_hub(source) or not 1 <= len(parts) <= 2 or not all(parts) or (revision == "" and "@" in source):
        raise ValueError(f"expected hf-hub:ORG/REPO or hf-hub:ORG/REPO@REVISION, got {source!r}")
    return repo, revision or None


def local_source(source: str | os.PathLike) -> str | os.PathLike:
    """A model source as a local path: a Hub repository's snapshot folder (downloaded unless cached), else
    `source` as it is."""
    return hub_snapshot(source).directory if is_hub(source) else source


def hub_cache() -> Path:
    """The folder huggingface_hub keeps downloads in (`HF_HUB_CACHE`, by default `HF_HOME/hub`)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """Whether downloads are off (`HF_HUB_OFFLINE=1`): only what the caches hold is read."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_snapshot(source: str, revision: str | None = None) -> HubSnapshot:
    """The files vitkit reads of the Hub repository `source` ("hf-hub:ORG/REPO[@REVISION]"; `revision`: a branch,
    tag or commit, over the one in `source`), downloaded into huggingface_hub's cache unless there already."""
    repo, named = parse_hub(source)
    if revision is not None and named is not None and revision != named:
        raise ValueError(f"two revisions given: {source} and revision={revision!r}")
    key = (repo, revision or named, hub_cache(), offline())
    snapshot = _snapshot(*key)
    if not (snapshot.directory / CONFIG_NAME).is_file():  # the cache was cleared since (`hf cache delete`)
        _snapshot.cache_clear()
        snapshot = _snapshot(*key)
    return snapshot


def hub_config(source: str) -> Path:
    """The config.json of the Hub repository `source` alone (downloaded unless cached): enough to say what model it
    holds before its weights are fetched."""
    repo, revision = parse_hub(source)
    return Path(_download(repo, CONFIG_NAME, revision))


@functools.lru_cache(maxsize=16)
def _snapshot(repo: str, revision: str | None, cache: Path, no_network: bool) -> HubSnapshot:
    """`hub_snapshot`, once per process for each repository, revision, cache folder and network setting."""
    config = Path(_download(repo, CONFIG_NAME, revision))
    commit = config.parent.name  # snapshots/<commit>/config.json
    weights = _first_present(repo, DIRECTORY_WEIGHTS, commit)
    if weights is None:
        raise HubRepositoryError(
            f"{HUB_PREFIX}{repo} has none of {list(DIRECTORY_WEIGHTS)}: not a model vitkit reads (it reads "
            "transformers' and timm's single-file weights; split ones, model.safetensors.index.json, it does not)"
        )
    verify_blob(Path(weights), repo)
    if is_hf_config(read_json(config)):  # a transformers directory: its normalisation is in a file of its own
        for name in OPTIONAL_FILES:
            _optional(repo, name, commit)
    return HubSnapshot(repo, commit, config.parent)


def _download(repo: str, filename: str, revision: str | None) -> str:
    """`huggingface_hub.hf_hub_download`, its failures worded (`NotCached`, `HubRepositoryError`)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f" at revision {revision!r}" if revision else ""
    cache_only = not offline() and unreachable_hub() is not None  # no network: the cache, without retries
    try:
        return hf_hub_download(repo, filename, revision=revision, library_name="vitkit", local_files_only=cache_only)
    except LocalEntryNotFoundError as err:
        raise not_cached(repo, [filename], revision) from err
    except GatedRepoError as err:
        raise HubRepositoryError(
            f"{HUB_PREFIX}{repo} is gated: accept its conditions on https://huggingface.co/{repo} with your account, "
            "then give this machine your token (`hf auth login`, or the HF_TOKEN environment variable)"
        ) from err
    except RepositoryNotFoundError as err:
        raise HubRepositoryError(
            f"there is no repository {repo!r} on the Hugging Face Hub, or it is private (then log in: `hf auth "
            "login`, or set HF_TOKEN)"
        ) from err
    except RevisionNotFoundError as err:
        raise HubRepositoryError(f"{HUB_PREFIX}{repo} has no revision {revision!r}") from err
    except EntryNotFoundError as err:
        if filename == CONFIG_NAME:
            raise HubRepositoryError(
                f"{HUB_PREFIX}{repo}{at} has no {CONFIG_NAME}: not a model repository vitkit reads (a transformers "
                "or timm model, or a directory written by vitkit.save_pretrained)"
            ) from err
        raise


def _first_present(repo: str, names: tuple[str, ...], commit: str) -> str | None:
    """The path of the first of `names` the repository has at `commit`, downloaded; None when it has none. Offline,
    the first the cache holds; None when the cache knows the repository has none of them (huggingface_hub's markers
    of absent files); else `NotCached` for the first."""
    from huggingface_hub.errors import EntryNotFoundError

    for name in names:
        try:
            return _download(repo, name, commit)
        except NotCached:
            break
        except EntryNotFoundError:
            continue
    else:
        return None
    cached = [_cached(repo, name, commit) for name in names]
    found = [path for path in cached if isinstance(path, str)]
    if found:
        return found[0]
    if all(path is not None for path in cached):  # each one known to be absent
        return None
    missing = [name for name, path in zip(names, cached, strict=True) if path is None]  # neither cached nor absent
    raise not_cached(repo, missing, commit)


def _cached(repo: str, filename: str, commit: str) -> Any:
    """huggingface_hub's `try_to_load_from_cache`: the path, its marker of a file known to be absent, or None."""
    from huggingface_hub import try_to_load_from_cache

    return try_to_load_from_cache(repo, filename, revision=commit)


def _optional(repo: str, filename: str, commit: str) -> None:
    """Download `filename` where the repository has it; offline and not cached, say what is assumed without it."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        _download(repo, filename, commit)
    except NotCached:
        if _cached(repo, filename, commit) is None and not (_snapshot_dir(repo, commit) / filename).is_file():
            log.warning(
                f"{HUB_PREFIX}{repo}: {filename} is not in the cache (offline); it gives the images' normalisation, "
                "so vitkit's default (ImageNet's) is assumed"
            )
    except EntryNotFoundError:
        pass


def _repo_folder(repo: str) -> Path:
    return hub_cache() / f"models--{repo.replace('/', '--')}"


def _snapshot_dir(repo: str, commit: str) -> Path:
    return _repo_folder(repo) / "snapshots" / commit


@functools.lru_cache(maxsize=1)
def unreachable_hub() -> str | None:
    """Why the Hub cannot be reached at all, its host name not resolving (a machine without network), or None
    (also behind an HTTPS proxy, which resolves it); asked once a process, so that huggingface_hub's retries of a
    connection that cannot be made (half a minute) are not spent before the cache is read."""
    from huggingface_hub import constants

    proxies = urllib.request.getproxies()
    if proxies.get("https") or proxies.get("all"):  # the proxy resolves the Hub's name, not this machine
        return None
    host = urllib.parse.urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    try:
        socket.getaddrinfo(host, 443)
    except OSError as err:
        return f"its address {host} does not resolve ({err.strerror or err}; no network?)"
    return None


def not_cached(repo: str, files: list[str], revision: str | None) -> NotCached:
    """The error for files of `repo` that are neither in the cache nor downloadable now: what was looked for, where,
    the command that fetches them on a connected machine and how to pass them as a local folder instead."""
    at = f" --revision {revision}" if revision else ""
    partial = sorted(p.name for p in (_repo_folder(repo) / "blobs").glob("*.incomplete"))
    if offline():
        cause = "HF_HUB_OFFLINE=1"
    else:
        why = unreachable_hub()
        cause = "the Hub could not be reached" + (f": {why}" if why else "")
    message = (
        f"{HUB_PREFIX}{repo}: {' and '.join(files)} not found in the Hugging Face cache ({_repo_folder(repo)}), and "
        f"{cause}. "
    )
    if partial:
        message += (
            f"A download of it stopped part way ({len(partial)} incomplete file(s) in its blobs folder): run it "
            "again with network and huggingface_hub resumes it. "
        )
    message += (
        f"On a machine with network: `hf download {repo}{at}` (into the cache there, then copy the folder "
        f"{_repo_folder(repo).name} into this machine's {hub_cache()}, or point HF_HOME at a copy), or "
        f"`hf download {repo}{at} --local-dir DIR` and pass the folder: vitkit.from_pretrained('DIR'), "
        "`--model-dir DIR`, `--init DIR`"
    )
    return NotCached(message)


def verify_blob(path: Path, repo: str) -> None:
    """Check a file of the Hub cache against its blob's name, the sha256 of a large file's content; nothing to check
    where the cache copied files (no symlinks) or the file is small (named by its git hash)."""
    blob = path.resolve()
    if path.is_symlink() and SHA256.fullmatch(blob.name):
        check_sha256(
            path,
            blob.name,
            f"{HUB_PREFIX}{repo}: {path.name} in the cache ({blob}) is not the file the Hub published: delete it "
            f"(`hf cache delete`, or remove {blob}) and download it again",
        )


def check_sha256(path: Path, expected: str, what: str) -> None:
    """`DamagedDownload` saying `what` when the sha256 of `path` does not start with `expected`."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    found = digest.hexdigest()
    if not found.startswith(expected):
        raise DamagedDownload(f"{what} (its sha256 is {found[: len(expected)]}, the published one {expected})")


def label_names(labels: str) -> tuple[str, ...]:
    """The label names a table of published weights cites (`PublishedWeights.labels`): "imagenet-1k", ImageNet's
    1000 classes in label order as torchvision publishes them (its weights' metadata, no download)."""
    if labels != "imagenet-1k":
        raise ValueError(f"unknown label names {labels!r}; known: {LABEL_SETS}")
    from torchvision.models import ResNet50_Weights

    return tuple(ResNet50_Weights.IMAGENET1K_V1.meta["categories"])


def published_labels(source: str) -> tuple[str, ...] | None:
    """The label names of the published weights at `source` ("hf-hub:ORG/REPO", a URL) where a registered model's
    table gives them; None otherwise."""
    found = weights_at(source)
    return None if found is None or found[1].labels is None else label_names(found[1].labels)


def torch_hub_file(url: str) -> Path:
    """The torch file at `url` in torch.hub's cache (`torch.hub.get_dir()`/checkpoints), downloaded with its
    progress bar and hash check unless there already; a cached file is checked against the hash prefix its name
    carries too."""
    name = url.rsplit("/", 1)[-1]
    path = Path(torch.hub.get_dir()) / "checkpoints" / name
    match = HASH_PREFIX.search(name)
    prefix = match.group(1) if match else None
    fix = f"delete {path} and download it again"
    if path.is_file():
        if prefix is not None:
            check_sha256(path, prefix, f"{path} is not the file published at {url}: {fix}")
        return path
    if offline():
        raise NotCached(
            f"{url} is not in torch.hub's cache ({path.parent}) and HF_HUB_OFFLINE=1. On a machine with network: "
            f"`python -c \"import torch; torch.hub.download_url_to_file('{url}', '{name}')\"`, then copy {name} "
            f"into {path.parent} (or set TORCH_HOME), or pass the file: `--init {name} --model MODEL`, "
            "vitkit.load_weights(model, FILE)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, os.fspath(path), hash_prefix=prefix, progress=True)
    except RuntimeError as err:  # torch.hub's hash check: the partial file is removed
        raise DamagedDownload(f"{url} came down with another content than published ({err}): try again") from err
    except OSError as err:
        raise NotCached(
            f"{url} could not be downloaded ({err}) and is not in torch.hub's cache ({path.parent})"
        ) from err
    return path
