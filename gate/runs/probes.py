"""The probe suites: compatibility (the same fixed probes to both engines; a probe the
reference answers well and the candidate does not fails a check) and correctness (greedy
probes with logprobs, the reference's own envelope alone and under load, and teacher-forced
scoring where the engines allow it; judged in
correctness_divergence.divergence_samples)."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

from gate.analysis.divergence import DivergenceSamples
from gate.analysis.policy import Policy
from gate.runs.context import RunContext
from gate.runs.correctness_divergence import CorrectnessRun, correctness_doc, divergence_samples
from gate.runs.engine_pair import Engines
from gate.runs.schedules import scenario_seed
from gate.spec import GateSpec, ScenarioSpec
from gate.verdict.document import CorrectnessDoc, ProbeDoc, ProbeSide
from loadgen import suite as suite_catalogue
from loadgen.capabilities import Capabilities
from loadgen.client import Target
from loadgen.suite import ProbeKind


def _side(r: suite_catalogue.ProbeResult) -> ProbeSide:
    return ProbeSide(status=r.status, ok=r.ok, problems=list(r.problems))


async def compatibility(ctx: RunContext, engines: Engines, sc: ScenarioSpec) -> list[ProbeDoc]:
    """The compatibility suite, one probe at a time on each engine."""
    ctx.gate_phase(f"scenario:{sc.name}", "compatibility probes")
    cap = ctx.limits.max_prompt_tokens  # the operator's, not the engine's, context
    ref, cand = await asyncio.gather(
        *(suite_catalogue.run_probes(t, max_context=cap) for t in engines.targets(sc.api))
    )
    engines.check_crashes()
    by_name = {p.name: p for p in cand}
    return [
        ProbeDoc(name=r.name, reference=_side(r), candidate=_side(by_name[r.name]))
        for r in ref
        if r.name in by_name
    ]


@dataclass(frozen=True)
class CorrectnessResult:
    run: CorrectnessRun
    samples: DivergenceSamples
    policy: Policy

    def describe(self) -> CorrectnessDoc:
        return correctness_doc(self.run, self.samples, self.policy)


async def _teacher_forced(
    ctx: RunContext,
    run: CorrectnessRun,
    cfg: suite_catalogue.Correctness,
    targets: tuple[Target, Target],
    seed: int,
) -> None:
    """Score the reference's continuations on both engines and on the reference under load."""
    ref_t, cand_t = targets
    ref = run.reference
    run.scored = [i for i, r in enumerate(ref) if r.prompt_token_ids and r.token_ids]
    items = [(ref[i].prompt_token_ids or [], ref[i].token_ids or []) for i in run.scored]
    if not items:
        if any(r.error is None for r in ref):
            ctx.notes.append(
                f"Teacher-forced scoring in {run.name} skipped: the reference returns no "
                "prompt and output token ids (vLLM's return_token_ids); free-run greedy only."
            )
        return
    k = cfg.top_logprobs
    s_ref, s_cand = await asyncio.gather(
        suite_catalogue.score_continuations(ref_t, items, top_logprobs=k),
        suite_catalogue.score_continuations(cand_t, items, top_logprobs=k),
    )
    s_load = await suite_catalogue.score_continuations(
        ref_t,
        items,
        top_logprobs=k,
        concurrent=True,
        background=cfg.envelope_load,
        scenario=cfg,
        seed=seed,
    )
    run.scores = {"reference": s_ref, "candidate": s_cand, "loaded": s_load}


def adapt_to(
    cfg: suite_catalogue.Correctness,
    reference: Capabilities | None,
    name: str,
    notes: list[str],
    candidate: Capabilities | None = None,
) -> suite_catalogue.Correctness:
    """The suite as far as the reference supports it: no more top logprobs than it returns,
    and no teacher-forced scoring where it has no prompt logprobs or prompt token ids (the
    free-run comparison remains). What the candidate lost is a compatibility check's. Tokens
    are asked by id (vLLM's `return_tokens_as_token_ids`) only when both engines name them so:
    one engine's `token_id:N` against the other's text would differ at every position."""
    if reference is None:
        return cfg
    changes: dict[str, object] = {}
    if reference.tokens_by_id and candidate is not None and candidate.tokens_by_id:
        changes["tokens_by_id"] = True
    k = reference.top_logprobs_max
    if k is not None and k < cfg.top_logprobs:
        changes["top_logprobs"] = k
        notes.append(
            f"{name}: the reference returns at most {k} top logprobs per token, so the probes "
            f"ask for {k}, not {cfg.top_logprobs}."
        )
    if cfg.teacher_forced and not (reference.prompt_logprobs and reference.prompt_token_ids):
        changes["teacher_forced"] = False
        lacks = [
            f
            for f, has in (
                ("prompt logprobs", reference.prompt_logprobs),
                ("prompt token ids", reference.prompt_token_ids),
            )
            if not has
        ]
        notes.append(
            f"{name}: teacher-forced scoring skipped, the reference has no "
            f"{' and no '.join(lacks)}; the probes are compared free-running."
        )
    return dataclasses.replace(cfg, **changes) if changes else cfg  # type: ignore[arg-type]


def probe_api(reference: Capabilities | None, name: str, notes: list[str]) -> ProbeKind:
    """The API the greedy probes go to: completions, or chat for a reference that serves only
    chat (free-running then: teacher forcing scores prompts on the completions API)."""
    if reference is not None and not reference.completions and reference.chat:
        notes.append(
            f"{name}: the reference has no completions API, so the greedy probes go to chat "
            "(one user message, logprobs with top_logprobs), free-running only."
        )
        return "chat"
    return "completions"


async def correctness(ctx: RunContext, engines: Engines, sc: ScenarioSpec) -> CorrectnessResult:
    """The correctness suite: greedy probes on both engines one at a time, the same probes on
    the reference again all at once beside `envelope_load` other requests, then teacher-forced
    scoring when the suite asks for it."""
    cfg = suite_catalogue.get("correctness", **sc.settings)
    assert isinstance(cfg, suite_catalogue.Correctness)
    reference = engines.capabilities.get("reference")
    if reference is not None and not reference.logprobs:
        ctx.notes.append(
            f"{sc.name} skipped: the reference returns no logprobs, so there is nothing to "
            "compare a candidate's numerics with beyond the load scenarios' mirrored outputs."
        )
        empty = CorrectnessRun(sc.name, cfg.max_tokens, [], [], [])
        return CorrectnessResult(empty, divergence_samples(empty, ctx.notes), ctx.spec.policy)
    cfg = adapt_to(cfg, reference, sc.name, ctx.notes, engines.capabilities.get("candidate"))
    api = probe_api(reference, sc.name, ctx.notes)
    if api == "chat":
        cfg = dataclasses.replace(cfg, teacher_forced=False)
    seed = scenario_seed(ctx.spec, sc)
    ctx.gate_phase(f"scenario:{sc.name}", f"{cfg.probes_count} correctness probes")
    ref_t, cand_t = engines.targets("completions")
    ref, cand = await asyncio.gather(
        suite_catalogue.run_correctness(ref_t, scenario=cfg, seed=seed, api=api),
        suite_catalogue.run_correctness(cand_t, scenario=cfg, seed=seed, api=api),
    )
    loaded = await suite_catalogue.run_correctness(
        ref_t, scenario=cfg, seed=seed, concurrent=True, background=cfg.envelope_load, api=api
    )
    run = CorrectnessRun(sc.name, cfg.max_tokens, ref, cand, loaded)
    if cfg.teacher_forced:
        await _teacher_forced(ctx, run, cfg, (ref_t, cand_t), seed)
    engines.check_crashes()
    return CorrectnessResult(run, divergence_samples(run, ctx.notes), ctx.spec.policy)


def correctness_notes(spec: GateSpec) -> list[str]:
    """What the verdict says about the correctness stage the spec asked for (or left out)."""
    added = spec.added_correctness
    if added is not None:
        return [
            f"The spec lists no correctness scenario, so the gate added a short one "
            f"({added.name!r}: the correctness suite's defaults) after the others; "
            "`correctness: off` in the spec leaves it out."
        ]
    if not any(sc.suite == "correctness" for sc in spec.scenarios):
        return [
            "No correctness stage ran (`correctness: off` in the spec): numerical "
            "divergence was judged only from the load scenarios' outputs, for gross "
            "divergence."
        ]
    return []
