"""The trace's prefix keys for ``simulate(..., prefix_keys=)``: checked, then split per engine.

A trace that carries block hashes (Mooncake's ``hash_ids``, one id per 512-token prompt block) drives
the prefix caches of ``vllm-v1`` (automatic prefix caching) and ``sglang`` (the radix cache):
:func:`kvdro.datasets.prefix_block_keys` turns each 512-token hash into 32 keys of 16-token blocks
(the simulator's block, vLLM's default ``block_size``), one per *full* 16-token block of the prompt;
two requests share a key iff they share that Mooncake block and the sub-block in it, so a shared key
is a shared prefix up to that block. Without keys (the default) nothing is shared and every preset
runs exactly as before. vLLM v0's prefix model (a per-class cached prefix of the deployment,
``Deployment.prefix_tokens``) is another input: it knows no per-request hashes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvdro.sim.scheduler import BLOCK_TOKENS

__all__ = ["check_prefix_keys", "keys_for_rows"]


def check_prefix_keys(prefix_keys, trace: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """``prefix_keys`` as CSR arrays ``(offsets, keys)`` aligned with the rows of ``trace``, or None.

    Accepts None (off), ``"hash_ids"`` (computed from the trace's ``hash_ids`` column by
    :func:`kvdro.datasets.prefix_block_keys` at 16 tokens a block), or the pair that function
    returns: ``offsets`` int[n + 1] from 0, non-decreasing, ending at ``len(keys)``; request ``r``'s
    keys ``keys[offsets[r]:offsets[r + 1]]``, at most ``input_tokens // 16`` of them (full blocks).
    Raises ValueError naming ``prefix_keys``."""
    if prefix_keys is None:
        return None
    if isinstance(prefix_keys, str):
        if prefix_keys != "hash_ids":
            raise ValueError(f"prefix_keys: must be None, 'hash_ids' or (offsets, keys), got {prefix_keys!r}")
        if "hash_ids" not in trace.columns:
            raise ValueError("prefix_keys: 'hash_ids' needs a trace with a 'hash_ids' column (a Mooncake trace)")
        from kvdro.datasets import prefix_block_keys

        return prefix_block_keys(trace, BLOCK_TOKENS)
    if not isinstance(prefix_keys, tuple) or len(prefix_keys) != 2:
        raise ValueError("prefix_keys: must be None, 'hash_ids' or a pair (offsets, keys) "
                         "(kvdro.datasets.prefix_block_keys)")
    offsets, keys = (np.asarray(a) for a in prefix_keys)
    if offsets.dtype.kind not in "iu" or keys.dtype.kind not in "iu" or offsets.ndim != 1 or keys.ndim != 1:
        raise ValueError("prefix_keys: offsets and keys must be 1-D integer arrays")
    n = len(trace)
    if offsets.size != n + 1 or offsets[0] != 0 or offsets[-1] != keys.size or np.any(np.diff(offsets) < 0):
        raise ValueError(f"prefix_keys: offsets must rise from 0 to len(keys) ({keys.size}) in {n + 1} entries "
                         f"(one per trace row, plus one); got {offsets.size} entries")
    full = trace["input_tokens"].to_numpy(dtype=np.int64) // BLOCK_TOKENS
    over = np.diff(offsets) > full
    if over.any():
        r = int(np.flatnonzero(over)[0])
        raise ValueError(f"prefix_keys: row {r} has {int(np.diff(offsets)[r])} keys for {int(full[r])} full "
                         f"{BLOCK_TOKENS}-token prompt blocks")
    return offsets.astype(np.int64), keys.astype(np.int64)


def keys_for_rows(csr: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    """The keys of trace rows ``rows`` (one engine's requests, in its order): one array per request."""
    offsets, keys = csr
    return [keys[offsets[r]:offsets[r + 1]] for r in rows.tolist()]
