"""The manifest: what a datastore is, how it was built, and the checksum of every file.

JSON with keys: ``format_version``, ``tokenizer`` (``fingerprint``,
``vocab_size``), ``storage`` (``dtype``, ``separator_id``, ``trie_key_width``),
``params`` (build parameters), ``stats`` (documents, tokens, contexts),
``files`` (name -> {sha256, bytes}) and ``manifest_sha256`` (sha256 of the
canonical JSON of all other keys, so an edited manifest is detected).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from retrieval_draft.atomic import atomic_write_bytes
from retrieval_draft.errors import CorruptDatastoreError, DatastoreNotFoundError, UnknownFormatVersionError
from retrieval_draft.store.layout import DATA_FILES, MANIFEST, SUPPORTED_VERSIONS

HASH_CHUNK = 8 << 20


def file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _canonical(body: dict) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


def write_manifest(directory: Path, body: dict, names: tuple[str, ...] = DATA_FILES) -> dict:
    """Add the checksums of the files ``names`` and the self checksum to ``body``; write
    manifest.json atomically."""
    body = dict(body)
    body["files"] = {
        name: {"sha256": file_sha256(directory / name), "bytes": (directory / name).stat().st_size}
        for name in names
    }
    body["manifest_sha256"] = hashlib.sha256(_canonical(body)).hexdigest()
    atomic_write_bytes(directory / MANIFEST, json.dumps(body, indent=2, sort_keys=True).encode("utf-8"))
    return body


def manifest_digest(directory: Path) -> str:
    """sha256 hex of a store's manifest.json bytes (a sharded store lists its shards' digests)."""
    return file_sha256(Path(directory) / MANIFEST)


def check_store_folder(directory: str | os.PathLike) -> None:
    """Raise DatastoreNotFoundError unless ``directory`` is a folder holding a manifest (a store's
    files are checked when read): nothing there, a file, or a folder of something else."""
    if not os.path.isdir(directory):
        what = "a file, not a datastore folder" if os.path.exists(directory) else "the path does not exist"
        raise DatastoreNotFoundError(f"no datastore at {directory}: {what}")
    if not os.path.exists(os.path.join(directory, MANIFEST)):
        raise DatastoreNotFoundError(f"no datastore at {directory}: the folder holds no {MANIFEST}")


def read_manifest(directory: Path) -> dict:
    """Parse manifest.json and check its version and self checksum (not the data files)."""
    path = Path(directory) / MANIFEST
    check_store_folder(directory)
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CorruptDatastoreError(f"{path}: missing or unreadable manifest") from exc
    if not isinstance(body, dict):
        raise CorruptDatastoreError(f"{path}: manifest is not a JSON object")
    version = body.get("format_version")
    if version not in SUPPORTED_VERSIONS:
        raise UnknownFormatVersionError(
            f"{path}: format version {version!r} is not supported (this code reads {list(SUPPORTED_VERSIONS)})"
        )
    claimed = body.pop("manifest_sha256", None)
    if claimed != hashlib.sha256(_canonical(body)).hexdigest():
        raise CorruptDatastoreError(f"{path}: manifest checksum mismatch (edited or damaged)")
    return body


def check_sizes(directory: Path, manifest: dict, names: tuple[str, ...] = DATA_FILES) -> None:
    """Check that every data file ``names`` exists with the recorded size (cheap: no reads)."""
    files = manifest.get("files", {})
    for name in names:
        path = Path(directory) / name
        record = files.get(name)
        if not isinstance(record, dict):
            raise CorruptDatastoreError(f"{name}: not listed in the manifest")
        if not path.is_file():
            raise CorruptDatastoreError(f"{name}: file missing")
        if path.stat().st_size != record.get("bytes"):
            raise CorruptDatastoreError(f"{name}: size {path.stat().st_size} != {record.get('bytes')} (truncated?)")


def verify_files(directory: Path, manifest: dict, names: tuple[str, ...] = DATA_FILES) -> None:
    """Check that every data file ``names`` exists with the recorded size and sha256."""
    check_sizes(directory, manifest, names)
    for name in names:
        path = Path(directory) / name
        if file_sha256(path) != manifest["files"][name].get("sha256"):
            raise CorruptDatastoreError(f"{name}: sha256 mismatch (corrupt file)")


class ManifestFields:
    """What a store's manifest says, read the same way for a flat store and a sharded one: the class
    that mixes this in holds the parsed manifest as ``manifest``."""

    manifest: dict

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def fingerprint(self) -> str:
        return str(self.manifest["tokenizer"]["fingerprint"])

    @property
    def separator(self) -> int:
        return int(self.manifest["storage"]["separator_id"])

    @property
    def key_width(self) -> int:
        return int(self.manifest["storage"]["trie_key_width"])

    @property
    def params(self) -> dict:
        return dict(self.manifest["params"])

