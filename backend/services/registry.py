"""The model registry: registered checkpoints, loaded on demand (LRU), each with its fixed
evaluation batches, prefix-cached evaluators and bundled texts; plus a result cache by plan.

Checkpoint paths are stored relative to the data dir and refused if they resolve outside
it; registered model folders (services/model_folders.py) may instead be absolute under a model
root (AAH_MODEL_DIRS). No traversal, no symlink escapes; only safetensors are loaded. A model of
either format is opened through aah_core.model_files and used only through WindowedLM.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session, sessionmaker

from aah_core.analysis.evaluate import PrefixCachedEvaluator
from aah_core.data import DataStream, EvalBatch, Tokenizer
from aah_core.errors import InvalidConfig
from aah_core.model_api import WindowedLM
from aah_core.model_files import ModelDescription, describe_model, open_model
from aah_core.paths import confine_folder_files
from aah_core.resources import check_loadable
from aah_core.windows import encode_window
from backend.schemas.errors import InvalidInput, NotFound, Unavailable
from backend.schemas.models import ModelInfo, ModelUnavailable, PrecisionInfo
from backend.services.cache import LruCache
from backend.services.model_folders import read_roots, register_model_folder
from backend.settings import Settings
from backend.store import catalog
from backend.store.db import transaction

logger = logging.getLogger(__name__)
EVAL_SEQS = 4  # sequences in each fixed evaluation batch, unless the model was registered with eval_tokens
TEXT_SEQS = 2  # bundled texts per kind
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
InfoKey = tuple[str, str, float]  # (model id, stored path, config.json's mtime): a changed file is looked at anew


def _reason(exc: BaseException) -> str:
    return str(exc) or exc.__class__.__name__


@dataclass
class TextSample:
    id: str
    name: str
    kind: str  # "text" | "copy"
    ids: torch.Tensor  # [T]


@dataclass
class LoadedModel:
    id: str
    model: WindowedLM  # the one model interface: the service never asks which family it is
    info: ModelInfo
    stream: DataStream
    lock: threading.RLock = field(default_factory=threading.RLock)  # evaluators are stateful
    _batches: dict[str, EvalBatch] = field(default_factory=dict)
    _evaluators: dict[str, PrefixCachedEvaluator] = field(default_factory=dict)
    _texts: dict[str, TextSample] | None = None

    @property
    def plan(self) -> torch.Tensor:
        return self.model.plan

    @property
    def tokenizer(self) -> Tokenizer:
        return self.model.tokenizer

    def batch(self, eval_set: str) -> EvalBatch:
        """The fixed batch of make_eval_batch(config, eval_set, info.eval_seqs) (same stream, same seeds)."""
        if eval_set not in self._batches:
            try:
                batch = self.stream.eval_batch(eval_set, self.info.eval_seqs)
            except ValueError as exc:
                raise InvalidInput(f"eval_set: {exc}") from None
            self._batches[eval_set] = self._in_vocabulary(batch, f"eval_set {eval_set!r}")
        return self._batches[eval_set]

    def _in_vocabulary(self, batch: EvalBatch, what: str) -> EvalBatch:
        """`batch`, once its token ids are known to fit the model's embedding (a checkpoint may pair a model
        with a tokenizer of a larger vocabulary)."""
        largest = int(batch.idx.max()) if batch.idx.numel() else -1
        if largest >= self.model.vocab_size:
            raise InvalidInput(f"{what}: this model's tokenizer gives token id {largest}, beyond the model's "
                               f"vocabulary of {self.model.vocab_size}; its checkpoint pairs the model with "
                               "another tokenizer")
        return batch

    def evaluator(self, eval_set: str) -> PrefixCachedEvaluator:
        if eval_set not in self._evaluators:
            self._evaluators[eval_set] = PrefixCachedEvaluator(self.model, self.batch(eval_set))
        return self._evaluators[eval_set]

    def texts(self) -> dict[str, TextSample]:
        """Bundled texts for heatmaps: the first sequences of the text and copy evaluation sets."""
        if self._texts is None:
            texts: dict[str, TextSample] = {}
            for kind, label in (("text", "Validation text"), ("english", "English text"), ("copy", "Copy task")):
                try:
                    batch = self.stream.eval_batch(kind, TEXT_SEQS)
                except ValueError:  # trained without a synthetic task
                    continue
                self._in_vocabulary(batch, f"text {kind!r}")
                for i in range(TEXT_SEQS):
                    texts[f"{kind}-{i}"] = TextSample(f"{kind}-{i}", f"{label} {i + 1}", kind, batch.idx[i])
            self._texts = texts
        return self._texts

    def text(self, text_id: str) -> TextSample:
        texts = self.texts()
        if text_id not in texts:
            raise NotFound(f"text {text_id!r} not found for model {self.id!r}; known: {', '.join(texts)}")
        return texts[text_id]


def _model_info(entry: catalog.CheckpointEntry, d: ModelDescription) -> ModelInfo:
    buckets = [encode_window(b, d.seq_len) for b in d.buckets]
    seqs = EVAL_SEQS if entry.eval_tokens is None else max(1, entry.eval_tokens // d.seq_len)
    return ModelInfo(id=entry.id, name=entry.name, n_layer=d.n_layer, n_head=d.n_head, seq_len=d.seq_len,
                     preset=entry.preset or d.preset, buckets=buckets, n_params=d.n_params, run_id=entry.run_id,
                     family=d.family, dtype=d.dtype, eval_seqs=seqs, eval_tokens=seqs * d.seq_len, sinks=d.sinks)


class Registry:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._infos: dict[InfoKey, ModelInfo] = {}
        # why a model could not be described or loaded, until its files change: listed as unavailable
        self._failures: dict[InfoKey, str] = {}
        self._lock = threading.Lock()
        self._load_locks: dict[str, threading.Lock] = {}
        self.results = LruCache(settings.result_cache_size)

    # -- paths and metadata ---------------------------------------------------------------

    def resolve(self, relative: str) -> Path:
        """A stored model path, resolved: a relative one must lie inside the data dir, an absolute one
        (a registered folder) under a model root."""
        if Path(relative).is_absolute():
            path = Path(relative).resolve()
            if not any(path.is_relative_to(root) for root in self.settings.model_roots):
                raise Unavailable(f"model path {relative!r} is outside AAH_MODEL_DIRS; refusing to load it")
            return path
        root = self.settings.data_dir.resolve()
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise Unavailable(f"checkpoint path {relative!r} is outside AAH_DATA_DIR; refusing to load it")
        return path

    def _key(self, entry: catalog.CheckpointEntry) -> InfoKey:
        try:  # lstat: a config.json that is a link out is not followed here (describe refuses it)
            stamp = (self.resolve(entry.path) / "config.json").lstat().st_mtime
        except OSError:
            raise Unavailable(f"model {entry.id!r}: checkpoint {entry.path!r} is missing") from None
        return entry.id, entry.path, stamp

    def _entry(self, model_id: str) -> catalog.CheckpointEntry:
        with transaction(self.sessions) as s:
            return catalog.get_checkpoint(s, model_id)

    def _info_from_files(self, entry: catalog.CheckpointEntry) -> ModelInfo:
        """ModelInfo from the folder's files (aah_core.model_files.describe_model, confined to the roots;
        no weights), with the parameter count the config describes checked against this machine's memory."""
        key = self._key(entry)
        if key in self._failures:
            raise Unavailable(self._failures[key])
        if key not in self._infos:
            try:
                description = describe_model(self.resolve(entry.path), entry.seq_len, read_roots(self.settings, entry.path))
                check_loadable(description.n_params, DTYPE_BYTES.get(description.dtype, 4))
            except Exception as exc:  # whatever a hostile folder makes the engine raise: this model only
                self._failures[key] = f"model {entry.id!r}: checkpoint {entry.path!r} is unusable here ({_reason(exc)})"
                raise Unavailable(self._failures[key]) from None
            self._infos[key] = _model_info(entry, description)
        return self._infos[key]

    def _scan(self) -> tuple[list[ModelInfo], list[ModelUnavailable]]:
        with transaction(self.sessions) as s:
            entries = catalog.list_checkpoints(s)
        usable, unusable = [], []
        for entry in entries:
            try:
                usable.append(self._info_from_files(entry))
            except Unavailable as exc:
                unusable.append(ModelUnavailable(id=entry.id, name=entry.name, reason=exc.detail))
        return usable, unusable

    def list_models(self) -> list[ModelInfo]:
        """Every registered model that can be served; the others are in list_unavailable()."""
        return [self._with_precision(info) for info in self._scan()[0]]

    def list_unavailable(self) -> list[ModelUnavailable]:
        """Registered models that cannot be served here, each with the reason."""
        return self._scan()[1]

    def info(self, model_id: str) -> ModelInfo:
        return self._with_precision(self._info_from_files(self._entry(model_id)))

    def _with_precision(self, info: ModelInfo) -> ModelInfo:
        """A loaded model's info (dtype and precision as measured when it loaded), else the files' own."""
        with self._lock:
            loaded = self._loaded.get(info.id)
        return info if loaded is None else loaded.info

    def folder(self, model_id: str) -> Path:
        """The model's folder on disk (confined as `resolve` does), for a reader of its files (an export):
        refused (503) when one of them has become a link that leads out of the roots."""
        entry = self._entry(model_id)
        path = self.resolve(entry.path)
        try:
            confine_folder_files(path, read_roots(self.settings, entry.path).folder)
        except InvalidConfig as exc:
            raise Unavailable(f"model {model_id!r}: {exc}") from None
        return path

    def register(self, path: str, name: str | None, seq_len: int | None, eval_tokens: int | None = None) -> ModelInfo:
        """Register a model folder under the model roots (422 outside them or unreadable, 409 if known)."""
        with transaction(self.sessions) as s:
            model_id, _ = register_model_folder(s, path, name, seq_len, self.settings, eval_tokens)
        logger.info("model %s registered from %s", model_id, path)
        return self.info(model_id)

    # -- loading --------------------------------------------------------------------------

    def get(self, model_id: str) -> LoadedModel:
        """The loaded model (loading it on first use; the least recently used one is dropped)."""
        with self._lock:
            if model_id in self._loaded:
                self._loaded.move_to_end(model_id)
                return self._loaded[model_id]
            load_lock = self._load_locks.setdefault(model_id, threading.Lock())
        with load_lock:  # one load per model even under concurrent first requests
            with self._lock:
                if model_id in self._loaded:
                    return self._loaded[model_id]
            entry = self._entry(model_id)
            info = self._info_from_files(entry)
            try:
                opened = open_model(self.resolve(entry.path), entry.seq_len, read_roots(self.settings, entry.path))
            except Exception as exc:  # any failure makes this one model unavailable (listed), never the service
                self._failures[self._key(entry)] = f"model {model_id!r} cannot be loaded: {_reason(exc)}"
                raise Unavailable(self._failures[self._key(entry)]) from None
            if opened.precision is not None:  # measured while loading: the dtype it runs in, and at what loss cost
                info = info.model_copy(update={"dtype": opened.precision.dtype,
                                               "precision": PrecisionInfo(**opened.precision.to_dict())})
            loaded = LoadedModel(model_id, opened.model, info, opened.stream)
            logger.info("model %s loaded from %s", model_id, entry.path)
            with self._lock:
                self._loaded[model_id] = loaded
                while len(self._loaded) > self.settings.max_loaded_models:
                    dropped, _ = self._loaded.popitem(last=False)
                    self.forget_results(dropped)
            return loaded

    def preload(self) -> list[LoadedModel]:
        """Load the first registered models at start and return them. Each is loaded or refused on its
        own: a model that fails is listed as unavailable with the reason, and the service starts
        whatever any record holds."""
        loaded = []
        usable, unusable = self._scan()
        for model in unusable:
            logger.warning("model %s is unavailable: %s", model.id, model.reason)
        for info in usable[: self.settings.max_loaded_models]:
            try:
                loaded.append(self.get(info.id))
            except Unavailable as exc:
                logger.warning("preload: %s", exc.detail)
            except Exception:  # e.g. the store went away meanwhile: the next request loads it again
                logger.exception("preload of model %s failed", info.id)
        return loaded

    # -- the result cache (by model, kind and plan) ------------------------------------------

    def cached(self, key: Hashable) -> Any | None:
        return self.results.get(key)

    def remember(self, key: Hashable, value: Any) -> None:
        self.results.put(key, value)

    def forget_results(self, model_id: str) -> None:
        self.results.discard(lambda k: isinstance(k, tuple) and bool(k) and k[0] == model_id)

    def close(self) -> None:
        with self._lock:
            self._loaded.clear()
        self.results.clear()
