"""A stand-in for NVIDIA's DCGM exporter over the sim's simulated GPUs (simengine/gpu.py): an
HTTP server whose /metrics is what dcgm-exporter serves for those GPUs, for tests of the gate's
Kubernetes path on machines without a GPU (`python -m simengine.dcgm_exporter --port P
--hostname NODE [--pod POD --namespace NS --container C]`, reading $SIMENGINE_GPU_STATE_DIR).

The text follows the exporter's template byte for byte (NVIDIA/dcgm-exporter
internal/pkg/rendermetrics/render_metrics.go line 47, whose expected output is in
render_metrics_test.go line 76): per counter of etc/default-counters.csv that the gate reads,
"# HELP NAME HELP" and "# TYPE NAME TYPE", then per GPU
NAME{gpu="I",UUID="...",pci_bus_id="...",device="nvidiaI",modelName="...",Hostname="NODE"
then the labels (DCGM_FI_DRIVER_VERSION) and the pod's attributes (container, namespace, pod:
internal/pkg/transformation/const.go) in sorted order, "} VALUE"; integers printed %d, doubles
%f (internal/pkg/collector/gpu_collector.go toString). `--hostname-label hostname` writes the
label as releases after d5e5f51 (#655) do.
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from simengine.gpu import STATE_DIR_ENV
from simengine.nvidia_smi import states

# (field, type, help as in default-counters.csv, value from a GPU's state, integer?)
COUNTERS: tuple[tuple[str, str, str, str, bool], ...] = (
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power_w", False),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "energy_mj",
        True,
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "utilization_pct", True),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        "xid",
        True,
    ),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free", True),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "memory_used_mib", True),
)


# internal/pkg/collector/xid_errors.go's texts of the XIDs a test injects; others as the
# exporter words a code beyond its table (gpu_collector.go unknownErr).
XID_TEXT = {
    0: "No Error",
    13: "Graphics Engine Exception",
    48: "Double Bit ECC Error",
    79: "GPU has fallen off the bus",
    94: "Contained ECC error",
}


def _value(state: dict[str, Any], key: str) -> float:
    if key == "xid":
        return float(state["xids"][-1]) if state.get("xids") else 0.0
    if key == "fb_free":
        return float(state["memory_total_mib"] - state["memory_used_mib"])
    return float(state[key])


def render(
    gpus: Sequence[dict[str, Any]],
    hostname: str,
    attributes: dict[str, str],
    host_label: str = "Hostname",
) -> str:
    out = []
    for field, kind, help_text, key, integer in COUNTERS:
        out.append(f"# HELP {field} {help_text}\n# TYPE {field} {kind}\n")
        for s in gpus:
            i = int(s["index"])
            labels = (
                f'gpu="{i}",UUID="{s["uuid"]}",pci_bus_id="{s["pci_bus_id"]}",'
                f'device="nvidia{i}",modelName="{s["name"]}",{host_label}="{hostname}"'
            )
            extra = {"DCGM_FI_DRIVER_VERSION": str(s["driver_version"]), **attributes}
            if key == "xid":
                code = int(_value(s, key))
                extra["err_code"] = str(code)
                extra["err_msg"] = XID_TEXT.get(code, "Unknown Error")
            labels += "".join(f',{k}="{v}"' for k, v in sorted(extra.items()))
            v = _value(s, key)
            out.append(f"{field}{{{labels}}} {int(v) if integer else f'{v:f}'}\n")
    return "".join(out)


def serve(port: int, hostname: str, attributes: dict[str, str], host_label: str) -> None:
    directory = Path(os.environ.get(STATE_DIR_ENV, "."))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = render(states(directory), hostname, attributes, host_label).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"dcgm-exporter stand-in on http://127.0.0.1:{server.server_address[1]}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simengine.dcgm_exporter")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--hostname", required=True)
    p.add_argument("--hostname-label", choices=("Hostname", "hostname"), default="Hostname")
    p.add_argument("--pod")
    p.add_argument("--namespace")
    p.add_argument("--container")
    ns = p.parse_args(argv)
    attributes = {
        k: v
        for k, v in (("pod", ns.pod), ("namespace", ns.namespace), ("container", ns.container))
        if v
    }
    serve(ns.port, ns.hostname, attributes, ns.hostname_label)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
