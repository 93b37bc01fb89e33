"""What the engines (and, beside them, their GPUs) say about themselves while a scenario runs.

A `Sampler` (sampler.py) reads a list of `Source`s (source.py: a name and `read()`, returning
samples named in the gate's vocabulary, vocabulary.py) at a fixed interval on a daemon thread
beside the load, one `Timeline` per engine role on the gate's monotonic clock. A scrape that
fails, times out or answers too much is a gap in the timeline, never a crash of the gate.
`PrometheusSource` (prometheus.py) reads an engine's Prometheus endpoint with
`prometheus-client`'s parser and maps each engine family's names (vLLM, SGLang, TensorRT-LLM,
llama.cpp, the sim) to the vocabulary. The engines' GPUs join the same timelines
(gpu_sources.py: `EngineGpuSource` over gpu.py's `GpuSource`s: NVML, nvml.py; `nvidia-smi
--query-gpu`, nvidia_smi.py; the DCGM exporter, dcgm.py). The judge's checks on the timelines
are `gate/analysis/engine_metrics.py` and `gate/analysis/gpu.py` (pure); the stored form is the
verdict document's `ScenarioDoc.telemetry`.
"""

from gate.telemetry.prometheus import PrometheusSource, parse_metrics
from gate.telemetry.sampler import Sampler
from gate.telemetry.source import Sample, Source, Timeline
from gate.telemetry.vocabulary import CONFIG_LABELS, VOCABULARY, map_families

__all__ = [
    "CONFIG_LABELS",
    "VOCABULARY",
    "PrometheusSource",
    "Sample",
    "Sampler",
    "Source",
    "Timeline",
    "map_families",
    "parse_metrics",
]
