"""Prometheus metrics of an encoder cache, fed from ``manager.stats()``.

Every family is named ``encoder_cache:<name>`` (the colon style of vLLM's
``vllm:`` and LMCache's ``lmcache:`` families, so they sort together on
vLLM's ``/metrics``) and labelled with ``model_name`` and ``engine`` (vLLM's
engine index; "0" with one engine). Counters also carry ``modality``
(``mm_features[i].modality``; "unknown" for a feature without one).

Gauges (cache fill, labelled ``model_name``, ``engine``):

- ``encoder_cache:capacity_embeds``: capacity, in encoder embeddings;
- ``encoder_cache:used_embeds``: embeddings held by cached entries;
- ``encoder_cache:freeable_embeds``: embeddings of unreferenced entries (evictable);
- ``encoder_cache:entries``: cached items.

Counters (``_total`` is appended on exposition):

- ``encoder_cache:hits`` / ``encoder_cache:hit_embeds``: item acquisitions a
  cached entry served, and their embeddings;
- ``encoder_cache:misses`` / ``encoder_cache:miss_embeds``: acquisitions that
  allocated an entry to encode, and their embeddings;
- ``encoder_cache:evictions`` / ``encoder_cache:evicted_embeds``: entries evicted to make room;
- ``encoder_cache:reencodes`` / ``encoder_cache:reencode_embeds``: misses on
  items this engine had cached and evicted before.

Export. With ``PROMETHEUS_MULTIPROC_DIR`` set (vLLM sets it itself when it
runs several API servers), the engine process writes its values to that
directory and vLLM's ``/metrics`` collects them with prometheus_client's
``MultiProcessCollector``. Counters are summed over processes, which is exact:
each (engine, modality) series has one writer, and a restarted engine adds
to what its predecessor counted. Gauges use ``multiprocess_mode="mostrecent"``:
each engine's series has one writer, and after a restart its newest value is
the truth, where ``sum`` would add the dead process's last fill to the live
one's. Without that directory, ``start_exporter`` serves the families on a
port of their own.

Values are copied from ``stats()`` by ``CacheMetrics.update``: the caller
decides when (the vLLM hook does it at most once per scheduler step), never on
a per-item call. Counters advance by the growth since the last update; the
observed manager's ``reset_stats()`` updates them first and then counts from
zero, so the exported counters never go down.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "COUNTERS",
    "GAUGES",
    "MULTIPROC_ENV",
    "PREFIX",
    "CacheMetrics",
    "multiprocess_dir",
    "start_exporter",
]

PREFIX = "encoder_cache:"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
INSTALL_HINT = "pip install 'encoder-cache[metrics]'"

#: Gauge name (after the prefix) -> help. ``capacity_embeds`` is the manager's
#: ``cache_size``; the others are the ``stats()`` keys of the same names (``entries``, ...).
GAUGES = {
    "capacity_embeds": "Encoder cache capacity, in encoder embeddings.",
    "used_embeds": "Encoder embeddings held by cached entries.",
    "freeable_embeds": "Encoder embeddings held by unreferenced (evictable) entries.",
    "entries": "Items in the encoder cache.",
}
#: Counter name (after the prefix) -> (``stats()`` key, help).
COUNTERS = {
    "hits": ("hits", "Item acquisitions served by a cached entry."),
    "misses": ("misses", "Item acquisitions that allocated an entry to encode."),
    "hit_embeds": ("hit_embeds", "Encoder embeddings of cache hits."),
    "miss_embeds": ("miss_embeds", "Encoder embeddings of cache misses."),
    "evictions": ("evictions", "Entries evicted to make room."),
    "evicted_embeds": ("evicted_embeds", "Encoder embeddings of evicted entries."),
    "reencodes": ("reencodes", "Misses on items this engine had cached and evicted."),
    "reencode_embeds": ("reencode_embeds", "Encoder embeddings of re-encodes."),
}
_GAUGE_STATS = ("used_embeds", "freeable_embeds", "entries")


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(f"encoder-cache metrics need prometheus_client: {INSTALL_HINT}") from exc
    return prometheus_client


def multiprocess_dir() -> str | None:
    """The directory prometheus_client's multiprocess mode writes to in this process, or None."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


class _Families:
    """The metric objects; one set per registry (or per process in multiprocess mode)."""

    def __init__(self, registry: Any) -> None:
        prom = _prometheus()
        labels = ("model_name", "engine")
        self.gauges = {
            name: prom.Gauge(PREFIX + name, text, labels, registry=registry, multiprocess_mode="mostrecent")
            for name, text in GAUGES.items()
        }
        self.counters = {
            name: prom.Counter(PREFIX + name, text, (*labels, "modality"), registry=registry)
            for name, (_, text) in COUNTERS.items()
        }


_FAMILIES: dict[int, _Families] = {}


def _families(registry: Any) -> _Families:
    # Families are created once per registry: prometheus_client refuses a name
    # registered twice, and a process may build several managers (vLLM rebuilds
    # its scheduler; tests build many).
    key = id(registry)
    families = _FAMILIES.get(key)
    if families is None:
        families = _FAMILIES[key] = _Families(registry)
    return families


class CacheMetrics:
    """One engine's series of the ``encoder_cache:`` families.

    ``registry`` is where the families live: ``None`` (the default) in
    multiprocess mode, where values go to ``PROMETHEUS_MULTIPROC_DIR`` and the
    collecting process reads them; a ``CollectorRegistry`` otherwise (see
    ``start_exporter``).
    """

    def __init__(self, *, model_name: str = "", engine: str | int = 0, registry: Any = None) -> None:
        families = _families(registry)
        labels = (str(model_name), str(engine))
        self._labels = labels
        self._gauges = {name: gauge.labels(*labels) for name, gauge in families.gauges.items()}
        self._counter_families = families.counters
        # modality -> [(counter child, stats key)], filled as modalities appear.
        self._counters: dict[str, list[tuple[Any, str]]] = {}
        self._seen: dict[str, dict[str, int]] = {}

    def update(self, stats: dict[str, Any], capacity: int) -> None:
        """Copy ``stats`` (a ``manager.stats()``) and the manager's ``cache_size`` into the series."""
        gauges = self._gauges
        gauges["capacity_embeds"].set(capacity)
        for key in _GAUGE_STATS:
            gauges[key].set(stats[key])
        for modality, values in stats["by_modality"].items():
            children = self._counters.get(modality)
            if children is None:
                children = self._counters[modality] = [
                    (family.labels(*self._labels, modality), COUNTERS[name][0])
                    for name, family in self._counter_families.items()
                ]
            seen = self._seen.setdefault(modality, {})
            for child, key in children:
                value = values[key]
                before = seen.get(key, 0)
                # A value below the last one means reset_stats(): it counts from zero.
                grown = value - before if value >= before else value
                if grown:
                    child.inc(grown)
                seen[key] = value
        for modality in self._seen.keys() - stats["by_modality"].keys():
            self._seen[modality] = {}  # reset_stats() dropped it

    def stats_reset(self) -> None:
        """The manager's counters were just zeroed: the next ``update`` counts them from zero."""
        self._seen.clear()


_EXPORTERS: dict[tuple[str, int], Any] = {}


def start_exporter(port: int, addr: str = "0.0.0.0") -> Any:
    """Serve the families on ``http://addr:port/metrics`` from a registry of their
    own (for engines without a multiprocess directory); returns that registry.
    A second call for the same address returns the running exporter's."""
    registry = _EXPORTERS.get((addr, port))
    if registry is None:
        prom = _prometheus()
        registry = prom.CollectorRegistry()
        prom.start_http_server(port, addr=addr, registry=registry)
        _EXPORTERS[addr, port] = registry
    return registry
