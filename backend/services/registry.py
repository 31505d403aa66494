"""The model registry: registered checkpoints, loaded on demand (LRU), each with its fixed
evaluation batches, prefix-cached evaluators and bundled texts; plus a result cache by plan.

Checkpoint paths are stored relative to the data dir and refused if they resolve outside
it (no traversal, no symlink escapes). Only safetensors + JSON checkpoints are loaded.
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

from aah_core.checkpoint import CheckpointInfo, load_checkpoint, read_checkpoint_info
from aah_core.data import DataStream, EvalBatch, Tokenizer
from aah_core.errors import AAHError, CheckpointError
from aah_core.evaluate import PrefixCachedEvaluator
from aah_core.model_api import WindowedLM
from aah_core.paths import confine_data_paths
from aah_core.windows import encode_window
from backend import catalog
from backend.db import transaction
from backend.errors import InvalidInput, NotFound, Unavailable
from backend.schemas import ModelInfo
from backend.services.cache import LruCache
from backend.settings import Settings

logger = logging.getLogger(__name__)
EVAL_SEQS = 4  # sequences in each fixed evaluation batch
TEXT_SEQS = 2  # bundled texts per kind


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
        """The fixed batch of make_eval_batch(config, eval_set, EVAL_SEQS) (same stream, same seeds)."""
        if eval_set not in self._batches:
            try:
                self._batches[eval_set] = self.stream.eval_batch(eval_set, EVAL_SEQS)
            except ValueError as exc:
                raise InvalidInput(f"eval_set: {exc}") from None
        return self._batches[eval_set]

    def evaluator(self, eval_set: str) -> PrefixCachedEvaluator:
        if eval_set not in self._evaluators:
            self._evaluators[eval_set] = PrefixCachedEvaluator(self.model, self.batch(eval_set))
        return self._evaluators[eval_set]

    def texts(self) -> dict[str, TextSample]:
        """Bundled texts for heatmaps: the first sequences of the text and copy evaluation sets."""
        if self._texts is None:
            texts: dict[str, TextSample] = {}
            for kind, label in (("text", "Validation text"), ("copy", "Copy task")):
                try:
                    batch = self.stream.eval_batch(kind, TEXT_SEQS)
                except ValueError:  # trained without a synthetic task
                    continue
                for i in range(TEXT_SEQS):
                    texts[f"{kind}-{i}"] = TextSample(f"{kind}-{i}", f"{label} {i + 1}", kind, batch.idx[i])
            self._texts = texts
        return self._texts

    def text(self, text_id: str) -> TextSample:
        texts = self.texts()
        if text_id not in texts:
            raise NotFound(f"text {text_id!r} not found for model {self.id!r}; known: {', '.join(texts)}")
        return texts[text_id]


def _model_info(entry: catalog.CheckpointEntry, ckpt: CheckpointInfo) -> ModelInfo:
    m = ckpt.config.model
    buckets = [encode_window(b, m.seq_len) for b in m.buckets]
    return ModelInfo(id=entry.id, name=entry.name, n_layer=m.n_layer, n_head=m.n_head, seq_len=m.seq_len,
                     preset=entry.preset or ckpt.config.preset, buckets=buckets, n_params=ckpt.n_params,
                     run_id=entry.run_id)


class Registry:
    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._infos: dict[tuple[str, str, float], ModelInfo] = {}
        self._lock = threading.Lock()
        self._load_locks: dict[str, threading.Lock] = {}
        self.results = LruCache(settings.result_cache_size)

    # -- paths and metadata ---------------------------------------------------------------

    def resolve(self, relative: str) -> Path:
        """A stored checkpoint path, resolved and checked to lie inside the data dir."""
        root = self.settings.data_dir.resolve()
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise Unavailable(f"checkpoint path {relative!r} is outside AAH_DATA_DIR; refusing to load it")
        return path

    def _entry(self, model_id: str) -> catalog.CheckpointEntry:
        with transaction(self.sessions) as s:
            return catalog.get_checkpoint(s, model_id)

    def _info_from_files(self, entry: catalog.CheckpointEntry) -> ModelInfo:
        """ModelInfo from the checkpoint's files (aah_core.checkpoint.read_checkpoint_info), no weights."""
        path = self.resolve(entry.path)
        try:
            stamp = (path / "config.json").stat().st_mtime
        except OSError:
            raise Unavailable(f"model {entry.id!r}: checkpoint {entry.path!r} is missing") from None
        key = (entry.id, entry.path, stamp)
        if key not in self._infos:
            try:
                ckpt = read_checkpoint_info(path)
            except CheckpointError as exc:
                raise Unavailable(f"model {entry.id!r}: checkpoint {entry.path!r} is unreadable ({exc})") from None
            self._infos[key] = _model_info(entry, ckpt)
        return self._infos[key]

    def list_models(self) -> list[ModelInfo]:
        """Every registered checkpoint that can be read; unreadable ones are logged and skipped."""
        with transaction(self.sessions) as s:
            entries = catalog.list_checkpoints(s)
        out = []
        for entry in entries:
            try:
                out.append(self._info_from_files(entry))
            except Unavailable as exc:
                logger.warning("skipping %s", exc.detail)
        return out

    def info(self, model_id: str) -> ModelInfo:
        return self._info_from_files(self._entry(model_id))

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
                ckpt = load_checkpoint(self.resolve(entry.path))
                # its texts are served: its corpus must lie under the allowed roots like a job's
                data = confine_data_paths(ckpt.config, self.settings.path_roots).data
                stream = DataStream(data, ckpt.config.model.seq_len)
            except (CheckpointError, AAHError, ValueError, OSError) as exc:
                raise Unavailable(f"model {model_id!r} cannot be loaded: {exc}") from None
            loaded = LoadedModel(model_id, ckpt.model, info, stream)
            logger.info("model %s loaded from %s", model_id, entry.path)
            with self._lock:
                self._loaded[model_id] = loaded
                while len(self._loaded) > self.settings.max_loaded_models:
                    dropped, _ = self._loaded.popitem(last=False)
                    self.forget_results(dropped)
            return loaded

    def preload(self) -> None:
        for info in self.list_models()[: self.settings.max_loaded_models]:
            try:
                self.get(info.id)
            except Unavailable as exc:
                logger.warning("preload: %s", exc.detail)

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
