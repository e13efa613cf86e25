"""What is deployed: serving groups (z), routing (pi, with rejection pi_i0), prefix caching (delta).

A :class:`Deployment` is a list of serving groups, each one (TP, PP) configuration of chapter 4, plus,
per request class, the probability of being sent to each group (the rest is rejected) and whether
the class's shared prefix is cached on each group. Routing is **seeded**: each arriving request
draws its group from these probabilities with the caller's ``numpy.random.Generator``.

**Pipeline parallelism.** vLLM's v0 engine runs a PP group as ``pp`` *virtual engines*, each with
its own scheduler and ``1/pp`` of the group's KV blocks, so that ``pp`` micro-batches fill the
pipeline. We model exactly that: a group of configuration (TP, PP) is ``pp`` independent engines,
each with ``M_k / (16 pp)`` blocks, ``max_num_seqs`` sequences and a step as long as one
micro-batch's trip through all stages (:func:`kvdro.hardware.step_time`). This is chapter 4's
reading too (a decode step serves a batch in each of the ``p_k`` micro-batches). vLLM sends a new
request to the virtual engine with the fewest unfinished requests; we send them round-robin in
arrival order, which needs no engine state (so the engines run independently) and balances counts.

Defaults (:func:`default_deployment`): the paper's J = 8 A100-80GB as 2 x TP4-PP1, every class
routed uniformly at random, nothing rejected, no prefix caching.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvdro.hardware import (
    A100_80GB,
    BLOCK_TOKENS,
    GPU,
    LLAMA2_70B,
    Model,
    ParallelConfig,
    kv_capacity_tokens,
)

__all__ = [
    "MAX_NUM_SEQS",
    "MAX_MODEL_LEN",
    "WATERMARK",
    "Deployment",
    "default_deployment",
    "deployment_from_solution",
    "buffers_from_solution",
    "parse_config",
]

#: vLLM's default ``max_num_seqs`` (sequences per running batch).
MAX_NUM_SEQS = 256
#: Context window [tokens]. Llama-2-70B has 4,096 positions; we serve a 70B model with the **same
#: KV shape** (80 layers x 8 KV heads x 128, fp16 -- Llama-3.1-70B has exactly this shape) and a
#: 16,384-token window, so that every Azure 2023 request (prompt + output up to 14,089 tokens) fits.
#: ``max_model_len=4096`` gives Llama-2's own limit (vLLM then ignores longer prompts and caps
#: generation, both counted).
MAX_MODEL_LEN = 16_384
#: vLLM's block-manager watermark: a prompt is admitted only if 1% of the blocks stay free.
WATERMARK = 0.01


def _positive_int(what: str, v) -> int:
    """``v`` as an int >= 1; ValueError naming ``what`` (bools, strings, NaN and fractions refused)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v) or int(v) != v or v < 1:
        raise ValueError(f"{what}: must be a positive integer, got {v!r}")
    return int(v)


def _real(what: str, v) -> float:
    """``v`` as a finite float; ValueError naming ``what``."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v):
        raise ValueError(f"{what}: must be a finite number, got {v!r}")
    return float(v)


def _float_array(what: str, v) -> np.ndarray:
    """``v`` as a 1-D float array of numbers (no strings or bools); ValueError naming ``what``."""
    a = np.asarray(v)
    if a.dtype.kind not in "iuf":
        raise ValueError(f"{what}: must be numbers, got {v!r}")
    return a.astype(float)


def parse_config(name: str | ParallelConfig) -> ParallelConfig:
    """``"TP4-PP1"`` (or a :class:`ParallelConfig`) -> ParallelConfig; ValueError names ``config``."""
    if isinstance(name, ParallelConfig):
        return name
    try:
        tp, pp = str(name).upper().split("-")
        if not (tp.startswith("TP") and pp.startswith("PP")):
            raise ValueError
        return ParallelConfig(int(tp[2:]), int(pp[2:]))
    except (ValueError, TypeError):
        raise ValueError(f"config: expected a name like 'TP4-PP1', got {name!r}") from None


@dataclass(frozen=True, eq=False)
class Deployment:
    """Serving groups, routing and prefix caching (the decision z, pi, delta of (6)).

    Attributes:
        groups: one :class:`~kvdro.hardware.ParallelConfig` per serving group (z_k copies of config k).
        routing: class name -> probabilities over ``groups`` (length = number of groups); their sum
            a_i <= 1 and ``1 - a_i`` is the rejected share pi_i0. A class missing from ``routing``
            uses ``default_routing`` (uniform over the groups if that is ``None``).
        prefix_caching: class name -> one bool per group (delta); missing -> no caching.
        prefix_tokens: class name -> L_pre^i [tokens], the shared prefix (default 0: none).
        slo_s: class name -> D_i [s] (default :func:`kvdro.workload.default_slo_s` of the class's mean output).
        model, gpu: the served model and the accelerator (chapter 4's constants).
        max_num_seqs, max_model_len, watermark: vLLM engine settings (module constants). ``max_model_len``
            unset: the model's context window (``Model.max_context``), except for the book's default
            Llama-2-70B, which serves a 16,384-token window (:data:`MAX_MODEL_LEN`, see there); above another
            model's window it is refused (a prompt beyond the window is never served).
        max_num_batched_tokens: the token budget of a step; ``None`` -> vLLM v0's default without
            chunked prefill, ``max(max_model_len, 2048)``.
    """

    groups: tuple[ParallelConfig, ...]
    routing: Mapping[str, Sequence[float]] = field(default_factory=dict)
    prefix_caching: Mapping[str, Sequence[bool]] = field(default_factory=dict)
    prefix_tokens: Mapping[str, float] = field(default_factory=dict)
    slo_s: Mapping[str, float] = field(default_factory=dict)
    default_routing: Sequence[float] | None = None
    model: Model = LLAMA2_70B
    gpu: GPU = A100_80GB
    max_num_seqs: int = MAX_NUM_SEQS
    max_model_len: int | None = None
    max_num_batched_tokens: int | None = None
    watermark: float = WATERMARK
    name: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.groups, (str, ParallelConfig)) or not isinstance(self.groups, Sequence):
            raise ValueError(f"groups: must be a sequence of configurations like ('TP4-PP1', 'TP4-PP1'), got {self.groups!r}")
        if not isinstance(self.model, Model):
            raise ValueError(f"model: expected a kvdro.hardware.Model, got {type(self.model).__name__}")
        if not isinstance(self.gpu, GPU):
            raise ValueError(f"gpu: expected a kvdro.hardware.GPU, got {type(self.gpu).__name__}")
        groups = []
        for i, g in enumerate(self.groups):
            try:
                cfg = parse_config(g)
                kv_capacity_tokens(self.model, self.gpu, cfg.tp, cfg.pp)  # tp must divide the heads, ...
            except ValueError as exc:
                raise ValueError(f"groups[{i}]: {exc}") from None
            groups.append(cfg)
        if not groups:
            raise ValueError("groups: need at least one serving group")
        object.__setattr__(self, "groups", tuple(groups))
        window = int(self.model.max_context)
        if self.max_model_len is None:  # the model's own window; the book's Llama-2-70B-shaped model: 16,384
            object.__setattr__(self, "max_model_len", MAX_MODEL_LEN if self.model == LLAMA2_70B else window)
        elif (self.model != LLAMA2_70B and not isinstance(self.max_model_len, bool)
              and isinstance(self.max_model_len, (int, np.integer)) and self.max_model_len > window):
            raise ValueError(
                f"max_model_len: {self.max_model_len} tokens is beyond {self.model.name}'s context window of {window} "
                "tokens; a longer prompt must be refused or cut by the window, never served (give max_model_len <= "
                f"{window}, or leave it unset)"
            )
        for what in ("max_num_seqs", "max_model_len"):
            _positive_int(what, getattr(self, what))
        if self.max_num_batched_tokens is not None:
            budget = _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
            # vLLM's SchedulerConfig refuses both at start-up (without chunked prefill): a prompt or a
            # preempted sequence longer than the budget could never be scheduled again.
            if budget < self.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens: {budget} is smaller than max_model_len ({self.max_model_len}); "
                    "without chunked prefill vLLM refuses this (a preempted request could never be re-admitted)"
                )
            if budget < self.max_num_seqs:
                raise ValueError(f"max_num_batched_tokens: {budget} is smaller than max_num_seqs ({self.max_num_seqs})")
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float, np.integer, np.floating)) \
                or not (0 <= self.watermark < 1):
            raise ValueError(f"watermark: must be a number in [0, 1), got {self.watermark!r}")
        if not isinstance(self.name, str):
            raise ValueError(f"name: must be a string, got {self.name!r}")
        n = len(groups)
        for what in ("routing", "prefix_caching", "prefix_tokens", "slo_s"):
            if not isinstance(getattr(self, what), Mapping):
                raise ValueError(f"{what}: must be a mapping from class name to values, got {type(getattr(self, what)).__name__}")
        for cls, probs in self.routing.items():
            self._check_probs(_float_array(f"routing[{cls!r}]", probs), f"routing[{cls!r}]", n)
        if self.default_routing is not None:
            self._check_probs(_float_array("default_routing", self.default_routing), "default_routing", n)
        for cls, flags in self.prefix_caching.items():
            if isinstance(flags, (str, bytes)) or not isinstance(flags, Sequence | np.ndarray) or len(flags) != n:
                raise ValueError(f"prefix_caching[{cls!r}]: need one flag per group ({n}), got {flags!r}")
            if not all(isinstance(f, (bool, np.bool_)) or (isinstance(f, (int, np.integer)) and f in (0, 1)) for f in flags):
                raise ValueError(f"prefix_caching[{cls!r}]: flags must be True/False, got {list(flags)!r}")
        for cls, v in self.prefix_tokens.items():
            v = _real(f"prefix_tokens[{cls!r}]", v)
            if not (v >= 0):
                raise ValueError(f"prefix_tokens[{cls!r}]: must be >= 0, got {v!r}")
            if v > self.max_model_len:
                raise ValueError(f"prefix_tokens[{cls!r}]: a {v:g}-token prefix is longer than max_model_len ({self.max_model_len})")
        for cls, v in self.slo_s.items():
            if not (_real(f"slo_s[{cls!r}]", v) > 0):
                raise ValueError(f"slo_s[{cls!r}]: must be positive, got {v!r}")
        for g in groups:
            blocks = self.engine_blocks(g)
            need = math.ceil(self.max_model_len / BLOCK_TOKENS) + self.watermark_blocks(g) + self.max_prefix_blocks + 1
            if blocks < need and blocks >= need - self.watermark_blocks(g):
                raise ValueError(
                    f"watermark: {self.watermark!r} keeps {self.watermark_blocks(g)} of the {blocks} blocks of one engine "
                    f"of {g.name} free, leaving too few for one {self.max_model_len}-token sequence "
                    f"({need - self.watermark_blocks(g)} blocks with the prefixes); vLLM's default is {WATERMARK}"
                )
            if blocks < need:
                raise ValueError(
                    f"max_model_len: {self.max_model_len} tokens do not fit one engine of {g.name} "
                    f"({blocks} blocks; vLLM refuses to start when the KV cache cannot hold one full-length sequence)"
                )

    @staticmethod
    def _check_probs(p: np.ndarray, what: str, n: int) -> None:
        if p.shape != (n,):
            raise ValueError(f"{what}: need one probability per group ({n}), got shape {p.shape}")
        if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() > 1 + 1e-9:
            raise ValueError(f"{what}: probabilities must be >= 0 with sum <= 1, got {p.tolist()}")

    # -- engine geometry ------------------------------------------------------------------------

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def token_budget(self) -> int:
        """max_num_batched_tokens of a step [tokens]."""
        if self.max_num_batched_tokens is not None:
            return int(self.max_num_batched_tokens)
        return max(self.max_model_len, 2048)

    @property
    def prompt_limit(self) -> int:
        """Longest prompt vLLM v0 accepts without chunked prefill: min(max_model_len, token budget)."""
        return min(self.max_model_len, self.token_budget)

    def engine_blocks(self, config: ParallelConfig) -> int:
        """KV blocks of one micro-batch engine of ``config``: M_k / 16 / pp (chapter 4's capacity)."""
        return kv_capacity_tokens(self.model, self.gpu, config.tp, config.pp) // BLOCK_TOKENS // config.pp

    def watermark_blocks(self, config: ParallelConfig) -> int:
        """vLLM's watermark in blocks: int(0.01 * blocks) of one engine."""
        return int(self.watermark * self.engine_blocks(config))

    @property
    def max_prefix_blocks(self) -> int:
        return sum(int(v) // BLOCK_TOKENS for v in self.prefix_tokens.values())

    def routing_matrix(self, classes: Sequence[str]) -> np.ndarray:
        """Probabilities, shape (len(classes), groups + 1): column 0 = rejected, then one per group."""
        n = len(self.groups)
        out = np.zeros((len(classes), n + 1))
        for i, c in enumerate(classes):
            if c in self.routing:
                p = np.asarray(self.routing[c], dtype=float)
            elif self.default_routing is not None:
                p = np.asarray(self.default_routing, dtype=float)
            else:
                p = np.full(n, 1.0 / n)
            out[i, 1:] = p
            out[i, 0] = max(0.0, 1.0 - p.sum())
        return out

    def describe(self) -> str:
        counts = pd.Series([g.name for g in self.groups]).value_counts(sort=False)
        return f"{self.name or 'deployment'}: " + " + ".join(f"{v} x {k}" for k, v in counts.items()) + f" ({self.total_gpus} GPUs)"


def default_deployment(trace: pd.DataFrame | None = None, *, config: str | ParallelConfig = "TP4-PP1",
                       groups: int | None = None, total_gpus: int = 8, **settings) -> Deployment:
    """The documented default: the paper's J = 8 A100-80GB as ``total_gpus // gpus(config)`` groups of
    ``config`` (2 x TP4-PP1), every class routed uniformly, nothing rejected, no prefix caching.

    ``trace`` is accepted for symmetry (the default does not depend on it). ``groups`` overrides the
    number of groups; ``settings`` are passed to :class:`Deployment` (``max_model_len``, ...).
    """
    cfg = parse_config(config)
    if groups is None and cfg.gpus > total_gpus:
        raise ValueError(f"config: {cfg.name} needs {cfg.gpus} GPUs, more than the {total_gpus} of the deployment")
    z = total_gpus // cfg.gpus if groups is None else groups
    if isinstance(z, bool) or int(z) != z or z < 1:
        raise ValueError(f"groups: must be a positive integer (and config {cfg.name} must fit {total_gpus} GPUs), got {z!r}")
    return Deployment(groups=(cfg,) * int(z), name="default", **settings)


def deployment_from_solution(instance, solution, **settings) -> Deployment:
    """The decision of a :class:`kvdro.joint.Solution` as a deployment: z_k groups of each config k,
    class i sent to a group of config k with probability pi_ik / z_k (rejected with pi_i0), the
    class's prefix L_pre^i cached on the groups of k where delta_ik = 1, SLO D_i from the instance.

    The reservations r_i are not part of the deployment: :func:`buffers_from_solution` gives them
    as buffers for :func:`kvdro.sim.simulate`. ``settings`` go to :class:`Deployment`.
    """
    z = np.asarray(solution.z, dtype=int)
    if z.shape != (instance.n_configs,):
        raise ValueError(f"solution: z has shape {z.shape}, the instance has {instance.n_configs} configurations")
    groups, owner = [], []
    for k, cfg in enumerate(instance.configs):
        for _ in range(int(z[k])):
            groups.append(cfg.config)
            owner.append(k)
    if not groups:
        raise ValueError("solution: deploys no serving group (z = 0)")
    owner = np.array(owner)
    routing, caching, prefix, slo = {}, {}, {}, {}
    for i, c in enumerate(instance.classes):
        routing[c.name] = [float(solution.pi[i, k]) / z[k] for k in owner]
        caching[c.name] = [bool(solution.delta[i, k]) for k in owner]
        prefix[c.name] = float(c.prefix_tokens)
        slo[c.name] = float(c.slo_s)
    settings.setdefault("model", instance.model)
    return Deployment(groups=tuple(groups), routing=routing, prefix_caching=caching, prefix_tokens=prefix,
                      slo_s=slo, name=f"{solution.method or 'solution'} on {instance.name or 'instance'}", **settings)


def buffers_from_solution(instance, solution) -> dict[str, float]:
    """Class name -> buffer eta_i = r_i - L_in^i [tokens] of a solution (clipped at 0)."""
    return {c.name: max(0.0, float(solution.r[i] - instance.input_tokens[i])) for i, c in enumerate(instance.classes)}
