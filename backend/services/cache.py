"""A small thread-safe LRU cache (results by plan, serialised metric responses by version), bounded by
items and, when given a ``size`` function, by bytes: one huge response cannot push the server's
memory up by the item limit times its size."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class LruCache:
    def __init__(self, max_items: int, max_bytes: int | None = None,
                 size: Callable[[Any], int] | None = None) -> None:
        if (max_bytes is None) != (size is None):
            raise ValueError("LruCache: max_bytes and size go together")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size = size
        self.bytes = 0  # the size of what is held (0 without a size function)
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key][0]

    def put(self, key: Hashable, value: Any) -> None:
        size = self._size(value) if self._size is not None else 0
        if self.max_items <= 0 or (self.max_bytes is not None and size > self.max_bytes):
            return  # a value larger than the whole cache is not kept (nor does it evict anything)
        with self._lock:
            self._pop(key)
            self._items[key] = (value, size)
            self.bytes += size
            while len(self._items) > self.max_items or (self.max_bytes is not None and self.bytes > self.max_bytes):
                self._pop(next(iter(self._items)))

    def _pop(self, key: Hashable) -> None:
        held = self._items.pop(key, None)
        if held is not None:
            self.bytes -= held[1]

    def discard(self, match: Callable[[Hashable], bool]) -> None:
        with self._lock:
            for key in [k for k in self._items if match(k)]:
                self._pop(key)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)
