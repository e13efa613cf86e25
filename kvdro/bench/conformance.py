"""Benchmark: vLLM's own v1 scheduler against the ``vllm-v1`` preset, step by step (``kvdro.bench conformance``).

The same few hundred requests of the Azure 2023 conversation trace are replayed, with scheduler steps in
place of time, through

* **vLLM's** ``vllm.v1.core.sched.scheduler.Scheduler`` (vLLM 0.11.0, plain Python, no GPU): the script
  :mod:`kvdro.bench._vllm_replay` run by the separate environment ``.venv-vllm`` that
  ``make conformance-install`` builds (pins in ``conformance-requirements.txt``), and
* **ours**: :func:`kvdro.sim.engines.step_trace` with ``engine="vllm-v1"``,

each giving one record per ``schedule()`` call, ``{"step", "scheduled": {id: tokens}, "preempted": [ids],
"finished": [ids]}``. :func:`compare_steps` reports the share of identical steps, the first step that
differs (both records) and each side's preemptions. The main comparison runs with automatic prefix
caching off on both sides; a second one with it on (vLLM's default: a preempted request that is
re-admitted hits its own freed blocks while the pool has not reused them); a third pairs vLLM with it on
and ours with it off (what the preset would miss without it); a negative control gives ours one block
fewer than vLLM (a comparison that cannot tell that apart would prove nothing). The same is done for each of
:data:`VARIANTS` (a smaller pool, a chunk cap, the sequence cap, a smaller budget, sparser arrivals,
a shorter window) unless ``--base-only``; vLLM is imported once for all replays.

The trace (:func:`replay_requests`): the first ``--requests`` requests of ``azure-2023-conv`` whose prompt
plus output fit ``--max-model-len``, arriving at step ``floor((arrival_s - first arrival_s) / step_s)``
(``--step-ms`` per step), with a pool of ``--num-blocks`` blocks small enough that vLLM preempts.

The result is cached in ``data/conformance_vllm_v1.csv`` (one row per variant and prefix-caching pair,
with its manifest; ``--write``) so that the book shows it without vLLM installed (:func:`load_cached`). Without
``.venv-vllm`` the benchmark says how to make it and exits with 2. It is not part of ``make test``: the
import of vLLM alone takes ~10-20 s here; the tests run :func:`compare_steps` on hand-made records.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data"
CACHE = DATA / "conformance_vllm_v1.csv"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
DRIVER = Path(__file__).with_name("_vllm_replay.py")
REMAKE = "make conformance-install && python -m kvdro.bench conformance --write"
RECORD_KEYS = ("step", "scheduled", "preempted", "finished")


@dataclass(frozen=True)
class Settings:
    """The replay: trace cut, step length, and the engine knobs both sides get (vLLM's names).

    ``requests`` [count], ``step_ms`` [ms of trace time per scheduler step], ``num_blocks`` (vLLM's
    ``num_gpu_blocks``: block 0 is vLLM's null block), ``block_size`` [tokens], ``max_num_seqs``,
    ``max_num_batched_tokens`` [tokens per step], ``max_model_len`` [tokens],
    ``long_prefill_token_threshold`` [tokens; 0 = off]. Defaults: vLLM 0.11.0's for an A100
    (``vllm/engine/arg_utils.py``: 2048 tokens per step, 256 sequences), a 4,096-token window and a
    2,048-block pool (32,752 tokens) in which 300 conversation requests arriving 50 ms per step preempt.
    """

    requests: int = 300
    step_ms: float = 50.0
    num_blocks: int = 2048
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    long_prefill_token_threshold: int = 0

    def engine(self, enable_prefix_caching: bool) -> dict:
        """The ``engine`` object of :mod:`kvdro.bench._vllm_replay`'s input."""
        return {"num_gpu_blocks": self.num_blocks, "block_size": self.block_size,
                "max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_model_len": self.max_model_len, "enable_prefix_caching": bool(enable_prefix_caching),
                "long_prefill_token_threshold": self.long_prefill_token_threshold}


@dataclass(frozen=True)
class StepComparison:
    """:func:`compare_steps`' answer. Steps are compared by index; a step one side lacks differs.

    ``share_identical`` = ``identical / compared`` (``compared`` = the longer side's step count);
    ``first_divergence`` is the index of the first differing step (None if none), with both sides'
    records there (None for a side that has no such step) and :func:`describe_difference`'s text.
    """

    steps_ours: int
    steps_theirs: int
    compared: int
    identical: int
    share_identical: float
    first_divergence: int | None
    ours_at_divergence: dict | None
    theirs_at_divergence: dict | None
    difference: str
    preemptions_ours: int
    preemptions_theirs: int
    finished_ours: int
    finished_theirs: int


def check_records(records: Sequence[Mapping], name: str) -> list[dict]:
    """``records`` as plain dicts, checked: keys ``step`` (0, 1, ... in order), ``scheduled`` (id -> int
    >= 1), ``preempted`` and ``finished`` (lists of ids). ValueError names ``name[i].field``."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise ValueError(f"{name}: must be a list of step records, got {type(records).__name__}")
    out = []
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise ValueError(f"{name}[{i}]: must be a dict, got {type(r).__name__}")
        missing = [k for k in RECORD_KEYS if k not in r]
        if missing:
            raise ValueError(f"{name}[{i}]: missing key(s) {missing}")
        if isinstance(r["step"], bool) or r["step"] != i:
            raise ValueError(f"{name}[{i}].step: steps must run 0, 1, 2, ... in order; got {r['step']!r}")
        sched = r["scheduled"]
        if not isinstance(sched, Mapping):
            raise ValueError(f"{name}[{i}].scheduled: must map request ids to token counts")
        for rid, n in sched.items():
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name}[{i}].scheduled[{rid!r}]: must be an integer >= 1, got {n!r}")
        for key in ("preempted", "finished"):
            if isinstance(r[key], (str, bytes, Mapping)) or not isinstance(r[key], Sequence):
                raise ValueError(f"{name}[{i}].{key}: must be a list of request ids")
        out.append({"step": i, "scheduled": {str(k): int(v) for k, v in sched.items()},
                    "preempted": [str(x) for x in r["preempted"]], "finished": [str(x) for x in r["finished"]]})
    return out


def same_step(a: Mapping, b: Mapping) -> bool:
    """Whether two checked records agree: the same tokens for the same requests, the same victims in
    the same order (the order they go back to the waiting queue), the same requests finished (a set:
    their order within a step carries nothing)."""
    return (dict(a["scheduled"]) == dict(b["scheduled"]) and list(a["preempted"]) == list(b["preempted"])
            and sorted(a["finished"]) == sorted(b["finished"]))


def describe_difference(ours: Mapping | None, theirs: Mapping | None) -> str:
    """What differs between two records of one step, in words (``""`` if nothing)."""
    if ours is None or theirs is None:
        return "only vLLM has this step" if ours is None else "only ours has this step"
    parts = []
    so, st = ours["scheduled"], theirs["scheduled"]
    only_o = sorted(set(so) - set(st))
    only_t = sorted(set(st) - set(so))
    diff = sorted(k for k in set(so) & set(st) if so[k] != st[k])
    if only_o:
        parts.append("scheduled only by ours: " + ", ".join(f"{k} ({so[k]} tokens)" for k in only_o))
    if only_t:
        parts.append("scheduled only by vLLM: " + ", ".join(f"{k} ({st[k]} tokens)" for k in only_t))
    if diff:
        parts.append("token counts differ: " + ", ".join(f"{k} ours {so[k]} / vLLM {st[k]}" for k in diff))
    if list(ours["preempted"]) != list(theirs["preempted"]):
        parts.append(f"preempted: ours {list(ours['preempted'])} / vLLM {list(theirs['preempted'])}")
    if sorted(ours["finished"]) != sorted(theirs["finished"]):
        parts.append(f"finished: ours {sorted(ours['finished'])} / vLLM {sorted(theirs['finished'])}")
    return "; ".join(parts)


def compare_steps(ours: Sequence[Mapping], theirs: Sequence[Mapping]) -> StepComparison:
    """Compare two step-by-step replays of one trace (``ours``: the preset, ``theirs``: vLLM).

    Both are lists of records as :func:`check_records` describes (ValueError naming ``ours[i]`` or
    ``theirs[i]`` otherwise). Step ``k`` of one side is compared with step ``k`` of the other
    (:func:`same_step`); the longer replay's extra steps count as differing.
    """
    a = check_records(ours, "ours")
    b = check_records(theirs, "theirs")
    compared = max(len(a), len(b))
    identical = sum(same_step(x, y) for x, y in zip(a, b))
    first = next((k for k in range(compared)
                  if k >= len(a) or k >= len(b) or not same_step(a[k], b[k])), None)
    at_a = a[first] if first is not None and first < len(a) else None
    at_b = b[first] if first is not None and first < len(b) else None
    return StepComparison(
        steps_ours=len(a), steps_theirs=len(b), compared=compared, identical=identical,
        share_identical=identical / compared if compared else 1.0, first_divergence=first,
        ours_at_divergence=at_a, theirs_at_divergence=at_b,
        difference=describe_difference(at_a, at_b) if first is not None else "",
        preemptions_ours=sum(len(r["preempted"]) for r in a), preemptions_theirs=sum(len(r["preempted"]) for r in b),
        finished_ours=sum(len(r["finished"]) for r in a), finished_theirs=sum(len(r["finished"]) for r in b))


def replay_requests(settings: Settings, trace: pd.DataFrame | None = None) -> pd.DataFrame:
    """The replayed requests: the first ``settings.requests`` rows of ``trace`` (default: the Azure 2023
    conversation trace) whose ``input_tokens + output_tokens <= max_model_len``, with ``request_id`` =
    the row's position in the trace and ``arrival_step = floor((arrival_s - first arrival_s) / step_s)``."""
    if settings.requests < 1:
        raise ValueError(f"requests: must be >= 1, got {settings.requests}")
    if not (math.isfinite(settings.step_ms) and settings.step_ms > 0):
        raise ValueError(f"step_ms: must be a positive number of milliseconds, got {settings.step_ms}")
    if trace is None:
        from kvdro.datasets import load_trace

        trace = load_trace("azure-2023-conv")
    trace = trace.reset_index(drop=True)
    fits = trace[trace["input_tokens"] + trace["output_tokens"] <= settings.max_model_len].head(settings.requests)
    if len(fits) < settings.requests:
        raise ValueError(f"requests: only {len(fits)} requests of the trace fit max_model_len "
                         f"{settings.max_model_len}, {settings.requests} asked")
    first = float(fits["arrival_s"].iloc[0])
    # 1e-9 of a step absorbs the round-off of the subtraction (10.05 s - 10.0 s is one 50 ms step, not 0.99999)
    steps = np.floor((fits["arrival_s"].to_numpy(dtype=float) - first) * 1000.0 / settings.step_ms + 1e-9)
    return pd.DataFrame({"request_id": [str(i) for i in fits.index], "arrival_step": steps.astype("int64"),
                         "input_tokens": fits["input_tokens"].to_numpy(dtype="int64"),
                         "output_tokens": fits["output_tokens"].to_numpy(dtype="int64")})


#: Variants of the base settings (each field replaced), each replayed with prefix caching off and on:
#: a pool small enough that requests preempt one another often, a tiny one (150 requests), a per-request
#: chunk cap, the sequence cap binding, a small token budget, sparser arrivals (10 ms per step) and a
#: short window (prompt + output <= 2,048, where vLLM clips a step at ``max_model_len - 1``).
VARIANTS: dict[str, dict] = {
    "base": {},
    "small pool": {"num_blocks": 600},
    "tiny pool": {"num_blocks": 300, "requests": 150},
    "chunk cap 256": {"long_prefill_token_threshold": 256},
    "8 sequences": {"max_num_seqs": 8},
    "budget 512": {"max_num_batched_tokens": 512, "num_blocks": 1024},
    "10 ms steps": {"step_ms": 10.0, "num_blocks": 1024},
    "window 2048": {"max_model_len": 2048, "num_blocks": 800, "max_num_batched_tokens": 1024},
}


def _requests_json(requests: pd.DataFrame) -> list[dict]:
    return [{"request_id": str(r.request_id), "arrival_step": int(r.arrival_step),
             "input_tokens": int(r.input_tokens), "output_tokens": int(r.output_tokens)}
            for r in requests.itertuples(index=False)]


def run_vllm(runs: Sequence[tuple[pd.DataFrame, Settings, bool]], *, python: Path = VLLM_PYTHON) -> dict:
    """Replay each ``(requests, settings, enable_prefix_caching)`` through vLLM's own scheduler
    (:mod:`kvdro.bench._vllm_replay` run by ``python``, vLLM imported once); returns its JSON document
    (``runs[i]["records"]``, versions, import/build/replay seconds)."""
    doc = {"runs": [{"requests": _requests_json(req), "engine": s.engine(caching)} for req, s, caching in runs]}
    proc = subprocess.run([str(python), str(DRIVER)], input=json.dumps(doc), capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"})
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM replay failed (exit {proc.returncode}):\n" + proc.stderr[-3000:])
    return json.loads(proc.stdout)


def run_ours(requests: pd.DataFrame, settings: Settings, *, enable_prefix_caching: bool) -> list[dict]:
    """Replay ``requests`` through the ``vllm-v1`` preset (:func:`kvdro.sim.engines.step_trace`)."""
    from kvdro.sim.engines import step_trace

    return step_trace(requests, engine="vllm-v1", num_blocks=settings.num_blocks, block_size=settings.block_size,
                      max_num_seqs=settings.max_num_seqs, max_num_batched_tokens=settings.max_num_batched_tokens,
                      max_model_len=settings.max_model_len,
                      long_prefill_token_threshold=settings.long_prefill_token_threshold,
                      enable_prefix_caching=enable_prefix_caching)


def result_row(variant: str, cmp: StepComparison, settings: Settings, *, vllm_caching: bool, ours_caching: bool,
               vllm_run: Mapping, ours_s: float, ours_num_blocks: int) -> dict:
    """One row of the cached table: the settings, both sides' counts, the first divergence (records as JSON)."""
    row = {"variant": variant, "vllm_prefix_caching": bool(vllm_caching), "ours_prefix_caching": bool(ours_caching),
           **asdict(settings), "ours_num_blocks": int(ours_num_blocks)}
    row.update({k: v for k, v in asdict(cmp).items() if k not in ("ours_at_divergence", "theirs_at_divergence")})
    row["first_divergence"] = -1 if cmp.first_divergence is None else cmp.first_divergence
    row["ours_record"] = json.dumps(cmp.ours_at_divergence, sort_keys=True)
    row["vllm_record"] = json.dumps(cmp.theirs_at_divergence, sort_keys=True)
    row.update({"vllm_replay_s": vllm_run["replay_s"], "ours_replay_s": round(ours_s, 3)})
    return row


KEY = ("variant", "vllm_prefix_caching", "ours_prefix_caching")
#: The negative control's row: vLLM's base replay against ours given one block fewer (``ours_num_blocks``).
CONTROL = "control: ours 1 block fewer"


def load_cached(path: Path = CACHE) -> pd.DataFrame:
    """The cached comparison (one row per variant and prefix-caching setting), checked against its manifest."""
    from kvdro.cachefile import read_csv_checked

    return read_csv_checked(path, columns=("share_identical", "first_divergence", "preemptions_ours",
                                           "preemptions_theirs", "vllm_version"), key=KEY, remake=REMAKE)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """The cached table (:func:`load_cached`) as the book shows it: one row per comparison, with the
    prefix-caching setting of each side, identical steps (count, share), preemptions on each side and
    the first differing step (empty where none differs)."""
    on_off = {True: "on", False: "off"}
    return pd.DataFrame({
        "variant": table["variant"],
        "prefix caching (vLLM / ours)": [f"{on_off[bool(a)]} / {on_off[bool(b)]}"
                                         for a, b in zip(table["vllm_prefix_caching"], table["ours_prefix_caching"])],
        "identical steps": [f"{i:,} of {c:,}" for i, c in zip(table["identical"], table["compared"])],
        "share": table["share_identical"].map("{:.1%}".format),
        "preemptions (vLLM / ours)": [f"{t} / {o}"
                                      for t, o in zip(table["preemptions_theirs"], table["preemptions_ours"])],
        "first divergence": ["" if k < 0 else f"step {k}" for k in table["first_divergence"]],
    })


def _print(cmp: StepComparison, label: str) -> None:
    print(f"{label:<38} {cmp.identical:>6} / {cmp.compared:<6} {cmp.share_identical:>8.2%} "
          f"{cmp.preemptions_ours:>6} {cmp.preemptions_theirs:>6} {cmp.finished_ours:>5} {cmp.finished_theirs:>5}  "
          + ("-" if cmp.first_divergence is None else str(cmp.first_divergence)))


def _print_divergence(cmp: StepComparison, label: str) -> None:
    if cmp.first_divergence is None:
        return
    print(f"\n{label}: first divergence at step {cmp.first_divergence}: {cmp.difference}")
    print(f"  ours: {json.dumps(cmp.ours_at_divergence, sort_keys=True)}")
    print(f"  vLLM: {json.dumps(cmp.theirs_at_divergence, sort_keys=True)}")


def skip_reason() -> str | None:
    """Why ``python -m kvdro.bench all`` skips this benchmark (vLLM is not installed), or None."""
    if VLLM_PYTHON.exists():
        return None
    return f"{VLLM_PYTHON.parent.parent.name} is missing (`make conformance-install`); the cached result stays"


def main(argv: list[str]) -> int:
    d = Settings()
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench conformance", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=d.requests, help=f"requests replayed (default {d.requests})")
    parser.add_argument("--step-ms", type=float, default=d.step_ms, help=f"trace ms per step (default {d.step_ms:g})")
    parser.add_argument("--num-blocks", type=int, default=d.num_blocks, help=f"KV blocks (default {d.num_blocks})")
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len)
    parser.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold)
    parser.add_argument("--base-only", action="store_true", help="replay the base settings only, not the variants")
    parser.add_argument("--write", action="store_true", help=f"write {CACHE.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    for flag, value in (("--requests", args.requests), ("--num-blocks", args.num_blocks),
                        ("--max-num-seqs", args.max_num_seqs),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens),
                        ("--max-model-len", args.max_model_len)):
        if value < 1:
            parser.error(f"{flag}: must be >= 1, got {value}")
    if not (math.isfinite(args.step_ms) and args.step_ms > 0):
        parser.error(f"--step-ms: must be a positive number, got {args.step_ms}")
    if args.long_prefill_token_threshold < 0:
        parser.error(f"--long-prefill-token-threshold: must be >= 0 (0 = off), got {args.long_prefill_token_threshold}")
    if not VLLM_PYTHON.exists():
        print(f"vLLM's scheduler is not installed: {VLLM_PYTHON.parent.parent.name} is missing. "
              "Run `make conformance-install` (vLLM 0.11.0 and a CPU torch in their own venv, ~2.5 GB), "
              "then this benchmark again.", file=sys.stderr)
        return 2
    base = Settings(requests=args.requests, step_ms=args.step_ms, num_blocks=args.num_blocks,
                    max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                    max_model_len=args.max_model_len,
                    long_prefill_token_threshold=args.long_prefill_token_threshold)
    variants = {name: replace(base, **changes) for name, changes in VARIANTS.items()
                if name == "base" or not args.base_only}
    from kvdro.datasets import load_trace

    full = load_trace("azure-2023-conv")
    requests = {name: replay_requests(s, full) for name, s in variants.items()}
    trace = requests["base"]
    print(f"base: {len(trace)} requests of azure-2023-conv, arrivals over {int(trace['arrival_step'].max()) + 1} "
          f"steps of {base.step_ms:g} ms; {base.num_blocks} blocks of {base.block_size} tokens, budget "
          f"{base.max_num_batched_tokens} tokens, max_num_seqs {base.max_num_seqs}, max_model_len {base.max_model_len}")
    jobs = [(name, caching) for name in variants for caching in (False, True)]
    start = time.perf_counter()
    doc = run_vllm([(requests[name], variants[name], caching) for name, caching in jobs])
    vllm_s = time.perf_counter() - start
    replay_s = sum(r["replay_s"] for r in doc["runs"])
    print(f"vLLM {doc['vllm_version']} (torch {doc['torch_version']}): {vllm_s:.1f} s in all, import "
          f"{doc['import_s']:.1f} s, {len(jobs)} replays {replay_s:.1f} s\n")
    print(f"{'variant, prefix caching vLLM/ours':<38} {'identical steps':>15} {'share':>8} "
          f"{'pre ours':>6} {'vLLM':>6} {'fin':>5} {'vLLM':>5}  first divergence")
    rows, divergences = [], []
    for (name, caching), run in zip(jobs, doc["runs"]):
        pairs = [(name, caching, variants[name])]
        if name == "base" and caching:
            pairs.append((name, False, variants[name]))  # vLLM with its default (caching on), ours without it
        if name == "base" and not caching:  # a control: ours one block short must be told apart
            pairs.append((CONTROL, False, replace(variants[name], num_blocks=variants[name].num_blocks - 1)))
        for label_name, ours_caching, ours_settings in pairs:
            start = time.perf_counter()
            ours = run_ours(requests[name], ours_settings, enable_prefix_caching=ours_caching)
            ours_s = time.perf_counter() - start
            cmp = compare_steps(ours, run["records"])
            label = f"{label_name}, {'on' if caching else 'off'}/{'on' if ours_caching else 'off'}"
            _print(cmp, label)
            divergences.append((cmp, label))
            rows.append(result_row(label_name, cmp, variants[name], vllm_caching=caching, ours_caching=ours_caching,
                                   vllm_run=run, ours_s=ours_s, ours_num_blocks=ours_settings.num_blocks))
    for cmp, label in divergences:
        _print_divergence(cmp, label)
    if args.write:
        from kvdro.cachefile import ensure_writable, write_csv_atomic

        ensure_writable(DATA, f"{DATA} (where this benchmark writes its table)")
        frame = pd.DataFrame(rows).assign(vllm_version=doc["vllm_version"], torch_version=doc["torch_version"])
        path = write_csv_atomic(frame, CACHE, key=KEY)
        print(f"\nwrote {path.relative_to(ROOT)}")
    return 0
