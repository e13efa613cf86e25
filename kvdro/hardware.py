"""The serving model of a GPU and a model: KV capacity, effective (C_k, B_k), step times.

Models and GPUs are data, looked up by name (:data:`MODELS`, :data:`GPUS`): Llama-2-70B (the book's
primary model), Llama-3.1-70B, DeepSeek-R1-Distill-Llama-70B, Llama-3-8B, Llama-2-7B and Qwen-72B on
the A100-80GB and H100-80GB (and the H200-141GB, spec only). Everything is derived from first
principles -- bytes moved and FLOPs executed -- plus a small number of *achieved-efficiency*
constants per GPU, fitted to real measurements (Vidur's profiles, :cite:`agrawal2024vidur`) and
re-checked by ``tests/test_hardware.py`` (A100) and ``tests/test_hardware_models.py`` (H100, and the
error of the step time against every profiled (GPU, model) pair, :func:`step_time_error_table`):

* a linear operator (a GEMM ``[m, k] @ [k, n]``) takes
  ``t0 + max(FLOPs / (eta_c * peak), bytes / (eta_m * HBM bandwidth))`` -- a roofline max -- where the
  FLOPs are counted with ``m`` rounded up to the GEMM tile (tensor-core tiles waste work on a
  partial tile), ``eta_c``/``eta_m`` are the achieved fractions of peak and ``t0`` a per-kernel
  overhead (launch, tail effect);
* an all-reduce of ``S`` bytes over ``n`` GPUs (ring) takes ``lat + 2 (n-1)/n * S / (eta_nv * NVLink)``;
* attention in decode reads every cached K and V byte once: ``KV bytes / (eta_attn * bandwidth)``;
* a step may mix prefill chunks and decodes (:func:`mixed_step_time`, :func:`mixed_step_times`,
  :func:`mixed_step_table`): the token-proportional operators run once on all its tokens.

Units: bytes, seconds, FLOP, FLOP/s, bytes/s, tokens. Equation numbers refer to
Cheng, Do, Nguyen (arXiv 2607.16892).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "GPU",
    "Model",
    "ParallelConfig",
    "OperatingPoint",
    "MAX_NUM_SEQS",
    "REFERENCE_INPUT_TOKENS",
    "REFERENCE_OUTPUT_TOKENS",
    "REFERENCE_UTILISATION",
    "LMDEPLOY_TP4_DECODE",
    "LMDEPLOY_TP4_THROUGHPUT",
    "LMDEPLOY_SHAREGPT_TOKENS",
    "decode_operating_point",
    "fit_attention_efficiency",
    "ConfigPerformance",
    "A100_80GB",
    "H100_80GB",
    "H200_141GB",
    "LLAMA2_70B",
    "LLAMA31_70B",
    "R1_DISTILL_LLAMA_70B",
    "LLAMA3_8B",
    "LLAMA2_7B",
    "QWEN_72B",
    "MODELS",
    "GPUS",
    "model_by_name",
    "gpu_by_name",
    "check_deployment",
    "deployments_that_fit",
    "mixed_step_time",
    "mixed_step_times",
    "MixedStepTable",
    "mixed_step_table",
    "VIDUR_PROFILES",
    "VIDUR_ALLREDUCE",
    "VIDUR_LAYER_OPS",
    "ERROR_BUCKETS",
    "step_time_errors",
    "step_time_error_table",
    "PAPER_CONFIGS",
    "BLOCK_TOKENS",
    "GPU_MEMORY_UTILIZATION",
    "ACTIVATION_RESERVE_BYTES",
    "DEFAULT_DECODE_BATCH",
    "weight_bytes",
    "kv_bytes_per_token",
    "kv_capacity_tokens",
    "prefill_flops_per_token",
    "linear_operators",
    "linear_op_time",
    "elementwise_op_time",
    "layer_linear_times",
    "allreduce_time",
    "config_performance",
    "configs_for",
    "step_time",
    "VIDUR_LINEAR_OPS",
    "read_vidur_linear",
    "read_vidur_allreduce",
    "predict_linear",
    "predict_allreduce",
    "calibrate",
]


@dataclass(frozen=True)
class GPU:
    """One accelerator: capacities at peak plus achieved-efficiency constants (fitted, see module doc).

    ``hbm_bytes`` (bytes), ``hbm_bandwidth`` (bytes/s), ``peak_flops`` (FLOP/s, dense bf16/fp16 tensor
    core), ``nvlink_bandwidth`` (bytes/s per direction). The ``*_efficiency`` fields are the fractions
    of the peak figures that real kernels reach; ``kernel_overhead_s`` is added once per kernel;
    ``gemm_tile`` (tokens) is the tile to which the row count of a GEMM is rounded up;
    ``attention_efficiency`` is the fraction of HBM bandwidth decode attention reaches when it reads
    the cached K/V (``None``: the same as the GEMMs' ``hbm_efficiency``). ``spec_only`` marks a GPU
    with no measured profile of its own: its capacities are the datasheet's and its efficiencies are
    borrowed from a measured GPU of the same architecture (:data:`H200_141GB`).
    """

    name: str
    hbm_bytes: int
    hbm_bandwidth: float
    peak_flops: float
    nvlink_bandwidth: float
    hbm_efficiency: float = 1.0
    compute_efficiency: float = 1.0
    kernel_overhead_s: float = 0.0
    gemm_tile: int = 1
    nvlink_efficiency: float = 1.0
    allreduce_latency_s: float = 0.0
    attention_efficiency: float | None = None
    spec_only: bool = False

    def __post_init__(self) -> None:
        for field in ("hbm_bytes", "hbm_bandwidth", "peak_flops", "nvlink_bandwidth"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{field} must be a positive finite number, got {value!r}")
        for field in ("hbm_efficiency", "compute_efficiency", "nvlink_efficiency", "attention_efficiency"):
            value = getattr(self, field)
            if field == "attention_efficiency" and value is None:
                continue
            if not (0 < value <= 1):
                raise ValueError(f"{field} must be in (0, 1], got {value!r}")
        for field in ("kernel_overhead_s", "allreduce_latency_s"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{field} must be a non-negative finite number, got {value!r}")
        if int(self.gemm_tile) != self.gemm_tile or self.gemm_tile < 1:
            raise ValueError(f"gemm_tile must be a positive integer, got {self.gemm_tile!r}")

    def at_peak(self) -> GPU:
        """The same GPU with every efficiency 1 and no overheads: the textbook roofline."""
        return replace(
            self,
            hbm_efficiency=1.0,
            compute_efficiency=1.0,
            kernel_overhead_s=0.0,
            gemm_tile=1,
            nvlink_efficiency=1.0,
            allreduce_latency_s=0.0,
            attention_efficiency=None,
        )

    @property
    def attention_bandwidth(self) -> float:
        """Bytes/s at which decode attention reads the cached K/V: ``attention_efficiency`` (default:
        ``hbm_efficiency``) times the HBM bandwidth."""
        eff = self.hbm_efficiency if self.attention_efficiency is None else self.attention_efficiency
        return eff * self.hbm_bandwidth


@dataclass(frozen=True)
class Model:
    """A dense decoder-only transformer (Llama family: gated MLP, grouped-query attention).

    ``ffn`` is the width of *one* of the gated MLP's gate/up projections; ``n_kv_heads == n_heads``
    is a model without grouped-query attention; ``max_context`` is the context window (the engine's
    ``max_model_len`` default: prompt + output tokens one sequence may hold) [tokens].
    """

    name: str
    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_params: int
    dtype_bytes: int
    vocab: int
    max_context: int = 4096

    def __post_init__(self) -> None:
        for field in ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "head_dim", "n_params", "dtype_bytes", "vocab", "max_context"):
            value = getattr(self, field)
            if int(value) != value or value < 1:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")


# A100-SXM4-80GB. Sources: NVIDIA A100 Tensor Core GPU datasheet (2021): 80 GB HBM2e, 2,039 GB/s,
# 312 TFLOP/s dense BF16/FP16 tensor core; third-generation NVLink 600 GB/s total = 300 GB/s per
# direction. "80 GB" is 80 GiB of HBM (81,920 MiB as nvidia-smi reports).
# Efficiencies: `calibrate` fitted to Vidur's A100 profiles (llama2-70b-mlp.csv, TP in {1, 2};
# all_reduce_a100_dgx.csv, 2 and 4 GPUs in one node); tests/test_hardware.py re-fits and compares.
A100_80GB = GPU(
    name="A100-SXM4-80GB",
    hbm_bytes=80 * 2**30,
    hbm_bandwidth=2.039e12,
    peak_flops=312e12,
    nvlink_bandwidth=300e9,
    hbm_efficiency=0.775,  # fitted: 1.58 TB/s achieved by memory-bound GEMMs
    compute_efficiency=0.753,  # fitted: 235 TFLOP/s achieved by large GEMMs
    kernel_overhead_s=4.8e-6,  # fitted: per-kernel launch/tail overhead
    gemm_tile=128,  # assumption: rows of a GEMM are padded to a 128-row tensor-core tile
    nvlink_efficiency=0.597,  # fitted: ring all-reduce bus bandwidth 179 GB/s
    allreduce_latency_s=51e-6,  # fitted: NCCL all-reduce fixed cost
    attention_efficiency=0.39,  # fitted (fit_attention_efficiency): decode attention reads K/V at 0.80 TB/s
)

# Llama-2-70B. Source: Hugging Face meta-llama/Llama-2-70b-hf config.json (num_hidden_layers 80,
# hidden_size 8192, intermediate_size 28672, num_attention_heads 64, num_key_value_heads 8,
# vocab_size 32000, torch_dtype float16); head_dim = 8192 / 64 = 128. Parameter count
# 68,976,648,192 = 80 layers x (4 attention + 3 MLP matrices + 2 norms) + embedding + LM head + norm,
# computed by `_llama_params` below and checked by the tests.
def _llama_params(n_layers: int, hidden: int, ffn: int, n_heads: int, n_kv_heads: int, head_dim: int, vocab: int) -> int:
    attn = hidden * n_heads * head_dim * 2 + hidden * n_kv_heads * head_dim * 2  # q, o; k, v
    mlp = 3 * hidden * ffn  # gate, up, down
    norms = 2 * hidden
    return n_layers * (attn + mlp + norms) + 2 * vocab * hidden + hidden


LLAMA2_70B = Model(
    name="Llama-2-70B",
    n_layers=80,
    hidden=8192,
    ffn=28672,
    n_heads=64,
    n_kv_heads=8,
    head_dim=128,
    n_params=_llama_params(80, 8192, 28672, 64, 8, 128, 32000),
    dtype_bytes=2,
    vocab=32000,
    max_context=4096,  # config.json max_position_embeddings
)

# ---------------------------------------------------------------------------------------------------
# More models and GPUs (issue 33). Every shape is the model's Hugging Face config.json; Vidur's profile
# of each (../shared/data/vidur-profiling, columns n_head, n_kv_head, n_embd, n_expanded_embd) has the
# same shapes (its vocab_size is padded: 32,768 for Llama-2, unused by the profiled operators).
# ---------------------------------------------------------------------------------------------------

# Llama-3.1-70B. Source: meta-llama/Llama-3.1-70B config.json: the shapes of Llama-2-70B (80 layers,
# hidden 8192, intermediate 28672, 64 heads, 8 KV heads of 128) with vocab_size 128256,
# max_position_embeddings 131072, torch_dtype bfloat16. 70,553,706,496 parameters (HF: 70.6 B).
# Vidur's profile is of Meta-Llama-3-70B (8,192-token window), whose shapes are these.
LLAMA31_70B = Model(
    name="Llama-3.1-70B", n_layers=80, hidden=8192, ffn=28672, n_heads=64, n_kv_heads=8, head_dim=128,
    n_params=_llama_params(80, 8192, 28672, 64, 8, 128, 128256), dtype_bytes=2, vocab=128256,
    max_context=131072,
)
# DeepSeek-R1-Distill-Llama-70B. Source: deepseek-ai/DeepSeek-R1-Distill-Llama-70B config.json
# (LlamaForCausalLM distilled from R1 onto Llama-3.3-70B-Instruct): the same shapes, vocab 128256,
# max_position_embeddings 131072, bfloat16. The reasoning model the ServeGen R1 workload stands for.
R1_DISTILL_LLAMA_70B = replace(LLAMA31_70B, name="DeepSeek-R1-Distill-Llama-70B")
# Llama-3-8B. Source: meta-llama/Meta-Llama-3-8B config.json (32 layers, hidden 4096, intermediate
# 14336, 32 heads, 8 KV heads, vocab 128256, max_position_embeddings 8192, bfloat16); 8,030,261,248
# parameters (HF: 8.03 B).
LLAMA3_8B = Model(
    name="Llama-3-8B", n_layers=32, hidden=4096, ffn=14336, n_heads=32, n_kv_heads=8, head_dim=128,
    n_params=_llama_params(32, 4096, 14336, 32, 8, 128, 128256), dtype_bytes=2, vocab=128256,
    max_context=8192,
)
# Llama-2-7B. Source: meta-llama/Llama-2-7b-hf config.json (32 layers, hidden 4096, intermediate 11008,
# 32 heads, num_key_value_heads 32: no GQA, vocab 32000, max_position_embeddings 4096, float16);
# 6,738,415,616 parameters (HF: 6.74 B). 512 KiB of KV per token, 1.6x Llama-2-70B's 320 KiB.
LLAMA2_7B = Model(
    name="Llama-2-7B", n_layers=32, hidden=4096, ffn=11008, n_heads=32, n_kv_heads=32, head_dim=128,
    n_params=_llama_params(32, 4096, 11008, 32, 32, 128, 32000), dtype_bytes=2, vocab=32000,
    max_context=4096,
)
# Qwen-72B (the first Qwen). Source: Qwen/Qwen-72B config.json (QWenLMHeadModel: num_hidden_layers 80,
# hidden_size 8192, num_attention_heads 64, kv_channels 128, no GQA; intermediate_size 49152 counts
# both halves of the gated MLP, so 24,576 per projection; vocab_size 152064, the tokenizer's 151,936
# padded to a multiple of 128 (Qwen-7B ships 151,936); seq_length 32768; bf16) and Vidur's
# Qwen72BModelConfig (vidur/config/model_config.py: mlp_hidden_dim 24576, vocab 152064,
# max_position_embeddings 32768, use_qkv_bias). Parameters: the Llama count plus the QKV biases
# (80 x 3 x 8192); 72.29 B. 2.5 MiB of KV per token: 8x Llama-3.1-70B's.
QWEN_72B = Model(
    name="Qwen-72B", n_layers=80, hidden=8192, ffn=24576, n_heads=64, n_kv_heads=64, head_dim=128,
    n_params=_llama_params(80, 8192, 24576, 64, 64, 128, 152064) + 80 * 3 * 8192, dtype_bytes=2,
    vocab=152064, max_context=32768,
)

# H100-SXM5-80GB. Sources: NVIDIA H100 Tensor Core GPU datasheet (2023, SXM5 column): 80 GB HBM3 at
# 3.35 TB/s, 989.4 TFLOP/s dense BF16/FP16 tensor core (1,979 with sparsity), fourth-generation NVLink
# 900 GB/s total = 450 GB/s per direction. Capacity: nvidia-smi reports 81,559 MiB for "NVIDIA H100
# 80GB HBM3" (modal-labs/modal-client PR 2797; NVIDIA/nccl issue 1264).
# Efficiencies: `calibrate` fitted to Vidur's H100 profiles (h100-llama2-70b-mlp.csv, TP in {1, 2};
# all_reduce_h100_dgx.csv, 2 and 4 GPUs), exactly as for the A100; tests/test_hardware_models.py
# re-fits and compares, and validates them on Llama-2-7B, Qwen-72B and the held-out TP degrees.
H100_80GB = GPU(
    name="H100-SXM5-80GB",
    hbm_bytes=81559 * 2**20,
    hbm_bandwidth=3.35e12,
    peak_flops=989.4e12,
    nvlink_bandwidth=450e9,
    hbm_efficiency=0.913,  # fitted: 3.06 TB/s achieved by memory-bound GEMMs
    compute_efficiency=0.703,  # fitted: 696 TFLOP/s achieved by large GEMMs
    kernel_overhead_s=6.4e-6,  # fitted: per-kernel launch/tail overhead
    gemm_tile=128,  # assumption, as for the A100
    nvlink_efficiency=0.756,  # fitted: ring all-reduce bus bandwidth 340 GB/s
    allreduce_latency_s=27.7e-6,  # fitted: NCCL all-reduce fixed cost
    # No H100 attention measurement here: A100's ratio of attention to GEMM bandwidth (0.39 / 0.775,
    # fit_attention_efficiency on lmdeploy's A100 decode latencies) times H100's hbm_efficiency.
    attention_efficiency=0.459,
)

# H200-SXM-141GB: SPEC ONLY. Source: NVIDIA H200 Tensor Core GPU datasheet (2024): 141 GB HBM3e at
# 4.8 TB/s; the H100's GH100 die, so the same 989.4 TFLOP/s dense BF16 and 900 GB/s NVLink. Capacity
# taken as 141 x 10^9 bytes (the datasheet's figure, decimal: a lower bound). No measured profile of
# the H200 exists here: every efficiency is H100's (same die, same kernels), an assumption -- its
# faster HBM3e may not reach the same fraction of peak.
H200_141GB = replace(
    H100_80GB,
    name="H200-SXM-141GB (spec only: H100 efficiencies)",
    hbm_bytes=141 * 10**9,
    hbm_bandwidth=4.8e12,
    spec_only=True,
)

#: Models by lower-case registry name (:func:`model_by_name`).
MODELS: dict[str, Model] = {
    "llama-2-70b": LLAMA2_70B,
    "llama-3.1-70b": LLAMA31_70B,
    "deepseek-r1-distill-llama-70b": R1_DISTILL_LLAMA_70B,
    "llama-3-8b": LLAMA3_8B,
    "llama-2-7b": LLAMA2_7B,
    "qwen-72b": QWEN_72B,
}
#: GPUs by lower-case registry name (:func:`gpu_by_name`).
GPUS: dict[str, GPU] = {"a100-80gb": A100_80GB, "h100-80gb": H100_80GB, "h200-141gb": H200_141GB}


def _by_name(registry: dict, name: object, what: str, argument: str):
    if not isinstance(name, str):
        raise ValueError(f"{argument} must be a {what} name (str), got {type(name).__name__} {name!r}; known: {sorted(registry)}")
    key = name.strip().lower()
    if key not in registry:
        raise ValueError(f"{argument}: unknown {what} {name!r}; known: {sorted(registry)}")
    return registry[key]


def model_by_name(name: str) -> Model:
    """The :class:`Model` registered as ``name`` (case-insensitive, e.g. ``"llama-3.1-70b"``).

    Raises ValueError naming the unknown name and listing the known ones (:data:`MODELS`)."""
    return _by_name(MODELS, name, "model", "name")


def gpu_by_name(name: str) -> GPU:
    """The :class:`GPU` registered as ``name`` (case-insensitive, e.g. ``"h100-80gb"``).

    Raises ValueError naming the unknown name and listing the known ones (:data:`GPUS`)."""
    return _by_name(GPUS, name, "GPU", "name")

#: Tokens per PagedAttention KV block (vLLM's default block size) :cite:`kwon2023vllm`.
BLOCK_TOKENS = 16
#: vLLM's default ``gpu_memory_utilization``: the fraction of HBM the engine may use.
GPU_MEMORY_UTILIZATION = 0.9
#: Per-GPU reserve for activations, CUDA graphs and NCCL buffers (bytes). An assumption: vLLM measures
#: the peak of a profiling run instead; 2 GiB is its order of magnitude for a 70B model, 8K-token batch.
ACTIVATION_RESERVE_BYTES = 2 * 2**30
#: The first edition's fixed decode batch (sequences per step). No longer the default: a busy group's
#: batch is endogenous (:func:`decode_operating_point`); pass ``decode_batch=64`` to get the old model.
DEFAULT_DECODE_BATCH = 64
#: vLLM's ``max_num_seqs``: at most this many sequences run in one (micro-batch) engine.
MAX_NUM_SEQS = 256
#: Reference workload of the per-configuration operating point (:func:`config_performance`): the
#: Azure LLM inference trace 2023, code and conversation together (28,185 requests), mean prompt and
#: mean output [tokens]. It sets which decode batch a busy group carries; chapter 7 checks the model
#: built on it against the simulator.
REFERENCE_INPUT_TOKENS = 1434.0
REFERENCE_OUTPUT_TOKENS = 153.8
#: Share of its saturation throughput at which a group's operating point is evaluated: the joint
#: problem's utilisation cap u_max (memory (6e) and the SLO (6f) bind there).
REFERENCE_UTILISATION = 0.9


def _check_degree(value: object, name: str) -> int:
    """An integer >= 1 (not a bool, str or float): a TP/PP degree or a GPU count."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class ParallelConfig:
    """A serving group: ``tp``-way tensor parallel times ``pp``-way pipeline parallel (tau_k, p_k)."""

    tp: int
    pp: int

    def __post_init__(self) -> None:
        for field in ("tp", "pp"):
            _check_degree(getattr(self, field), field)

    @property
    def gpus(self) -> int:
        """GPUs one group uses, tau_k * p_k (the coefficient in (6b))."""
        return self.tp * self.pp

    @property
    def name(self) -> str:
        return f"TP{self.tp}-PP{self.pp}"


#: The paper's four configurations k1..k4 on J = 8 GPUs.
PAPER_CONFIGS: tuple[ParallelConfig, ...] = tuple(ParallelConfig(tp, pp) for tp, pp in ((2, 1), (4, 1), (2, 2), (4, 2)))


def configs_for(gpus: int, tp_degrees: tuple[int, ...] = (1, 2, 4, 8), pp_degrees: tuple[int, ...] = (1, 2, 4, 8)) -> tuple[ParallelConfig, ...]:
    """Every (TP, PP) with tp*pp <= ``gpus``, TP within one 8-GPU NVLink node. For "any J"."""
    _check_degree(gpus, "gpus")
    return tuple(ParallelConfig(t, p) for t in tp_degrees for p in pp_degrees if t * p <= gpus and t <= 8)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_model(model: object, name: str = "model") -> Model:
    if not isinstance(model, Model):
        raise ValueError(f"{name} must be a kvdro.hardware.Model (e.g. LLAMA2_70B), got {type(model).__name__} {model!r}")
    return model


def _check_gpu(gpu: object, name: str = "gpu") -> GPU:
    if not isinstance(gpu, GPU):
        raise ValueError(f"{name} must be a kvdro.hardware.GPU (e.g. A100_80GB), got {type(gpu).__name__} {gpu!r}")
    return gpu


def _check_tp_divides_heads(model: Model, tp: int) -> None:
    """vLLM's rule for tensor parallelism: tp divides the query heads, and tp divides the KV heads or
    (tp > n_kv_heads, each KV head replicated) the KV heads divide tp."""
    if model.n_heads % tp:
        raise ValueError(f"tp={tp} must divide the {model.n_heads} attention heads of {model.name}")
    if model.n_kv_heads % tp and tp % model.n_kv_heads:
        raise ValueError(
            f"tp={tp} must divide the {model.n_kv_heads} KV heads of {model.name} "
            f"or be a multiple of them (KV heads replicated)"
        )


def weight_bytes(model: Model) -> int:
    """Bytes of model weights: n_params * dtype_bytes (Llama-2-70B fp16: 137.95 GB)."""
    _check_model(model)
    return model.n_params * model.dtype_bytes


def kv_bytes_per_token(model: Model) -> int:
    """KV-cache bytes one token occupies: 2 (K and V) * n_layers * n_kv_heads * head_dim * dtype_bytes.

    Llama-2-70B (GQA, 8 KV heads of 128, fp16): 2 * 80 * 8 * 128 * 2 = 327,680 bytes = 320 KiB.
    Raises ValueError naming ``model`` if it is not a :class:`Model`.
    """
    _check_model(model)
    return 2 * model.n_layers * model.n_kv_heads * model.head_dim * model.dtype_bytes


def _check_tp_pp(tp: int, pp: int) -> None:
    _check_degree(tp, "tp")
    _check_degree(pp, "pp")


def _kv_bytes_per_token_per_gpu(model: Model, tp: int, pp: int) -> int:
    layers = math.ceil(model.n_layers / pp)  # the fullest pipeline stage bounds the group
    kv_heads = math.ceil(model.n_kv_heads / tp)  # KV heads are replicated once tp > n_kv_heads
    return 2 * layers * kv_heads * model.head_dim * model.dtype_bytes


def kv_capacity_tokens(
    model: Model,
    gpu: GPU,
    tp: int,
    pp: int,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: int = ACTIVATION_RESERVE_BYTES,
) -> int:
    """KV capacity M_k of one serving group, in tokens (whole 16-token blocks, a multiple of BLOCK_TOKENS).

    Each of the tp*pp GPUs holds 1/(tp*pp) of the weights and, for every cached token, the K and V of
    its layers (n_layers/pp) and its KV heads (n_kv_heads/tp). Per GPU the KV pool is
    ``gpu_memory_utilization * hbm_bytes - weights/(tp*pp) - activation_reserve_bytes``; the group holds
    as many tokens as the fullest GPU can, rounded down to whole blocks.

    Raises ValueError naming the argument for: ``model``/``gpu`` of the wrong type (e.g. swapped);
    tp/pp not integers >= 1; a ``tp`` that does not divide the attention heads (vLLM's rule, see
    :func:`_check_tp_divides_heads`); ``pp`` above the number of layers; a utilisation outside
    (0, 1]; a negative reserve; or weights that do not fit (naming ``tp``/``pp``).
    """
    _check_model(model)
    _check_gpu(gpu)
    _check_tp_pp(tp, pp)
    _check_tp_divides_heads(model, tp)
    if pp > model.n_layers:
        raise ValueError(f"pp={pp} exceeds the {model.n_layers} layers of {model.name}")
    if not (_is_number(gpu_memory_utilization) and 0 < gpu_memory_utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if not (_is_number(activation_reserve_bytes) and math.isfinite(activation_reserve_bytes) and activation_reserve_bytes >= 0):
        raise ValueError(f"activation_reserve_bytes must be >= 0, got {activation_reserve_bytes!r}")
    per_gpu_weights = math.ceil(weight_bytes(model) / (tp * pp))
    pool = gpu_memory_utilization * gpu.hbm_bytes - per_gpu_weights - activation_reserve_bytes
    per_token = _kv_bytes_per_token_per_gpu(model, tp, pp)
    blocks = math.floor(pool / (per_token * BLOCK_TOKENS)) if pool > 0 else 0
    if blocks < 1:
        raise ValueError(
            f"tp={tp}, pp={pp}: {model.name} weights ({per_gpu_weights / 1e9:.1f} GB per GPU) leave no room "
            f"for a KV block in {gpu_memory_utilization:.0%} of {gpu.name} memory"
        )
    return blocks * BLOCK_TOKENS


def check_deployment(
    model: Model,
    gpu: GPU,
    tp: int,
    pp: int,
    *,
    max_model_len: int | None = None,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: int = ACTIVATION_RESERVE_BYTES,
) -> int:
    """Check that ``model`` can be served by ``tp`` x ``pp`` GPUs of kind ``gpu``; return its KV capacity
    M_k [tokens] (:func:`kv_capacity_tokens`).

    Raises ValueError naming the argument when it cannot: ``model``/``gpu`` of the wrong type, a ``tp``
    that does not divide the heads, ``pp`` above the layers, or weights + activation reserve that leave
    no KV block in ``gpu_memory_utilization`` of the GPU's memory (the message names ``tp``, ``pp`` and
    the per-GPU weight bytes). With ``max_model_len`` [tokens] it also applies vLLM's start-up check
    (``vllm/v1/core/kv_cache_utils.py``, ``check_enough_kv_cache_memory``, v0.11): the pool must hold
    one sequence of that many tokens, else ValueError naming ``max_model_len``.
    """
    tokens = kv_capacity_tokens(model, gpu, tp, pp, gpu_memory_utilization, activation_reserve_bytes)
    if max_model_len is not None:
        _check_degree(max_model_len, "max_model_len")
        if max_model_len > tokens:
            raise ValueError(
                f"max_model_len={max_model_len}: the KV pool of {model.name} on tp={tp}, pp={pp} x {gpu.name} "
                f"holds only {tokens} tokens (one sequence of max_model_len must fit)"
            )
    return tokens


def deployments_that_fit(
    model: Model, gpu: GPU, gpus: int = 8, max_model_len: int | None = None
) -> tuple[ParallelConfig, ...]:
    """Every (TP, PP) of :func:`configs_for` (``gpus``) that :func:`check_deployment` accepts."""
    fits = []
    for c in configs_for(gpus):
        try:
            check_deployment(model, gpu, c.tp, c.pp, max_model_len=max_model_len)
        except ValueError:
            continue
        fits.append(c)
    return tuple(fits)


def prefill_flops_per_token(model: Model, prompt_tokens: float = 0.0) -> float:
    """alpha of (1): mean FLOPs per token when a prompt of ``prompt_tokens`` tokens is prefilled.

    ``2 * n_params`` (one multiply-add per weight per token) plus causal attention: the token at
    position j does QK^T and AV against j keys, 4 j d FLOPs per layer (d = n_heads * head_dim); the
    mean over j = 0..L-1 is 2 L d per layer. Llama-2-70B: 2 * 68.98e9 = 137.95 GFLOP per token, plus
    1.3 GFLOP per token at L = 1,000 (1%).
    """
    _check_model(model)
    if not (_is_number(prompt_tokens) and math.isfinite(prompt_tokens) and prompt_tokens >= 0):
        raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens!r}")
    return 2.0 * model.n_params + 2.0 * model.n_layers * model.n_heads * model.head_dim * prompt_tokens


# ---------------------------------------------------------------------------------------------------
# Operator-level model (validated against Vidur's per-operator A100 measurements in chapter 4)
# ---------------------------------------------------------------------------------------------------

def linear_operators(model: Model, tp: int) -> dict[str, tuple[int, int]]:
    """Per-GPU (k, n) of each linear operator of one layer under tp-way tensor parallelism (Megatron
    split: column-parallel QKV and gate/up, row-parallel output and down projections).

    Names follow Vidur's profile: attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj (gate+up),
    mlp_down_proj.
    """
    _check_tp_pp(tp, 1)
    qkv = (model.n_heads + 2 * model.n_kv_heads) * model.head_dim
    return {
        "attn_pre_proj": (model.hidden, math.ceil(qkv / tp)),
        "attn_post_proj": (math.ceil(model.n_heads * model.head_dim / tp), model.hidden),
        "mlp_up_proj": (model.hidden, math.ceil(2 * model.ffn / tp)),
        "mlp_down_proj": (math.ceil(model.ffn / tp), model.hidden),
    }


def linear_op_time(gpu: GPU, tokens: float, k: int, n: int, dtype_bytes: int = 2) -> float:
    """Seconds for one GEMM [tokens, k] @ [k, n] on one GPU: a roofline max of compute and memory time.

    FLOPs = 2 * ceil(tokens / tile) * tile * k * n; bytes = dtype_bytes * (k*n + tokens*k + tokens*n)
    (weights, input, output). Time = kernel_overhead + max(FLOPs / (eta_c * peak), bytes / (eta_m * BW)).
    """
    if not (math.isfinite(tokens) and tokens >= 0):
        raise ValueError(f"tokens must be >= 0, got {tokens!r}")
    if tokens == 0:
        return 0.0
    rows = math.ceil(tokens / gpu.gemm_tile) * gpu.gemm_tile
    flops = 2.0 * rows * k * n
    moved = dtype_bytes * (k * n + tokens * k + tokens * n)
    return gpu.kernel_overhead_s + max(
        flops / (gpu.compute_efficiency * gpu.peak_flops), moved / (gpu.hbm_efficiency * gpu.hbm_bandwidth)
    )


def elementwise_op_time(gpu: GPU, moved_bytes: float) -> float:
    """Seconds for a memory-bound element-wise kernel (norm, activation, residual add, RoPE)."""
    if not (math.isfinite(moved_bytes) and moved_bytes >= 0):
        raise ValueError(f"moved_bytes must be >= 0, got {moved_bytes!r}")
    if moved_bytes == 0:
        return 0.0
    return gpu.kernel_overhead_s + moved_bytes / (gpu.hbm_efficiency * gpu.hbm_bandwidth)


def layer_linear_times(model: Model, gpu: GPU, tokens: float, tp: int) -> dict[str, float]:
    """Modelled seconds of each linear operator of one layer for a batch of ``tokens`` rows at TP=tp."""
    return {
        op: linear_op_time(gpu, tokens, k, n, model.dtype_bytes) for op, (k, n) in linear_operators(model, tp).items()
    }


def allreduce_time(gpu: GPU, message_bytes: float, workers: int) -> float:
    """Seconds of one ring all-reduce of ``message_bytes`` over ``workers`` GPUs in one NVLink node:
    ``latency + 2 (n-1)/n * S / (eta_nv * NVLink bandwidth)``; 0 for a single worker."""
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if not (math.isfinite(message_bytes) and message_bytes >= 0):
        raise ValueError(f"message_bytes must be >= 0, got {message_bytes!r}")
    if workers == 1 or message_bytes == 0:
        return 0.0
    n = workers
    return gpu.allreduce_latency_s + 2.0 * (n - 1) / n * message_bytes / (gpu.nvlink_efficiency * gpu.nvlink_bandwidth)


def _p2p_time(gpu: GPU, message_bytes: float) -> float:
    """A pipeline-stage hand-off (send/recv of activations) over NVLink."""
    if message_bytes == 0:
        return 0.0
    return gpu.allreduce_latency_s + message_bytes / (gpu.nvlink_efficiency * gpu.nvlink_bandwidth)


def step_time(
    model: Model,
    gpu: GPU,
    config: ParallelConfig,
    prefill_tokens: int,
    decode_seqs: int,
    decode_context_tokens: int,
    prefill_attention_tokens2: float | None = None,
) -> float:
    """Seconds for one engine iteration through the whole pipeline (latency of one step).

    The batch has ``prefill_tokens`` prompt tokens (one prompt, or several whose causal attention
    covers ``prefill_attention_tokens2`` = sum over prompts of L_j^2 - c_j^2 token pairs, c_j a cached
    prefix; default ``prefill_tokens**2``, one prompt) and ``decode_seqs`` sequences each
    generating one token, whose caches hold ``decode_context_tokens`` tokens in total. Per layer:
    the four linear operators (roofline, :func:`linear_op_time`) on ``prefill_tokens + decode_seqs``
    rows; five element-wise kernels (2 RMSNorms, SiLU*mul, RoPE, residual add); attention -- decode
    reads every cached K/V byte of the layer (``decode_context_tokens * kv_bytes / (n_layers * tp)``)
    at the attention kernels' bandwidth (:attr:`GPU.attention_bandwidth`),
    prefill does causal FLOPs 2 * L^2 * hidden / tp; two all-reduces (after attention and after the
    MLP) for tp > 1. The pp stages run one after another for a given batch (pp - 1 hand-offs);
    the LM head runs once per generated token.
    """
    for name, value in (("prefill_tokens", prefill_tokens), ("decode_seqs", decode_seqs), ("decode_context_tokens", decode_context_tokens)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    if decode_context_tokens > 0 and decode_seqs == 0:
        raise ValueError("decode_context_tokens must be 0 when decode_seqs is 0")
    tp, pp = config.tp, config.pp
    rows = prefill_tokens + decode_seqs
    if rows == 0:
        return 0.0
    act = model.dtype_bytes * rows * model.hidden  # one activation tensor
    per_layer = sum(layer_linear_times(model, gpu, rows, tp).values())
    per_layer += 4 * elementwise_op_time(gpu, 2 * act)  # 2 norms, residual add, RoPE (read + write)
    per_layer += elementwise_op_time(gpu, 3 * model.dtype_bytes * rows * model.ffn / tp)  # SiLU(gate)*up
    kv_layer_token = kv_bytes_per_token(model) / model.n_layers / tp
    if decode_seqs and decode_context_tokens:
        per_layer += gpu.kernel_overhead_s + decode_context_tokens * kv_layer_token / gpu.attention_bandwidth
    if prefill_tokens:
        pairs = prefill_tokens**2 if prefill_attention_tokens2 is None else prefill_attention_tokens2
        if not (math.isfinite(pairs) and pairs >= 0):
            raise ValueError(f"prefill_attention_tokens2 must be >= 0, got {prefill_attention_tokens2!r}")
        attn_flops = 2.0 * pairs * model.n_heads * model.head_dim / tp
        per_layer += gpu.kernel_overhead_s + max(
            attn_flops / (gpu.compute_efficiency * gpu.peak_flops),
            prefill_tokens * kv_layer_token / (gpu.hbm_efficiency * gpu.hbm_bandwidth),
        )
    per_layer += 2 * allreduce_time(gpu, act, tp)
    out_rows = decode_seqs + (1 if prefill_tokens else 0)
    head = linear_op_time(gpu, out_rows, model.hidden, math.ceil(model.vocab / tp), model.dtype_bytes)
    return model.n_layers * per_layer + head + (pp - 1) * _p2p_time(gpu, act / tp)


# ---------------------------------------------------------------------------------------------------
# Mixed prefill/decode steps (issue 32): engines that run prefill chunks beside decodes in one step
# ---------------------------------------------------------------------------------------------------


class _Scalar:
    """Python-float arithmetic for :func:`_mixed_step_core` (one step, no numpy overhead)."""

    ceil = staticmethod(math.ceil)
    maximum = staticmethod(max)

    @staticmethod
    def where(condition, value):
        return value if condition else 0.0


class _Vector:
    """numpy arithmetic for :func:`_mixed_step_core` (many steps at once)."""

    ceil = staticmethod(np.ceil)
    maximum = staticmethod(np.maximum)

    @staticmethod
    def where(condition, value):
        return np.where(condition, value, 0.0)


def _mixed_step_core(model: Model, gpu: GPU, tp: int, pp: int, pf, n_dec, ctx, chunks, pairs, kv_read, xp):
    """The cost model of :func:`step_time`, generalised to mixed steps, in one place for both backends
    (``xp`` = :class:`_Scalar` or :class:`_Vector`). The operations and their order are
    :func:`step_time`'s -- :func:`linear_op_time`, :func:`elementwise_op_time`, :func:`allreduce_time`
    and ``_p2p_time`` inlined -- so the results agree with it bit for bit where both apply."""
    eff_flops = gpu.compute_efficiency * gpu.peak_flops
    eff_bw = gpu.hbm_efficiency * gpu.hbm_bandwidth
    eff_nv = gpu.nvlink_efficiency * gpu.nvlink_bandwidth
    b = model.dtype_bytes

    def gemm(m, k, n):  # linear_op_time
        flops = 2.0 * (xp.ceil(m / gpu.gemm_tile) * gpu.gemm_tile) * k * n
        moved = b * (k * n + m * k + m * n)
        return xp.where(m > 0, gpu.kernel_overhead_s + xp.maximum(flops / eff_flops, moved / eff_bw))

    def elementwise(moved):  # elementwise_op_time
        return xp.where(moved > 0, gpu.kernel_overhead_s + moved / eff_bw)

    rows = pf + n_dec
    act = b * rows * model.hidden  # one activation tensor [bytes]
    per_layer = 0
    for k, n in linear_operators(model, tp).values():
        per_layer = per_layer + gemm(rows, k, n)
    per_layer = per_layer + 4 * elementwise(2 * act)  # 2 norms, residual add, RoPE (read + write)
    per_layer = per_layer + elementwise(3 * b * rows * model.ffn / tp)  # SiLU(gate) * up
    kv_layer_token = kv_bytes_per_token(model) / model.n_layers / tp
    decoding = (n_dec > 0) & (ctx > 0)
    per_layer = per_layer + xp.where(decoding, gpu.kernel_overhead_s + ctx * kv_layer_token / gpu.attention_bandwidth)
    attn_flops = 2.0 * pairs * model.n_heads * model.head_dim / tp
    prefill_attn = gpu.kernel_overhead_s + xp.maximum(attn_flops / eff_flops, kv_read * kv_layer_token / eff_bw)
    per_layer = per_layer + xp.where(pf > 0, prefill_attn)
    if tp > 1:
        per_layer = per_layer + 2 * xp.where(act > 0, gpu.allreduce_latency_s + 2.0 * (tp - 1) / tp * act / eff_nv)
    total = model.n_layers * per_layer + gemm(n_dec + chunks, model.hidden, math.ceil(model.vocab / tp))
    if pp > 1:
        total = total + (pp - 1) * xp.where(act > 0, gpu.allreduce_latency_s + act / tp / eff_nv)
    return xp.where(rows > 0, total)


def _float_array(name: str, value: object) -> np.ndarray:
    """``value`` as a float64 array, or ValueError naming ``name``."""
    if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
        raise ValueError(f"{name} must be numbers, got {value!r}")
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers, got {value!r}") from None


def _step_array(name: str, value: object, size: int | None = None) -> np.ndarray:
    """A 1-D float64 array of finite non-negative numbers (a scalar is broadcast to ``size``)."""
    arr = _float_array(name, value)
    if arr.ndim == 0 and size is not None:
        arr = np.full(size, float(arr))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a number or a 1-D array, got shape {arr.shape}")
    if size is not None and len(arr) != size:
        raise ValueError(f"{name} must have {size} entries (one per step), got {len(arr)}")
    if not (np.all(np.isfinite(arr)) and np.all(arr >= 0)):
        raise ValueError(f"{name} must hold finite numbers >= 0")
    return arr


def mixed_step_times(
    model: Model,
    gpu: GPU,
    tp: int,
    pp: int,
    prefill_tokens: np.ndarray,
    decode_seqs: np.ndarray,
    decode_context_tokens: np.ndarray,
    *,
    prefill_seqs: np.ndarray | None = None,
    prefill_attention_tokens2: np.ndarray | None = None,
    prefill_kv_tokens: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds of many engine steps at once, each a mix of prefill chunks and decodes (vectorised).

    Entry ``s`` of every array describes step ``s``: ``prefill_tokens`` new prompt tokens in
    ``prefill_seqs`` chunks (default: one chunk if any), whose causal attention covers
    ``prefill_attention_tokens2`` = sum over chunks of (p + c)^2 - p^2 token pairs (c the chunk, p the
    prefix already cached; default ``prefill_tokens**2``) and reads the K/V of ``prefill_kv_tokens`` =
    sum of p + c tokens (default ``prefill_tokens``); ``decode_seqs`` sequences generating one token
    each, whose caches hold ``decode_context_tokens`` tokens in total.

    The cost model is :func:`step_time`'s, term by term:

    * token-proportional operators -- the four GEMMs of each layer, the element-wise kernels, the two
      all-reduces and the pipeline hand-off -- run once on all ``prefill_tokens + decode_seqs`` rows of
      the step (validated against Vidur's measured operators, :func:`step_time_error_table`);
    * decode attention reads every cached K/V byte of the decoding sequences at the attention
      kernels' bandwidth (:attr:`GPU.attention_bandwidth`, fitted to lmdeploy's measured decode
      latencies by :func:`fit_attention_efficiency`; no attention kernel profile is available);
    * prefill attention is a roofline max of its causal FLOPs (2 x pairs x n_heads x head_dim / tp per
      layer, as in :func:`step_time`) and the K/V bytes of its chunks *with their prefixes* at the
      GEMMs' bandwidth (a chunk attends to its whole prefix);
    * the LM head runs on one row per decode and one per prefill chunk: vLLM v1 computes logits at the
      last scheduled position of every request in the step (``vllm/v1/worker/gpu_model_runner.py``,
      ``logits_indices``), and discards the token of a partial chunk.

    A pure-decode step (no prefill) and a one-chunk pure-prefill step equal :func:`step_time` bit for
    bit (``tests/test_hardware_models.py``). Raises ValueError naming the argument for negative or
    non-finite entries, arrays of unequal length, or decode context without decodes.
    """
    _check_model(model)
    _check_gpu(gpu)
    _check_tp_pp(tp, pp)
    pf = _step_array("prefill_tokens", prefill_tokens)
    size = len(pf)
    n_dec = _step_array("decode_seqs", decode_seqs, size)
    ctx = _step_array("decode_context_tokens", decode_context_tokens, size)
    chunks = (pf > 0).astype(float) if prefill_seqs is None else _step_array("prefill_seqs", prefill_seqs, size)
    pairs = pf * pf if prefill_attention_tokens2 is None else _step_array("prefill_attention_tokens2", prefill_attention_tokens2, size)
    kv_read = pf if prefill_kv_tokens is None else _step_array("prefill_kv_tokens", prefill_kv_tokens, size)
    if np.any((ctx > 0) & (n_dec == 0)):
        raise ValueError("decode_context_tokens must be 0 in a step whose decode_seqs is 0")
    if np.any((chunks > 0) != (pf > 0)):
        raise ValueError("prefill_seqs must be >= 1 exactly where prefill_tokens > 0")
    return _mixed_step_core(model, gpu, tp, pp, pf, n_dec, ctx, chunks, pairs, kv_read, _Vector)


def mixed_step_time(
    model: Model,
    gpu: GPU,
    tp: int,
    pp: int,
    prefill_tokens: int | np.ndarray,
    decode_context_tokens: np.ndarray,
    *,
    prefill_prefix_tokens: int | np.ndarray = 0,
) -> float:
    """Seconds of one engine step that runs prefill chunks beside decodes (vLLM v1, SGLang, TRT-LLM).

    ``prefill_tokens``: the new prompt tokens of each prefill chunk in the step (a number for one
    chunk, an array for several; 0 or an empty array for none); ``prefill_prefix_tokens``: the tokens
    each chunk's request already has in the cache (earlier chunks, a cached prefix; default 0);
    ``decode_context_tokens``: the context length of each decoding sequence (the cached tokens its
    attention reads this step) [tokens]. The cost model is :func:`mixed_step_times` (one step);
    with no decodes and one chunk without prefix it is :func:`step_time` ``(L, 0, 0)``, with no
    prefill it is :func:`step_time` ``(0, n, sum of contexts)``, both exactly.
    """
    _check_model(model)
    _check_gpu(gpu)
    _check_tp_pp(tp, pp)
    ctx = _float_array("decode_context_tokens", decode_context_tokens)
    if ctx.ndim != 1:
        raise ValueError(f"decode_context_tokens must be a 1-D array (one context length per decode), got shape {ctx.shape}")
    ctx_total = float(ctx.sum())
    if len(ctx) and not (ctx.min() >= 1 and math.isfinite(ctx_total)):
        raise ValueError("decode_context_tokens must hold finite context lengths >= 1")
    if _is_number(prefill_tokens) and _is_number(prefill_prefix_tokens):  # one chunk: the common case
        c, p = float(prefill_tokens), float(prefill_prefix_tokens)
        for name, value in (("prefill_tokens", c), ("prefill_prefix_tokens", p)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        live = c > 0
        pf, chunks, pairs, kv_read = (c, 1.0, (p + c) ** 2 - p**2, p + c) if live else (0.0, 0.0, 0.0, 0.0)
    else:
        chunk_arr = np.atleast_1d(_float_array("prefill_tokens", prefill_tokens))
        if chunk_arr.ndim != 1:
            raise ValueError(f"prefill_tokens must be a number or a 1-D array, got shape {chunk_arr.shape}")
        prefix = _float_array("prefill_prefix_tokens", prefill_prefix_tokens)
        prefix = np.full(len(chunk_arr), float(prefix)) if prefix.ndim == 0 else prefix
        if prefix.shape != chunk_arr.shape:
            raise ValueError(f"prefill_prefix_tokens must match prefill_tokens ({len(chunk_arr)} chunks), got shape {prefix.shape}")
        for name, arr in (("prefill_tokens", chunk_arr), ("prefill_prefix_tokens", prefix)):
            if not (np.all(np.isfinite(arr)) and np.all(arr >= 0)):
                raise ValueError(f"{name} must hold finite numbers >= 0")
        alive = chunk_arr > 0
        c, p = chunk_arr[alive], prefix[alive]
        pf, chunks = float(c.sum()), float(alive.sum())
        pairs, kv_read = float(np.sum((p + c) ** 2 - p**2)), float(np.sum(p + c))
    return float(_mixed_step_core(model, gpu, tp, pp, pf, float(len(ctx)), ctx_total, chunks, pairs, kv_read, _Scalar))


@dataclass(frozen=True)
class MixedStepTable:
    """:func:`mixed_step_times` of one (model, GPU, TP, PP) taken apart for look-up in a compiled loop.

    A step with ``rows`` = prefill tokens + decodes, ``out_rows`` = decodes + prefill chunks, decode
    context ``ctx`` (total cached tokens read), ``pairs`` causal token pairs and ``kv`` prefill K/V
    tokens read (chunks with their prefixes) lasts

        tokens_s[rows] + head_s[out_rows]
        + n_layers * ([decodes > 0 and ctx > 0] (attn_overhead_s + decode_s_per_token * ctx)
                      + [prefill > 0] (attn_overhead_s + max(prefill_s_per_pair * pairs, prefill_s_per_kv_token * kv)))

    where ``tokens_s`` (indexed by rows, 0..max_rows) holds the token-proportional part of all layers
    and the pipeline hand-offs, and ``head_s`` the LM head. Equal to :func:`mixed_step_times` up to
    floating-point rounding (the terms are summed in another order; a test bounds the difference at
    1e-12 relative). All times in seconds, per-token terms per layer.
    """

    tokens_s: np.ndarray
    head_s: np.ndarray
    n_layers: int
    attn_overhead_s: float
    decode_s_per_token: float
    prefill_s_per_pair: float
    prefill_s_per_kv_token: float

    def seconds(self, prefill_tokens, decode_seqs, decode_context_tokens, prefill_seqs=None,
                prefill_attention_tokens2=None, prefill_kv_tokens=None) -> np.ndarray:
        """Step seconds from the table, arguments as :func:`mixed_step_times` (arrays, one entry per step)."""
        pf = np.asarray(prefill_tokens, dtype=float)
        n_dec = np.asarray(decode_seqs, dtype=float)
        ctx = np.asarray(decode_context_tokens, dtype=float)
        chunks = (pf > 0).astype(float) if prefill_seqs is None else np.asarray(prefill_seqs, dtype=float)
        pairs = pf * pf if prefill_attention_tokens2 is None else np.asarray(prefill_attention_tokens2, dtype=float)
        kv = pf if prefill_kv_tokens is None else np.asarray(prefill_kv_tokens, dtype=float)
        rows = (pf + n_dec).astype(np.int64)
        if np.any(rows >= len(self.tokens_s)):
            raise ValueError(f"prefill_tokens + decode_seqs must be at most the table's {len(self.tokens_s) - 1} rows")
        attn = np.where((n_dec > 0) & (ctx > 0), self.attn_overhead_s + self.decode_s_per_token * ctx, 0.0)
        attn = attn + np.where(
            pf > 0, self.attn_overhead_s + np.maximum(self.prefill_s_per_pair * pairs, self.prefill_s_per_kv_token * kv), 0.0
        )
        return self.tokens_s[rows] + self.head_s[(n_dec + chunks).astype(np.int64)] + self.n_layers * attn


def mixed_step_table(model: Model, gpu: GPU, tp: int, pp: int, max_rows: int) -> MixedStepTable:
    """The :class:`MixedStepTable` of ``model`` on ``tp`` x ``pp`` GPUs of kind ``gpu`` for steps of up to
    ``max_rows`` tokens (an engine's token budget, or ``max_num_batched_tokens``)."""
    _check_model(model)
    _check_gpu(gpu)
    _check_tp_pp(tp, pp)
    _check_degree(max_rows, "max_rows")
    rows = np.arange(max_rows + 1, dtype=float)
    zeros = np.zeros_like(rows)
    # a decode step of `rows` sequences with no cached context: no attention term, one head row each
    decode_only = _mixed_step_core(model, gpu, tp, pp, zeros, rows, zeros, zeros, zeros, zeros, _Vector)
    vocab_cols = math.ceil(model.vocab / tp)
    head = np.array([linear_op_time(gpu, r, model.hidden, vocab_cols, model.dtype_bytes) for r in range(max_rows + 1)])
    kv_layer_token = kv_bytes_per_token(model) / model.n_layers / tp
    return MixedStepTable(
        tokens_s=decode_only - head,
        head_s=head,
        n_layers=model.n_layers,
        attn_overhead_s=gpu.kernel_overhead_s,
        decode_s_per_token=kv_layer_token / gpu.attention_bandwidth,
        prefill_s_per_pair=2.0 * model.n_heads * model.head_dim / tp / (gpu.compute_efficiency * gpu.peak_flops),
        prefill_s_per_kv_token=kv_layer_token / (gpu.hbm_efficiency * gpu.hbm_bandwidth),
    )


@dataclass(frozen=True)
class ConfigPerformance:
    """Per-configuration constants of the paper's model (Section III), for one serving group.

    kv_capacity_tokens = M_k (tokens), kv_capacity_blocks = M_k / 16; compute_flops = C_k (effective
    FLOP/s of all tau*p GPUs); bandwidth = B_k (effective bytes/s of all tau*p GPUs); allreduce_s =
    t_ar (seconds per all-reduce of one decode step's activations at ``decode_batch``, 0 if tp = 1);
    decode_batch = the decode batch size (sequences per step) at which the work (1) amortises weight
    reads -- the largest batch a micro-batch engine runs, n_max (the group's capacity); busy_batch =
    n_dec, the batch it carries at the reference utilisation, and prefill_share = the share of time
    its prefill-first steps stall decoding there (both from :func:`decode_operating_point`; they set
    the residence time H of :func:`kvdro.queueing.residence_time`).
    """

    config: ParallelConfig
    gpus: int
    kv_capacity_tokens: int
    kv_capacity_blocks: int
    compute_flops: float
    bandwidth: float
    allreduce_s: float
    decode_batch: int = DEFAULT_DECODE_BATCH
    gpu: GPU = A100_80GB
    busy_batch: float = DEFAULT_DECODE_BATCH
    prefill_share: float = 0.0


def config_performance(
    model: Model,
    gpu: GPU,
    config: ParallelConfig,
    decode_batch: int | None = None,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: int = ACTIVATION_RESERVE_BYTES,
) -> ConfigPerformance:
    """M_k, C_k, B_k, t_ar and the decode operating point of one (TP, PP) group (inputs of (1), (6e)).

    C_k = tau p * eta_c * peak and B_k = tau p * eta_m * HBM bandwidth: the group's aggregate effective
    compute and bandwidth (a request's prefill uses one stage at a time, hence the p_k in (1)).

    ``decode_batch=None`` (default): the batch is endogenous -- :func:`decode_operating_point` on the
    reference workload (:data:`REFERENCE_INPUT_TOKENS`, :data:`REFERENCE_OUTPUT_TOKENS`) at
    :data:`REFERENCE_UTILISATION` gives n_max (``decode_batch``), n_dec (``busy_batch``) and the
    prefill share. An integer ``decode_batch`` gives the first edition's fixed-batch model (all three
    batches equal, no prefill stall).
    """
    _check_model(model)
    _check_gpu(gpu)
    if not isinstance(config, ParallelConfig):
        raise ValueError(f"config must be a kvdro.hardware.ParallelConfig, got {type(config).__name__} {config!r}")
    tokens = kv_capacity_tokens(model, gpu, config.tp, config.pp, gpu_memory_utilization, activation_reserve_bytes)
    if decode_batch is None:
        op = decode_operating_point(model, gpu, config, REFERENCE_INPUT_TOKENS, REFERENCE_OUTPUT_TOKENS, kv_tokens=tokens)
        decode_batch, busy, share = max(1, int(op.max_batch)), op.batch, op.prefill_share
    else:
        _check_degree(decode_batch, "decode_batch")
        busy, share = float(decode_batch), 0.0
    g = config.gpus
    return ConfigPerformance(
        config=config,
        gpus=g,
        kv_capacity_tokens=tokens,
        kv_capacity_blocks=tokens // BLOCK_TOKENS,
        compute_flops=g * gpu.compute_efficiency * gpu.peak_flops,
        bandwidth=g * gpu.hbm_efficiency * gpu.hbm_bandwidth,
        allreduce_s=allreduce_time(gpu, decode_batch * model.hidden * model.dtype_bytes, config.tp),
        decode_batch=int(decode_batch),
        gpu=gpu,
        busy_batch=float(busy),
        prefill_share=float(share),
    )


@dataclass(frozen=True)
class OperatingPoint:
    """Where a continuously batching group settles at an arrival rate (:func:`decode_operating_point`).

    Per micro-batch engine (a group of PP degree p runs p of them, each with 1/p of the traffic and of
    the KV pool): ``max_batch`` n_max [sequences]; ``batch`` n [sequences decoding]; ``prefill_s`` t_pf
    and ``step_s`` t_dec(n) [s]; ``prefill_share`` lambda t_pf; ``residence_s`` H [s]. Per group:
    ``arrival_rate`` and ``saturation_rate`` [requests/s]; ``saturated`` if the rate reaches it.
    """

    max_batch: float
    batch: float
    prefill_s: float
    step_s: float
    prefill_share: float
    residence_s: float
    arrival_rate: float
    saturation_rate: float
    saturated: bool


def decode_operating_point(
    model: Model,
    gpu: GPU,
    config: ParallelConfig,
    input_tokens: float,
    mean_output_tokens: float,
    *,
    arrival_rate: float | None = None,
    utilisation: float = REFERENCE_UTILISATION,
    max_num_seqs: int = MAX_NUM_SEQS,
    kv_tokens: float | None = None,
) -> OperatingPoint:
    """The endogenous decode batch: a fixed point of Little's law under vLLM's prefill-first steps.

    A micro-batch engine receives lambda requests/s (the group's rate / p) of mean prompt L and mean
    output xi. Each arrival costs one prefill step of t_pf = :func:`step_time` (L, 0, 0) during which
    nobody decodes; the rest of the time it runs decode steps of its n sequences, t_dec(n) =
    :func:`step_time` (0, n, n (L + xi/2)), each producing n tokens. Token balance (the engine is
    busy whenever a request is resident) gives

        n (1 - lambda t_pf) = lambda xi t_dec(n),        H = t_pf + xi t_dec(n) / (1 - lambda t_pf),

    i.e. Little's law n = lambda (H - t_pf) with a residence that itself grows with n. The batch is
    at most n_max = min(max_num_seqs, sequences of mean context L + xi/2 the engine's KV pool holds);
    at n_max the engine is saturated: lambda_sat = 1 / (t_pf + xi t_dec(n_max) / n_max) per engine.
    ``arrival_rate`` is the group's rate; ``None`` takes ``utilisation`` x the saturation rate.
    ``kv_tokens`` is the group's KV capacity M_k [tokens] (default :func:`kv_capacity_tokens`).
    """
    for name, value in (("input_tokens", input_tokens), ("mean_output_tokens", mean_output_tokens)):
        if not (_is_number(value) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    if not (0 < utilisation < 1):
        raise ValueError(f"utilisation must be in (0, 1), got {utilisation!r}")
    _check_degree(max_num_seqs, "max_num_seqs")
    pp = config.pp
    if kv_tokens is None:
        kv_tokens = kv_capacity_tokens(model, gpu, config.tp, config.pp)
    ctx = float(input_tokens) + float(mean_output_tokens) / 2.0
    n_max = float(min(max_num_seqs, max(1.0, (kv_tokens / pp) / max(ctx, 1.0))))
    t_pf = step_time(model, gpu, config, max(float(input_tokens), 1.0), 0, 0)
    xi = float(mean_output_tokens)
    t_dec = lambda n: step_time(model, gpu, config, 0, n, n * max(ctx, 1.0))  # noqa: E731
    lam_sat = 1.0 / (t_pf + xi * t_dec(n_max) / n_max)  # per engine
    if arrival_rate is None:
        lam = utilisation * lam_sat
    else:
        if not (_is_number(arrival_rate) and math.isfinite(arrival_rate) and arrival_rate >= 0):
            raise ValueError(f"arrival_rate must be a non-negative finite number, got {arrival_rate!r}")
        lam = float(arrival_rate) / pp
    saturated = lam >= lam_sat
    if lam == 0:
        n = 0.0
    elif saturated:
        n = n_max
    else:  # g(n) = n (1 - lam t_pf) - lam xi t_dec(n): g(0+) < 0 <= g(n_max); bisection
        lo, hi = 0.0, n_max
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if mid * (1 - lam * t_pf) - lam * xi * t_dec(mid) < 0:
                lo = mid
            else:
                hi = mid
        n = hi
    step = t_dec(n) if n > 0 else t_dec(1.0)
    share = min(lam * t_pf, 1.0)
    residence = t_pf + xi * step / (1 - share) if share < 1 else math.inf
    return OperatingPoint(
        max_batch=n_max, batch=n, prefill_s=t_pf, step_s=step, prefill_share=share, residence_s=residence,
        arrival_rate=lam * pp, saturation_rate=lam_sat * pp, saturated=bool(saturated),
    )


# ---------------------------------------------------------------------------------------------------
# Calibration against measurement (Vidur's A100 profiles, :cite:`agrawal2024vidur`)
# ---------------------------------------------------------------------------------------------------

#: Published A100 measurements of Llama-2-70B fp16 at TP4, lmdeploy v0.1.0a1 on 8 x A100-80G
#: (InternLM/lmdeploy ``docs/en/benchmark/a100_fp16.md``, :cite:`lmdeploy2023`). Static inference:
#: (batch, prompt tokens, output tokens, median per-token latency [s], rounded to the ms).
LMDEPLOY_TP4_DECODE: tuple[tuple[int, int, int, float], ...] = tuple(
    (b, p, o, t)
    for b, row in (
        (16, (0.030, 0.030, 0.033, 0.035, 0.036)),
        (32, (0.032, 0.032, 0.036, 0.040, 0.043)),
        (64, (0.037, 0.037, 0.043, 0.050, 0.055)),
    )
    for (p, o), t in zip(((1, 128), (128, 128), (128, 2048), (2048, 128), (2048, 2048)), row)
)
#: Request throughput on ShareGPT conversations, 3,000 prompts: (concurrent requests, requests/s).
LMDEPLOY_TP4_THROUGHPUT: tuple[tuple[int, float], ...] = ((64, 4.285), (128, 5.833), (256, 6.568))
#: Mean prompt and output tokens of that ShareGPT sample, from the same table's token throughputs:
#: output = 1,000.376 / 4.285 = 233.5, prompt = (2,062.7 - 1,000.376) / 4.285 = 247.9 tokens.
LMDEPLOY_SHAREGPT_TOKENS: tuple[float, float] = (247.9, 233.5)


def fit_attention_efficiency(model: Model, gpu: GPU, rows=LMDEPLOY_TP4_DECODE, tp: int = 4) -> float:
    """The fraction of HBM bandwidth decode attention reaches, from measured decode latencies.

    Within one batch size b, a decode step's latency grows with the cached context only through
    attention, which reads ``b * ctx * kv_bytes / tp`` bytes per GPU (ctx = prompt + output/2 at the
    median token). A least-squares line per batch (one intercept each, a common slope s [s per
    cached token read]) gives ``attention_efficiency = kv_bytes / tp / (s * HBM bandwidth)``.
    """
    rows = list(rows)
    batches = sorted({r[0] for r in rows})
    X = np.zeros((len(rows), len(batches) + 1))
    y = np.zeros(len(rows))
    for i, (b, p, o, t) in enumerate(rows):
        X[i, batches.index(b)] = 1.0
        X[i, -1] = b * (p + o / 2.0)
        y[i] = t
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    slope = float(coef[-1])
    if slope <= 0:
        raise ValueError("rows: latency does not grow with the context; cannot fit attention efficiency")
    eff = kv_bytes_per_token(model) / tp / (slope * gpu.hbm_bandwidth)
    return float(min(eff, 1.0))


#: Operators of Vidur's per-layer profile that are GEMMs (the rest are element-wise kernels).
VIDUR_LINEAR_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: Token counts at or below which a GEMM is memory-bound, at or above which compute-bound (A100, fp16).
MEMORY_BOUND_MAX_TOKENS = 64
COMPUTE_BOUND_MIN_TOKENS = 2048


def _read_csv_columns(path: str | os.PathLike[str], columns: list[str]) -> pd.DataFrame:
    path = Path(path)
    try:
        frame = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ValueError(f"{path}: cannot read as CSV ({exc})") from None
    for column in columns:
        if column not in frame.columns:
            raise ValueError(f"{path}: missing column {column!r}")
        if not pd.api.types.is_numeric_dtype(frame[column]):
            raise ValueError(f"{path}: column {column!r} must be numeric")
        values = frame[column].to_numpy(dtype=float)
        if not (np.all(np.isfinite(values)) and np.all(values > 0)):
            raise ValueError(f"{path}: column {column!r} must hold positive finite numbers")
    return frame


#: Every operator of Vidur's per-layer profile that runs once per layer on all the step's tokens
#: (the GEMMs and the element-wise kernels; attention itself is not in the profile).
VIDUR_LAYER_OPS: tuple[str, ...] = VIDUR_LINEAR_OPS + (
    "input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add"
)


def read_vidur_linear(
    path: str | os.PathLike[str], statistic: str = "median", operators: tuple[str, ...] | None = None
) -> pd.DataFrame:
    """Vidur's per-layer operator profile (``mlp.csv``) as a tidy frame, one row per measurement:
    ``tp`` (TP degree), ``tokens`` (rows in the batch), ``operator`` (e.g. ``mlp_up_proj``) and
    ``measured_s`` (seconds; Vidur stores ms). ``operators``: the columns to read (default: the GEMMs,
    input_layernorm, attn_rope, mlp_act and add; :data:`VIDUR_LAYER_OPS` adds the second norm).
    ValueError names the file and column if malformed."""
    if statistic not in {"min", "max", "mean", "median"}:
        raise ValueError(f"statistic must be one of min/max/mean/median, got {statistic!r}")
    ops = VIDUR_LINEAR_OPS + ("input_layernorm", "attn_rope", "mlp_act", "add") if operators is None else tuple(operators)
    time_cols = [f"time_stats.{op}.{statistic}" for op in ops]
    frame = _read_csv_columns(path, ["num_tokens", "num_tensor_parallel_workers", *time_cols])
    long = frame.melt(
        id_vars=["num_tensor_parallel_workers", "num_tokens"], value_vars=time_cols, var_name="operator", value_name="measured_ms"
    )
    return pd.DataFrame(
        {
            "tp": long["num_tensor_parallel_workers"].astype("int64"),
            "tokens": long["num_tokens"].astype("int64"),
            "operator": long["operator"].str.split(".").str[1].astype(str),
            "measured_s": long["measured_ms"].astype(float) * 1e-3,
        }
    )


def read_vidur_allreduce(path: str | os.PathLike[str], statistic: str = "median") -> pd.DataFrame:
    """Vidur's all-reduce profile as a tidy frame of *single-node* runs (all workers on one NVLink
    node): ``workers``, ``size_bytes``, ``measured_s``. ValueError names the file and column."""
    if statistic not in {"min", "max", "mean", "median"}:
        raise ValueError(f"statistic must be one of min/max/mean/median, got {statistic!r}")
    col = f"time_stats.all_reduce.{statistic}"
    frame = _read_csv_columns(path, ["num_workers", "size", "devices_per_node", col])
    one_node = frame[frame["devices_per_node"] == frame["num_workers"]]
    if one_node.empty:
        raise ValueError(f"{path}: no single-node rows (devices_per_node == num_workers)")
    return pd.DataFrame(
        {
            "workers": one_node["num_workers"].astype("int64").to_numpy(),
            "size_bytes": one_node["size"].astype("int64").to_numpy(),
            "measured_s": one_node[col].astype(float).to_numpy() * 1e-3,
        }
    )


#: Vidur's measured operator profiles by (GPU, model) registry names: (the kvdro.datasets name of the
#: per-layer profile, the model that was profiled). Llama-3.1-70B and DeepSeek-R1-Distill-Llama-70B
#: have Meta-Llama-3-70B's shapes, so its profile stands for them; no profile exists here of
#: Llama-3-70B or Llama-3-8B on the H100, nor of any model on the H200.
VIDUR_PROFILES: dict[tuple[str, str], tuple[str, str]] = {
    ("a100-80gb", "llama-2-70b"): ("vidur-a100-llama2-70b-mlp", "Llama-2-70B"),
    ("a100-80gb", "llama-3.1-70b"): ("vidur-a100-llama3-70b-mlp", "Meta-Llama-3-70B"),
    ("a100-80gb", "llama-3-8b"): ("vidur-a100-llama3-8b-mlp", "Meta-Llama-3-8B"),
    ("a100-80gb", "llama-2-7b"): ("vidur-a100-llama2-7b-mlp", "Llama-2-7B"),
    ("a100-80gb", "qwen-72b"): ("vidur-a100-qwen-72b-mlp", "Qwen-72B"),
    ("h100-80gb", "llama-2-70b"): ("vidur-h100-llama2-70b-mlp", "Llama-2-70B"),
    ("h100-80gb", "llama-2-7b"): ("vidur-h100-llama2-7b-mlp", "Llama-2-7B"),
    ("h100-80gb", "qwen-72b"): ("vidur-h100-qwen-72b-mlp", "Qwen-72B"),
}
#: Vidur's all-reduce profile of each GPU's node (DGX A100, DGX H100), as kvdro.datasets names.
VIDUR_ALLREDUCE: dict[str, str] = {"a100-80gb": "vidur-a100-allreduce", "h100-80gb": "vidur-h100-allreduce"}


def _gemm_features(model: Model, tp: np.ndarray, tokens: np.ndarray, operator: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row (FLOPs per token row, bytes moved) of each GEMM in a tidy frame."""
    flops_per_row = np.empty(len(tp))
    moved = np.empty(len(tp))
    for i, (t, m, op) in enumerate(zip(tp, tokens, operator, strict=True)):
        k, n = linear_operators(model, int(t))[op]
        flops_per_row[i] = 2.0 * k * n
        moved[i] = model.dtype_bytes * (k * n + m * k + m * n)
    return flops_per_row, moved


def predict_linear(model: Model, gpu: GPU, measurements: pd.DataFrame) -> np.ndarray:
    """Modelled seconds (:func:`linear_op_time`) for every GEMM row (tp, tokens, operator) of a tidy frame."""
    return np.array(
        [
            linear_op_time(gpu, m, *linear_operators(model, int(t))[op], model.dtype_bytes)
            for t, m, op in zip(measurements["tp"], measurements["tokens"], measurements["operator"], strict=True)
        ]
    )


def predict_allreduce(gpu: GPU, measurements: pd.DataFrame) -> np.ndarray:
    """Modelled seconds (:func:`allreduce_time`) for every (workers, size_bytes) row of a tidy frame."""
    return np.array(
        [allreduce_time(gpu, s, int(w)) for w, s in zip(measurements["workers"], measurements["size_bytes"], strict=True)]
    )


def calibrate(
    model: Model,
    gpu: GPU,
    linear: pd.DataFrame,
    allreduce: pd.DataFrame,
    train_tp: tuple[int, ...] = (1, 2),
    train_workers: tuple[int, ...] = (2, 4),
) -> GPU:
    """Fit the achieved-efficiency constants of ``gpu`` to measurements, each where it is identifiable.

    * memory-bound GEMMs (tokens <= 64): least squares ``t = t0 + bytes / (eta_m * BW)`` gives the
      kernel overhead t0 and eta_m;
    * compute-bound GEMMs (tokens >= 2048): eta_c = median of FLOPs / ((t - t0) * peak);
    * all-reduce: least squares ``t = lat + 2 (n-1)/n * S / (eta_nv * NVLink)`` gives lat and eta_nv.

    Only rows with TP in ``train_tp`` / workers in ``train_workers`` are used, so the other TP degrees
    and worker counts are held out for validation. The GEMM tile (``gpu.gemm_tile``) is kept.
    """
    lin = linear[linear["operator"].isin(VIDUR_LINEAR_OPS) & linear["tp"].isin(train_tp)]
    if lin.empty:
        raise ValueError(f"linear: no GEMM rows with tp in {train_tp}")
    flops_per_row, moved = _gemm_features(model, lin["tp"].to_numpy(), lin["tokens"].to_numpy(), lin["operator"].to_numpy())
    measured = lin["measured_s"].to_numpy()
    tokens = lin["tokens"].to_numpy()
    mem = tokens <= MEMORY_BOUND_MAX_TOKENS
    cmp_ = tokens >= COMPUTE_BOUND_MIN_TOKENS
    if mem.sum() < 2 or cmp_.sum() < 1:
        raise ValueError("linear: need memory-bound (tokens <= 64) and compute-bound (tokens >= 2048) rows")
    (t0, slope), *_ = np.linalg.lstsq(np.c_[np.ones(mem.sum()), moved[mem]], measured[mem], rcond=None)
    t0 = max(float(t0), 0.0)
    eta_m = 1.0 / (slope * gpu.hbm_bandwidth)
    rows = np.ceil(tokens[cmp_] / gpu.gemm_tile) * gpu.gemm_tile  # as linear_op_time counts them
    eta_c = float(np.median(flops_per_row[cmp_] * rows / (measured[cmp_] - t0))) / gpu.peak_flops

    ar = allreduce[allreduce["workers"].isin(train_workers)]
    if len(ar) < 2:
        raise ValueError(f"allreduce: need rows with workers in {train_workers}")
    n = ar["workers"].to_numpy(dtype=float)
    x = 2.0 * (n - 1) / n * ar["size_bytes"].to_numpy(dtype=float)
    (lat, ar_slope), *_ = np.linalg.lstsq(np.c_[np.ones(len(ar)), x], ar["measured_s"].to_numpy(), rcond=None)
    eta_nv = 1.0 / (ar_slope * gpu.nvlink_bandwidth)
    return replace(
        gpu,
        hbm_efficiency=float(min(eta_m, 1.0)),
        compute_efficiency=float(min(eta_c, 1.0)),
        kernel_overhead_s=t0,
        nvlink_efficiency=float(min(eta_nv, 1.0)),
        allreduce_latency_s=max(float(lat), 0.0),
    )


# ---------------------------------------------------------------------------------------------------
# The step-time model's error against measurement, per (GPU, model)
# ---------------------------------------------------------------------------------------------------

#: Token-count buckets of the error table: (label, first, last) [tokens in the step].
ERROR_BUCKETS: tuple[tuple[str, int, int], ...] = (
    ("1-64 (decode)", 1, 64),
    ("65-512 (ridge)", 65, 512),
    ("513-4096 (prefill)", 513, 4096),
    ("4097-32768 (long prefill)", 4097, 32768),
)


def _measured_allreduce(allreduce: pd.DataFrame, workers: int, size_bytes: np.ndarray) -> np.ndarray:
    """Measured all-reduce seconds at each size, interpolated linearly between the profile's sizes
    (median over repeated runs); NaN outside the measured range."""
    runs = allreduce[allreduce["workers"] == workers].groupby("size_bytes")["measured_s"].median()
    if runs.empty:
        return np.full(len(size_bytes), np.nan)
    sizes, times = runs.index.to_numpy(dtype=float), runs.to_numpy()
    out = np.interp(size_bytes, sizes, times)
    return np.where((size_bytes >= sizes[0]) & (size_bytes <= sizes[-1]), out, np.nan)


def step_time_errors(gpu_name: str, model_name: str, statistic: str = "median") -> pd.DataFrame:
    """The token-proportional part of one layer's step time, modelled and measured, per (TP, tokens).

    Measured (Vidur, :data:`VIDUR_PROFILES`): the sum of the profiled operators of one layer
    (:data:`VIDUR_LAYER_OPS`) plus two all-reduces of the layer's activations (tokens x hidden x
    dtype bytes) interpolated in Vidur's single-node all-reduce profile of that GPU
    (:data:`VIDUR_ALLREDUCE`). Rows whose message lies beyond the all-reduce profile (64 MiB) are
    dropped. Modelled: what :func:`mixed_step_times` charges per layer for the same tokens with no
    attention (a decode step of ``tokens`` sequences with no cached context, minus its LM head, over
    ``n_layers``) on the registered GPU's shipped constants.

    Columns: ``gpu``, ``model``, ``profile`` (the profiled model), ``tp``, ``tokens``, ``measured_s``,
    ``model_s`` (seconds per layer), ``rel_error`` (model / measured - 1), ``held_out`` (False only for
    the rows the GPU's constants were fitted on: its calibration model -- Llama-2-70B -- at TP 1 and 2).
    Reads the profiles with :func:`kvdro.datasets.fetch` (``KVDRO_DATA_DIR``). ValueError names an
    unknown GPU or model, or a pair with no profile.
    """
    from kvdro import datasets

    gpu, model = gpu_by_name(gpu_name), model_by_name(model_name)
    key = (gpu_name.strip().lower(), model_name.strip().lower())
    if key not in VIDUR_PROFILES:
        raise ValueError(f"gpu_name, model_name: no Vidur profile of {key}; profiled pairs: {sorted(VIDUR_PROFILES)}")
    dataset, profiled = VIDUR_PROFILES[key]
    ops = read_vidur_linear(datasets.fetch(dataset), statistic, VIDUR_LAYER_OPS)
    allreduce = read_vidur_allreduce(datasets.fetch(VIDUR_ALLREDUCE[key[0]]), statistic)
    # some token counts are profiled twice (e.g. 2,048 and 4,096): one median per operator, then the sum
    per_op = ops.groupby(["tp", "tokens", "operator"], as_index=False)["measured_s"].median()
    layer = per_op.groupby(["tp", "tokens"], as_index=False)["measured_s"].sum()
    tp_all, tokens = layer["tp"].to_numpy(), layer["tokens"].to_numpy(dtype=float)
    measured = layer["measured_s"].to_numpy().copy()
    modelled = np.empty(len(layer))
    act = model.dtype_bytes * tokens * model.hidden
    for tp in np.unique(tp_all):
        rows = tp_all == tp
        if tp > 1:
            measured[rows] += 2 * _measured_allreduce(allreduce, int(tp), act[rows])
        m = tokens[rows]
        total = mixed_step_times(model, gpu, int(tp), 1, np.zeros(len(m)), m, np.zeros(len(m)))
        head = _mixed_step_core(model, gpu, int(tp), 1, 0.0 * m, 0.0 * m, 0.0 * m, m, 0.0 * m, 0.0 * m, _Vector)
        modelled[rows] = (total - head) / model.n_layers
    keep = np.isfinite(measured)
    out = pd.DataFrame(
        {
            "gpu": key[0], "model": key[1], "profile": profiled,
            "tp": tp_all[keep].astype("int64"), "tokens": tokens[keep].astype("int64"),
            "measured_s": measured[keep], "model_s": modelled[keep],
        }
    )
    out["rel_error"] = out["model_s"] / out["measured_s"] - 1.0
    out["held_out"] = ~((out["model"] == "llama-2-70b") & out["tp"].isin([1, 2]))
    return out


def step_time_error_table(
    pairs: tuple[tuple[str, str], ...] | None = None,
    statistic: str = "median",
    by: tuple[str, ...] = ("gpu", "model", "profile", "tp"),
) -> pd.DataFrame:
    """Median and worst relative error of the step-time model against Vidur's measurements, one row per
    (GPU, model, TP, token bucket): the tidy error table of chapter 4.

    ``pairs``: (GPU, model) registry names (default: every profiled pair, :data:`VIDUR_PROFILES`).
    ``by``: the columns of :func:`step_time_errors` to group by before the token bucket (e.g.
    ``("tp",)`` pools every pair). Columns: those of ``by``, ``bucket`` (:data:`ERROR_BUCKETS`), ``n``
    (measured token counts), ``median_error`` (signed median of model / measured - 1),
    ``median_abs_error``, ``worst_abs_error`` (the largest), ``held_out`` (no row of the cell was
    used to fit the GPU's constants). Errors come from :func:`step_time_errors`.
    """
    pairs = tuple(VIDUR_PROFILES) if pairs is None else tuple(pairs)
    by = tuple(by)
    allowed = ("gpu", "model", "profile", "tp", "held_out")
    if not set(by) <= set(allowed):
        raise ValueError(f"by must name columns among {allowed}, got {by!r}")
    rows = pd.concat([step_time_errors(g, m, statistic) for g, m in pairs], ignore_index=True)
    edges = [b[1] - 1 for b in ERROR_BUCKETS] + [ERROR_BUCKETS[-1][2]]
    rows["bucket"] = pd.cut(rows["tokens"], edges, labels=[b[0] for b in ERROR_BUCKETS])
    rows["abs_error"] = rows["rel_error"].abs()
    rows["held_out_row"] = rows["held_out"]
    table = (
        rows.groupby([*by, "bucket"], observed=True, sort=False)
        .agg(
            n=("rel_error", "size"),
            median_error=("rel_error", "median"),
            median_abs_error=("abs_error", "median"),
            worst_abs_error=("abs_error", "max"),
            held_out=("held_out_row", "all"),
        )
        .reset_index()
    )
    table["bucket"] = table["bucket"].astype(str)
    return table
