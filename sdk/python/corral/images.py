"""Layers, compositions and pack: corral.v1.ImageService as plain Python.

A layer is a read-only EROFS layer ``NAME@VERSION``; a composition
``NAME@VERSION`` stacks layers, base first, into an environment that
``create(image=...)`` accepts like a built image name.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["Layer", "Composition", "Images", "Removed", "Packed", "BuiltImage", "Imported", "ImportProgress"]

_SVC = "/corral.v1.ImageService/"


@dataclass(frozen=True)
class Layer:
    """A layer: EROFS metadata plus a data blob (no blob: an earlier store's single file)."""

    ref: str
    digest: str
    meta_size: int = 0
    blob_digest: str = ""
    blob_size: int = 0
    # Set when the node reads the blob lazily from a blob store.
    lazy: Optional["LazyBlob"] = None

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "Layer":
        d = d or {}
        lazy = d.get("lazy")
        return cls(ref=d.get("ref", ""), digest=d.get("digest", ""), meta_size=int(d.get("metaSize", 0)),
                   blob_digest=d.get("blobDigest", ""), blob_size=int(d.get("blobSize", 0)),
                   lazy=LazyBlob._from_json(lazy) if lazy else None)


@dataclass(frozen=True)
class LazyBlob:
    """The lazy-loading figures of a layer's blob on the node."""

    bytes_fetched: int = 0  # from the store, prefetch included
    bytes_present: int = 0
    chunks_present: int = 0
    chunks_total: int = 0
    chunk_size: int = 0
    hit_rate: float = 0.0  # chunk reads served from the cache / all
    failed_fetches: int = 0
    corrupt_chunks: int = 0
    fault: str = ""  # the last failed fetch, until one succeeds

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "LazyBlob":
        return cls(bytes_fetched=int(d.get("bytesFetched", 0)), bytes_present=int(d.get("bytesPresent", 0)),
                   chunks_present=int(d.get("chunksPresent", 0)), chunks_total=int(d.get("chunksTotal", 0)),
                   chunk_size=int(d.get("chunkSize", 0)), hit_rate=float(d.get("hitRate", 0.0)),
                   failed_fetches=int(d.get("failedFetches", 0)), corrupt_chunks=int(d.get("corruptChunks", 0)),
                   fault=d.get("fault", ""))


@dataclass(frozen=True)
class Composition:
    """Layer references, base first: ``NAME@VERSION`` (pinned) or ``NAME`` (its latest version)."""

    ref: str
    layers: List[str] = field(default_factory=list)
    env: List[str] = field(default_factory=list)

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "Composition":
        d = d or {}
        return cls(ref=d.get("ref", ""), layers=list(d.get("layers", [])), env=list(d.get("env", [])))


@dataclass(frozen=True)
class Images:
    """What the node has: built images (name -> layers), compositions and layers."""

    built: Dict[str, List[Layer]]
    compositions: List[Composition]
    layers: List[Layer]


@dataclass(frozen=True)
class Removed:
    """What a remove or a garbage collection deleted."""

    images: List[str]
    compositions: List[str]
    layers: List[Layer]
    deleted: List[str]
    freed_bytes: int

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "Removed":
        d = d or {}
        return cls(images=list(d.get("images", [])), compositions=list(d.get("compositions", [])),
                   layers=[Layer._from_json(x) for x in d.get("layers", [])],
                   deleted=list(d.get("deleted", [])), freed_bytes=int(d.get("freedBytes", 0)))


@dataclass(frozen=True)
class Packed:
    """The layer a pack made and, unless asked otherwise, the composition
    of the same name stacking it on the sandbox's layers."""

    layer: Layer
    composition: Optional[Composition]


def images_from_json(d: Dict[str, Any]) -> Images:
    built = {b.get("name", ""): [Layer._from_json(x) for x in b.get("layers", [])] for b in d.get("images", [])}
    return Images(built=built,
                  compositions=[Composition._from_json(x) for x in d.get("compositions", [])],
                  layers=[Layer._from_json(x) for x in d.get("layers", [])])


def packed_from_json(d: Dict[str, Any]) -> Packed:
    comp = d.get("composition")
    return Packed(layer=Layer._from_json(d.get("layer", {})), composition=Composition._from_json(comp) if comp else None)


@dataclass(frozen=True)
class BuiltImage:
    """An image built from a recipe: its layers, base first, and environment."""

    name: str
    layers: List[Layer]
    env: List[str]

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "BuiltImage":
        return cls(name=d.get("name", ""), layers=[Layer._from_json(x) for x in d.get("layers", [])],
                   env=list(d.get("env", [])))


@dataclass(frozen=True)
class ImportProgress:
    """How far an import is: the layer being converted (1-based; 0 while
    reading the manifest) of ``layers``, uncompressed bytes read so far."""

    layer: int
    layers: int
    bytes: int
    cached: bool

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "ImportProgress":
        return cls(layer=int(d.get("layer", 0)), layers=int(d.get("layers", 0)), bytes=int(d.get("bytes", 0)),
                   cached=bool(d.get("cached", False)))


@dataclass(frozen=True)
class Imported:
    """What an import recorded: the composition, the image's digest and its
    layers (``cached``: imported before, nothing converted)."""

    composition: Composition
    image_digest: str
    layers: List[Layer]
    cached: bool

    @classmethod
    def _from_json(cls, d: Dict[str, Any]) -> "Imported":
        return cls(composition=Composition._from_json(d.get("composition", {})), image_digest=d.get("imageDigest", ""),
                   layers=[Layer._from_json(x) for x in d.get("layers", [])], cached=bool(d.get("cached", False)))