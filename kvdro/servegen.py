"""A DeepSeek-R1 reasoning workload drawn from ServeGen's published per-client statistics.

ServeGen (Xiang et al., 2025; ``alibaba/ServeGen``, folder ``data/reason/deepseek-r1``) publishes, for
each of 73 clients of Alibaba Cloud Model Studio's DeepSeek-R1 service, two files (registered with their
sha256 in :data:`kvdro.datasets.SERVEGEN_R1_SHA256`, located by :func:`kvdro.datasets.servegen_r1_files`):

* ``chunk-N-trace.csv`` -- one row ``t, rate, cv, family, shape, scale`` per 600-s window of one day
  (144 rows, no header): the request rate [req/s], the coefficient of variation of the inter-arrival
  times, and the fitted inter-arrival law (``Gamma`` or ``Weibull`` with its shape and scale; empty
  where the client sent nothing).
* ``chunk-N-dataset.json`` -- per 6-hour window (keys ``"0"``, ``"21600"``, ...), ``input_tokens``,
  ``output_tokens`` and ``reason_ratio``, each a string holding a Python dict ``{value: probability}``
  (parsed with :func:`ast.literal_eval`, never ``eval``).

:func:`servegen_r1` draws a trace from them:

* **Arrivals**: in every 600-s window, each active client is a renewal process started at the window's
  start, with inter-arrival times from its fitted family and *shape* (which sets the CV: Gamma
  ``1/sqrt(shape)``) and the scale that makes the mean inter-arrival time ``1 / (rate * rate_scale)``.
  The published scale is not used: its mean, ``shape * scale`` for Gamma, differs from ``1 / rate`` by
  a factor 0.08-2.3 across windows (median 0.99); ServeGen's own sampler likewise rescales its draws to
  the window's rate (``servegen/construct.py``, ``_sample_iats``).
* **Lengths**: each request's input and output lengths are drawn *independently*, each from its
  client's distribution of the 6-hour window holding the arrival. The joint law is not published;
  ServeGen's sampler draws every field with one shared random number, which makes the input and
  output perfectly rank-correlated -- we do not copy that.
* ``reason_ratio`` (the reasoning share of an output) is parsed and checked but not drawn.

Days repeat: a trace longer than 86,400 s, or starting late in the day, wraps around to window 0.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

__all__ = [
    "WINDOW_S",
    "DAY_S",
    "DATASET_WINDOW_S",
    "ServeGenClient",
    "read_servegen_trace",
    "read_servegen_dataset",
    "load_servegen_r1",
    "servegen_r1",
    "servegen_r1_lengths",
]

#: Length of a ServeGen rate window [s] (the trace files' rows).
WINDOW_S = 600
#: One day [s]: the traces' 144 windows.
DAY_S = 86_400
#: Length of a ServeGen length-distribution window [s] (the dataset files' keys).
DATASET_WINDOW_S = 21_600
#: Fields every dataset window holds; the first two are drawn.
DATASET_FIELDS = ("input_tokens", "output_tokens", "reason_ratio")
#: Tolerance on a distribution's total probability.
PROB_SUM_TOL = 1e-6
_FAMILIES = ("Gamma", "Weibull")


@dataclass(frozen=True)
class Distribution:
    """A discrete law: sorted ``values`` with ``cdf`` (the last entry exactly 1)."""

    values: np.ndarray
    cdf: np.ndarray

    def draw(self, u: np.ndarray) -> np.ndarray:
        """Inverse-CDF draw for uniforms ``u`` in [0, 1)."""
        return self.values[np.searchsorted(self.cdf, u, side="right")]

    def probabilities(self) -> np.ndarray:
        return np.diff(self.cdf, prepend=0.0)


@dataclass(frozen=True)
class ServeGenClient:
    """One client's statistics.

    Attributes:
        client: the client number N of ``chunk-N-*``.
        rate: request rate per 600-s window [req/s], shape (144,); 0 where the client sent nothing.
        cv: inter-arrival coefficient of variation per window (as published).
        family: ``"Gamma"``, ``"Weibull"`` or ``""`` per window.
        shape, scale: the fitted law's parameters per window (NaN where inactive).
        inputs, outputs: ``{window start [s]: Distribution}`` of the 6-hour windows with data.
    """

    client: int
    rate: np.ndarray
    cv: np.ndarray
    family: tuple[str, ...]
    shape: np.ndarray
    scale: np.ndarray
    inputs: dict[int, Distribution]
    outputs: dict[int, Distribution]

    def lengths_at(self, t_day: int) -> tuple[Distribution, Distribution]:
        """(input, output) laws of the 6-hour window holding second ``t_day`` of the day."""
        w = t_day // DATASET_WINDOW_S * DATASET_WINDOW_S
        return self.inputs[w], self.outputs[w]


def _number(text: str, p: Path, line: int, field: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{p}: line {line}: field {field!r} is not a number: {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise ValueError(f"{p}: line {line}: field {field!r} must be finite and >= 0, got {text!r}")
    return x


def read_servegen_trace(path: str | Path) -> dict[str, np.ndarray | tuple[str, ...]]:
    """Parse a ``chunk-N-trace.csv``: 144 rows ``t, rate, cv, family, shape, scale`` (no header).

    Returns ``{"rate", "cv", "shape", "scale"}`` float arrays (144,) and ``"family"`` (tuple of str).

    Raises:
        ValueError: naming the file, line and field: not 6 fields, ``t`` not ``600 * (line - 1)``, a
            negative or non-finite number, an unknown family, an active window (rate > 0) without a
            family, or a family whose shape or scale is not positive.
    """
    p = Path(path)
    lines = p.read_text(encoding="utf-8").splitlines()
    n = DAY_S // WINDOW_S
    if len(lines) != n:
        raise ValueError(f"{p}: has {len(lines)} lines; expected {n} (one per {WINDOW_S}-s window of a day)")
    rate, cv, shape, scale = (np.full(n, np.nan) for _ in range(4))
    family: list[str] = []
    for i, text in enumerate(lines):
        line = i + 1
        parts = text.strip().split(",")
        if len(parts) != 6:
            raise ValueError(f"{p}: line {line}: has {len(parts)} fields; expected 6 (t, rate, cv, family, shape, scale)")
        if _number(parts[0], p, line, "t") != i * WINDOW_S:
            raise ValueError(f"{p}: line {line}: field 't' is {parts[0]!r}; expected {i * WINDOW_S}")
        rate[i] = _number(parts[1], p, line, "rate")
        cv[i] = _number(parts[2], p, line, "cv")
        fam = parts[3]
        if fam not in ("", *_FAMILIES):
            raise ValueError(f"{p}: line {line}: field 'family' is {fam!r}; expected one of {_FAMILIES} or empty")
        if rate[i] > 0 and not fam:
            raise ValueError(f"{p}: line {line}: field 'family' is empty but the rate is {rate[i]} req/s")
        if fam:
            for j, field in ((4, "shape"), (5, "scale")):
                x = _number(parts[j], p, line, field)
                if not x > 0:
                    raise ValueError(f"{p}: line {line}: field {field!r} of the {fam} law must be > 0, got {parts[j]!r}")
            shape[i], scale[i] = float(parts[4]), float(parts[5])
        family.append(fam)
    return {"rate": rate, "cv": cv, "family": tuple(family), "shape": shape, "scale": scale}


def _distribution(text: object, p: Path, where: str, field: str) -> Distribution | None:
    """A ``{value: probability}`` string as a Distribution (None if empty), checked."""
    if not isinstance(text, str):
        raise ValueError(f"{p}: {where} field {field!r} must be a string holding a dict, got {type(text).__name__}")
    try:
        pmf = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ValueError(f"{p}: {where} field {field!r} is not a Python dict literal ({type(exc).__name__})") from None
    if not isinstance(pmf, dict):
        raise ValueError(f"{p}: {where} field {field!r} is not a dict {{value: probability}}")
    if not pmf:
        return None
    values, probs = list(pmf.keys()), list(pmf.values())
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in values + probs):
        raise ValueError(f"{p}: {where} field {field!r} has a key or probability that is not a number")
    v, q = np.asarray(values, dtype=float), np.asarray(probs, dtype=float)
    if not (np.isfinite(q).all() and (q >= 0).all()):
        raise ValueError(f"{p}: {where} field {field!r} has a negative or non-finite probability")
    if abs(q.sum() - 1.0) > PROB_SUM_TOL:
        raise ValueError(f"{p}: {where} field {field!r}: probabilities sum to {q.sum():.9g}, not 1")
    if field == "reason_ratio":
        if not (np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()):
            raise ValueError(f"{p}: {where} field {field!r} has a ratio outside [0, 1]")
    else:
        low = 1 if field == "input_tokens" else 0
        if any(isinstance(x, float) for x in values) or (v[q > 0] < low).any() or (v > 2**53).any():
            raise ValueError(f"{p}: {where} field {field!r} has a token count that is not an integer in [{low}, 2^53]")
    order = np.argsort(v, kind="stable")
    v, q = v[order], q[order]
    keep = q > 0
    cdf = np.cumsum(q[keep]) / q.sum()
    cdf[-1] = 1.0
    return Distribution(v[keep].astype(np.int64), cdf)


def read_servegen_dataset(path: str | Path) -> tuple[dict[int, Distribution], dict[int, Distribution]]:
    """Parse a ``chunk-N-dataset.json``: the input and output length laws per 6-hour window.

    Returns ``(inputs, outputs)``, each ``{window start [s]: Distribution}`` over the windows with data
    (a window whose three fields are all empty dicts is absent).

    Raises:
        ValueError: naming the file, window and field: not JSON, a window key that is not a multiple of
            21,600 within the day, a missing field, a string that is not a dict literal, a non-number, a
            negative probability, probabilities not summing to 1 (within 1e-6), a token count that is
            not an integer (inputs >= 1), a ratio outside [0, 1], or some fields empty and others not.
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a JSON object keyed by window start")
    inputs: dict[int, Distribution] = {}
    outputs: dict[int, Distribution] = {}
    for key, fields in raw.items():
        where = f"window {key!r}:"
        if not (isinstance(key, str) and key.isdigit() and int(key) % DATASET_WINDOW_S == 0 and int(key) < DAY_S):
            raise ValueError(f"{p}: window key {key!r} is not a multiple of {DATASET_WINDOW_S} s within the day")
        if not isinstance(fields, dict):
            raise ValueError(f"{p}: {where} expected an object with fields {DATASET_FIELDS}")
        missing = [f for f in DATASET_FIELDS if f not in fields]
        if missing:
            raise ValueError(f"{p}: {where} missing field(s) {missing}")
        laws = {f: _distribution(fields[f], p, where, f) for f in DATASET_FIELDS}
        empty = [f for f, d in laws.items() if d is None]
        if empty and len(empty) < len(DATASET_FIELDS):
            raise ValueError(f"{p}: {where} field(s) {empty} are empty while the others are not")
        if not empty:
            inputs[int(key)], outputs[int(key)] = laws["input_tokens"], laws["output_tokens"]
    return inputs, outputs


@functools.lru_cache(maxsize=1)
def _load(files: tuple[tuple[str, Path], ...]) -> tuple[ServeGenClient, ...]:
    paths = dict(files)
    numbers = sorted({int(name.split("-")[1]) for name in paths})
    clients = []
    for n in numbers:
        trace_path, data_path = paths[f"chunk-{n}-trace.csv"], paths[f"chunk-{n}-dataset.json"]
        tr = read_servegen_trace(trace_path)
        inputs, outputs = read_servegen_dataset(data_path)
        for i in np.flatnonzero(tr["rate"] > 0):
            w = int(i) * WINDOW_S // DATASET_WINDOW_S * DATASET_WINDOW_S
            if w not in inputs:
                raise ValueError(f"{data_path}: window {str(w)!r} has no length distributions, but "
                                 f"{trace_path} line {int(i) + 1} has rate {tr['rate'][i]} req/s")
        clients.append(ServeGenClient(n, tr["rate"], tr["cv"], tr["family"], tr["shape"], tr["scale"],
                                      inputs, outputs))
    return tuple(clients)


def load_servegen_r1() -> tuple[ServeGenClient, ...]:
    """The 73 clients' statistics, hash-checked (:func:`kvdro.datasets.servegen_r1_files`) and parsed
    (memoised in the process: parsing the length laws with ``ast.literal_eval`` takes seconds)."""
    from kvdro.datasets import servegen_r1_files

    return _load(tuple(servegen_r1_files().items()))


def _interarrival_scale(family: str, shape: float, mean_s: float) -> float:
    """Scale of the ``family`` law with ``shape`` whose mean is ``mean_s`` [s]."""
    if family == "Gamma":
        return mean_s / shape
    return mean_s / special.gamma(1.0 + 1.0 / shape)


def _renewal(family: str, shape: float, rate: float, length_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, length_s) of a renewal process started at 0 with the given law and rate."""
    scale = _interarrival_scale(family, shape, 1.0 / rate)
    expected = rate * length_s
    chunks, t0 = [], 0.0
    while True:
        n = int(expected + 4.0 * math.sqrt(expected) + 16)
        iat = rng.gamma(shape, scale, n) if family == "Gamma" else scale * rng.weibull(shape, n)
        t = t0 + np.cumsum(iat)
        chunks.append(t[t < length_s])
        if t[-1] >= length_s:
            return np.concatenate(chunks)
        t0 = t[-1]


def _check_args(duration_s: object, rate_scale: object, rng: object, start_s: object) -> None:
    for name, x, positive in (("duration_s", duration_s, True), ("rate_scale", rate_scale, True),
                              ("start_s", start_s, False)):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)) \
                or not math.isfinite(x) or (x <= 0 if positive else x < 0):
            raise ValueError(f"{name}: must be a finite number {'> 0' if positive else '>= 0'}, got {x!r}")
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: must be a seeded numpy.random.Generator, got {type(rng).__name__}")


def servegen_r1(duration_s: float, *, rate_scale: float = 1.0, rng: np.random.Generator,
                start_s: float = 0.0) -> pd.DataFrame:
    """A DeepSeek-R1 reasoning trace drawn from ServeGen's statistics (see the module docstring).

    Args:
        duration_s: length of the trace [s] (more than a day repeats the day).
        rate_scale: factor on every client's published rate (1: production, about 1.38 M requests a day,
            16 req/s on average).
        rng: a seeded Generator (every draw comes from it, in window then client order).
        start_s: second of the day the trace starts at (0: midnight of ServeGen's day).

    Returns:
        The tidy schema of :mod:`kvdro.datasets` (``arrival_s`` from the first request,
        ``input_tokens``, ``output_tokens`` [tokens], ``request_class`` ``"reasoning"``) plus ``client``
        (ServeGen's client number), sorted by arrival; ``attrs``: ``source`` ``"servegen-r1"``,
        ``start_s``, ``duration_s``, ``rate_scale``, ``first_arrival_s`` (seconds after ``start_s``).

    Raises:
        ValueError: naming the argument; or naming the file and field of a malformed statistics file.
    """
    _check_args(duration_s, rate_scale, rng, start_s)
    clients = load_servegen_r1()
    end_s = float(start_s) + float(duration_s)
    times, inputs, outputs, who = [], [], [], []
    for k in range(int(start_s // WINDOW_S), math.ceil(end_s / WINDOW_S)):
        w0, w = k * WINDOW_S, k % (DAY_S // WINDOW_S)
        for c in clients:
            if not c.rate[w] > 0:
                continue
            t = w0 + _renewal(c.family[w], float(c.shape[w]), float(c.rate[w]) * rate_scale, WINDOW_S, rng)
            t = t[(t >= start_s) & (t < end_s)]
            if t.size == 0:
                continue
            law_in, law_out = c.lengths_at(w * WINDOW_S)
            inputs.append(law_in.draw(rng.random(t.size)))
            outputs.append(law_out.draw(rng.random(t.size)))
            times.append(t)
            who.append(np.full(t.size, c.client, dtype=np.int16))
    if not times:
        raise ValueError(f"duration_s: no client sent a request in [{start_s}, {end_s}) s at rate_scale {rate_scale}")
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    t = t[order]
    df = pd.DataFrame({
        "arrival_s": t - t[0],
        "input_tokens": np.concatenate(inputs)[order],
        "output_tokens": np.concatenate(outputs)[order],
        "request_class": pd.Series(np.full(t.size, "reasoning", dtype=object), dtype=object),
        "client": np.concatenate(who)[order],
    })
    df.attrs.update({"source": "servegen-r1", "start_s": float(start_s), "duration_s": float(duration_s),
                     "rate_scale": float(rate_scale), "first_arrival_s": float(t[0] - start_s)})
    return df


def servegen_r1_lengths(field: str = "output_tokens") -> tuple[np.ndarray, np.ndarray]:
    """The day's length law over all clients: ``(values, probabilities)``, each client-window's
    distribution weighted by its expected request count (rate x 600 s). It is the law a long trace's
    lengths converge to, and the one ServeGen's README figures describe (outputs: mean ~1,527,
    median ~792, p90 ~3,432, p99 ~12,607, max 32,768).

    Raises:
        ValueError: ``field`` not ``"input_tokens"`` or ``"output_tokens"``.
    """
    if field not in ("input_tokens", "output_tokens"):
        raise ValueError(f"field: must be 'input_tokens' or 'output_tokens', got {field!r}")
    values, weights = [], []
    for c in load_servegen_r1():
        active = np.flatnonzero(c.rate > 0)
        requests = c.rate[active] * WINDOW_S
        per_law = np.bincount(active * WINDOW_S // DATASET_WINDOW_S, weights=requests)
        for j in np.flatnonzero(per_law):
            law = c.lengths_at(int(j) * DATASET_WINDOW_S)[0 if field == "input_tokens" else 1]
            values.append(law.values)
            weights.append(per_law[j] * law.probabilities())
    v, inverse = np.unique(np.concatenate(values), return_inverse=True)
    w = np.bincount(inverse, weights=np.concatenate(weights))
    return v, w / w.sum()
