"""``GET /metrics``: llama-server's ``llamacpp:*`` metrics in Prometheus text, written by prometheus-client.

The values live in the engine (:class:`~pyggml.serve.engine.Stats` and the slots); a custom collector
reads them at scrape time, so the decode loop never waits on a metrics lock. Counters are exposed
with the ``_total`` suffix (``llamacpp:prompt_tokens_total``), as llama-server names them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        st = e.stats
        work = st.work

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"llamacpp:{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"llamacpp:{name}", doc, value=value)

        yield counter("prompt_tokens", "Number of prompt tokens processed", work.n_prompt)
        yield counter("prompt_tokens_cached", "Number of prompt tokens reused from the cache", st.n_prompt_cached)
        yield counter("prompt_seconds", "Total time spent processing prompts", work.t_prompt)
        yield counter("tokens_predicted", "Number of generation tokens processed", work.n_gen)
        yield counter("tokens_predicted_seconds", "Total time spent generating tokens", work.t_gen)
        yield counter("n_decode", "Total number of llama_decode() calls", st.n_decode)
        yield counter("requests", "Number of requests completed", st.n_requests)
        yield counter("requests_cancelled", "Number of requests whose client disconnected", st.n_cancelled)
        yield gauge("n_tokens_max", "Largest observed sequence length (prompt + generation)", st.n_tokens_max)
        yield gauge("prompt_tokens_seconds", "Average prompt throughput in tokens/s", work.pp_rate)
        yield gauge("predicted_tokens_seconds", "Average generation throughput in tokens/s", work.tg_rate)
        yield gauge("requests_processing", "Number of requests processing", sum(s.is_processing for s in e.slots))
        yield gauge("requests_deferred", "Number of requests deferred", e.n_deferred)
        yield gauge("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
                    st.n_busy_slots / max(st.n_decode, 1))
        states = GaugeMetricFamily("llamacpp:slot_state", "Slots in each state", labels=["state"])
        for state in ("idle", "processing prompt", "generating"):
            states.add_metric([state], sum(s.state == state for s in e.slots))
        yield states


def make_registry(engine: Engine) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(EngineCollector(engine))
    return reg


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
