"""Issue 33's datasets: the Mooncake traces (loader, prefix block keys) and ServeGen's DeepSeek-R1
statistics (schema, the reasoning workload generator), checked against their READMEs' figures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvdro import datasets, servegen, workload

MOONCAKE = "mooncake-traces"
SERVEGEN = "servegen-deepseek-r1"


def _need(data_dir: Path, folder: str, *files: str) -> Path:
    root = data_dir / folder
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        pytest.skip(f"{folder} not in KVDRO_DATA_DIR ({data_dir}): missing {missing[:3]}")
    return root


@pytest.fixture(scope="module")
def mooncake_dir(data_dir):
    return _need(data_dir, MOONCAKE, "conversation_trace.jsonl", "synthetic_trace.jsonl")


@pytest.fixture(scope="module")
def servegen_dir(data_dir):
    return _need(data_dir, SERVEGEN, *datasets.SERVEGEN_R1_SHA256)


@pytest.fixture(scope="module")
def mooncake(mooncake_dir, data_dir):
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    yield {n: datasets.load_trace(n) for n in ("mooncake-conversation", "mooncake-synthetic")}
    mp.undo()


@pytest.fixture(scope="module")
def r1_day(servegen_dir, data_dir):
    """One day of the R1 workload at production rate (about 1.4 M requests)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    yield servegen.servegen_r1(86_400, rng=np.random.default_rng(2025))
    mp.undo()


# --------------------------------------------------------------------------- Mooncake: README figures

#: ../shared/data/mooncake-traces/README.md: requests, span [s], inputs mean/median/p99/max,
#: outputs mean/median/p99/max, share of repeated blocks.
README = {
    "mooncake-conversation": (12_031, 3_537, (12_035, 6_909, 85_401, 126_195), (343, 350, 1_120, 2_000), 0.366),
    "mooncake-synthetic": (3_993, 1_022, (15_325, 11_587, 66_458, 191_378), (149, 69, 769, 893), 0.64),
}


@pytest.mark.parametrize("name", sorted(README))
def test_mooncake_table_matches_readme(mooncake, name):
    df = mooncake[name]
    row = datasets.trace_summary(df)
    n, span, inp, out, reuse = README[name]
    assert row["requests"] == n == len(df)
    assert abs(row["span_s"] - span) < 1.0
    for side, (mean, p50, p99, top) in (("input", inp), ("output", out)):
        assert abs(row[f"{side}_mean"] - mean) < 0.5
        assert (row[f"{side}_p50"], row[f"{side}_p99"], row[f"{side}_max"]) == (p50, p99, top)
    assert abs(row["prefix_reuse"] - reuse) < 5e-3
    assert list(df.columns) == [*datasets.SCHEMA, "hash_ids"]
    assert set(df["request_class"]) == {datasets.REGISTRY[name].request_class}
    assert df.attrs["source"] == name and df.attrs["dropped_failed"] == 0


def test_mooncake_arrivals_spread_inside_their_millisecond(mooncake, mooncake_dir):
    df = mooncake["mooncake-conversation"]
    raw = [json.loads(line)["timestamp"] for line in (mooncake_dir / "conversation_trace.jsonl").open()]
    t_ms = df["arrival_s"].to_numpy() * 1000.0
    assert np.all(np.diff(t_ms) > 0)  # every request its own instant
    assert np.array_equal(np.floor(t_ms + 1e-6).astype(np.int64), np.array(raw))  # none leaves its ms
    assert df.attrs["distinct_timestamps"] == 1_180 == np.unique(raw).size
    # file order kept: the lengths come in the file's order
    first = json.loads((mooncake_dir / "conversation_trace.jsonl").open().readline())
    assert df["input_tokens"].iloc[0] == first["input_length"] and df["hash_ids"].iloc[0] == tuple(first["hash_ids"])


def test_spread_within_millisecond_is_even_and_keeps_order():
    out = datasets.spread_within_millisecond(np.array([5, 5, 5, 7, 2]))
    assert np.allclose(out, [5.0, 5 + 1 / 3, 5 + 2 / 3, 7.0, 2.0])


def test_mooncake_loaders_clip_nothing(mooncake):
    conv = mooncake["mooncake-conversation"]
    assert (conv["input_tokens"] > 4096).mean() > 0.5  # far beyond Llama-2's window: kept as they are
    assert all(len(h) == -(-n // 512) for h, n in zip(conv["hash_ids"], conv["input_tokens"]))


# --------------------------------------------------------------------------- prefix block keys


def test_prefix_block_keys_on_a_small_trace():
    tr = pd.DataFrame({
        "arrival_s": [0.0, 1.0, 2.0], "input_tokens": [1030, 600, 15], "output_tokens": [1, 1, 1],
        "request_class": ["x"] * 3, "hash_ids": [(7, 8, 9), (7, 3), (4,)],
    })
    offsets, keys = datasets.prefix_block_keys(tr)
    assert offsets.dtype == np.int64 and keys.dtype == np.int64
    assert offsets.tolist() == [0, 64, 64 + 37, 64 + 37]  # full 16-token blocks: 1030 // 16, 600 // 16, 0
    a, b = keys[offsets[0]:offsets[1]], keys[offsets[1]:offsets[2]]
    assert a.tolist() == [7 * 32 + j for j in range(32)] + [8 * 32 + j for j in range(32)]
    assert np.array_equal(a[:32], b[:32])  # shared block 7: 32 shared keys
    assert not set(a[32:].tolist()) & set(b[32:].tolist())  # blocks 8 and 3 differ: no key in common
    o32, k32 = datasets.prefix_block_keys(tr, block_tokens=32)
    assert o32.tolist() == [0, 32, 50, 50] and k32[:16].tolist() == [7 * 16 + j for j in range(16)]


def test_prefix_block_keys_share_iff_hash_block_shared(mooncake):
    tr = mooncake["mooncake-synthetic"]
    offsets, keys = datasets.prefix_block_keys(tr)
    inp = tr["input_tokens"].to_numpy()
    assert np.array_equal(np.diff(offsets), inp // 16)
    # key -> (hash id, sub-block) is one-to-one, so distinct keys = distinct (id, sub-block) pairs
    ids = np.concatenate([np.repeat(np.array(h, dtype=np.int64), 32)[: n // 16] for h, n in zip(tr["hash_ids"], inp)])
    sub = np.concatenate([np.arange(n // 16) % 32 for n in inp])
    assert np.array_equal(keys // 32, ids) and np.array_equal(keys % 32, sub)
    # the first request r that reuses an earlier request q's first block shares 32 keys per shared block
    # (fewer in a block that is the last, partial, one of either prompt)
    h, first = tr["hash_ids"], {}
    r = next(i for i in range(len(tr)) if first.setdefault(h.iloc[i][0], i) != i)
    q = first[h.iloc[r][0]]
    shared = set(h.iloc[q]) & set(h.iloc[r])
    kq, kr = set(keys[offsets[q]:offsets[q + 1]].tolist()), set(keys[offsets[r]:offsets[r + 1]].tolist())
    assert shared and len(kq & kr) == sum(min(32, inp[q] // 16 - 32 * h.iloc[q].index(b),
                                              inp[r] // 16 - 32 * h.iloc[r].index(b)) for b in shared)


@pytest.mark.parametrize("name", sorted(README))
def test_mooncake_hash_ids_are_prefix_hashes(mooncake, name):
    """What prefix_block_keys relies on: an id sits at one position and follows one id, always, so an
    equal id means an equal prefix up to that block."""
    position, before = {}, {}
    for ids in mooncake[name]["hash_ids"]:
        for i, x in enumerate(ids):
            assert position.setdefault(x, i) == i and before.setdefault(x, ids[i - 1] if i else -1) == (ids[i - 1] if i else -1)


@pytest.mark.parametrize("bad", [0, 3, 1024, -16, 16.0, True])
def test_prefix_block_keys_refuses_bad_block_size(bad):
    tr = pd.DataFrame({"input_tokens": [16], "hash_ids": [(1,)]})
    with pytest.raises(ValueError, match="block_tokens"):
        datasets.prefix_block_keys(tr, block_tokens=bad)


def test_prefix_block_keys_needs_hash_ids():
    with pytest.raises(ValueError, match="trace: .*hash_ids"):
        datasets.prefix_block_keys(pd.DataFrame({"input_tokens": [16]}))
    with pytest.raises(ValueError, match="request 0 has 1 hash ids for 600"):
        datasets.prefix_block_keys(pd.DataFrame({"input_tokens": [600], "hash_ids": [(1,)]}))


# --------------------------------------------------------------------------- Mooncake: bad files

GOOD = {"timestamp": 3, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}


@pytest.mark.parametrize(
    "line, match",
    [
        ({k: v for k, v in GOOD.items() if k != "output_length"}, r"line 2: missing field\(s\) \['output_length'\]"),
        ({**GOOD, "input_length": 0}, r"line 2: field 'input_length' must be an integer in \[1"),
        ({**GOOD, "input_length": 600.5}, "line 2: field 'input_length'"),
        ({**GOOD, "output_length": True}, "line 2: field 'output_length'"),
        ({**GOOD, "timestamp": -1}, "line 2: field 'timestamp'"),
        ({**GOOD, "output_length": 2**60}, r"line 2: field 'output_length' must be an integer in \[0, 2\^53\]"),
        ({**GOOD, "hash_ids": [0]}, r"line 2: field 'hash_ids' has 1 ids for input_length 600; expected ceil"),
        ({**GOOD, "hash_ids": [0, "a"]}, "line 2: field 'hash_ids' must be a list of non-negative integers"),
        ({**GOOD, "extra": 1}, r"line 2: unknown field\(s\) \['extra'\]"),
        ("[1, 2]", "line 2: not a JSON object"),
        ("{not json", "line 2: not a JSON object"),
    ],
)
def test_bad_mooncake_line_names_file_line_and_field(tmp_path, line, match):
    path = tmp_path / "trace.jsonl"
    second = line if isinstance(line, str) else json.dumps(line)
    path.write_text(json.dumps(GOOD) + "\n" + second + "\n")
    with pytest.raises(ValueError, match=match) as info:
        datasets.read_mooncake_jsonl(path, "conversation")
    assert str(path) in str(info.value)


def test_empty_mooncake_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    with pytest.raises(ValueError, match="empty"):
        datasets.read_mooncake_jsonl(path, "conversation")


def _tampered_copy(src: Path, dst: Path) -> str:
    """Copy ``src`` to ``dst`` with one digit changed (same size); the copy's sha256."""
    data = bytearray(src.read_bytes())
    i = data.index(b"1")
    data[i:i + 1] = b"2"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))
    return hashlib.sha256(bytes(data)).hexdigest()


def test_tampered_mooncake_copy_is_refused_naming_its_hash(mooncake_dir, tmp_path, monkeypatch):
    copy = tmp_path / "data" / MOONCAKE / "conversation_trace.jsonl"
    digest = _tampered_copy(mooncake_dir / "conversation_trace.jsonl", copy)
    monkeypatch.setenv("KVDRO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="sha256 mismatch") as info:
        datasets.load_trace("mooncake-conversation")
    msg = str(info.value)
    assert digest in msg and datasets.REGISTRY["mooncake-conversation"].sha256 in msg and str(copy) in msg


# --------------------------------------------------------------------------- ServeGen: files and schema


def test_servegen_manifest_matches_readme_hash(servegen_dir):
    names = sorted(n for n in datasets.SERVEGEN_R1_SHA256 if n.endswith("-dataset.json")) + sorted(
        n for n in datasets.SERVEGEN_R1_SHA256 if n.endswith("-trace.csv"))
    assert len(names) == 146 == 2 * 73
    h = hashlib.sha256()
    for n in names:
        h.update((servegen_dir / n).read_bytes())
    assert h.hexdigest() == datasets.SERVEGEN_R1_SHA256_ALL


def test_tampered_servegen_file_is_refused_naming_file_and_hash(servegen_dir, tmp_path, monkeypatch):
    folder = tmp_path / "data" / SERVEGEN
    folder.mkdir(parents=True)
    for name in datasets.SERVEGEN_R1_SHA256:
        (folder / name).symlink_to(servegen_dir / name)
    target = folder / "chunk-5-trace.csv"
    target.unlink()
    digest = _tampered_copy(servegen_dir / "chunk-5-trace.csv", target)
    monkeypatch.setenv("KVDRO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="sha256 mismatch") as info:
        datasets.servegen_r1_files()
    assert digest in str(info.value) and "chunk-5-trace.csv" in str(info.value)


DATASET_OK = {"input_tokens": "{5: 0.5, 9: 0.5}", "output_tokens": "{100: 1.0}", "reason_ratio": "{0.5: 1.0}"}


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("output_tokens", "{100: 0.5, 200: 0.4}", "field 'output_tokens': probabilities sum to 0.9"),
        ("output_tokens", "{100: 1.5, 200: -0.5}", "field 'output_tokens' has a negative"),
        ("input_tokens", "__import__('os').getcwd()", "field 'input_tokens' is not a Python dict literal"),
        ("input_tokens", "[1, 2]", "field 'input_tokens' is not a dict"),
        ("input_tokens", "{0: 1.0}", r"field 'input_tokens' has a token count that is not an integer in \[1"),
        ("output_tokens", "{10.5: 1.0}", "field 'output_tokens' has a token count that is not an integer"),
        ("output_tokens", "{'a': 1.0}", "field 'output_tokens' has a key or probability that is not a number"),
        ("reason_ratio", "{1.5: 1.0}", r"field 'reason_ratio' has a ratio outside \[0, 1\]"),
        ("output_tokens", "{}", r"field\(s\) \['output_tokens'\] are empty"),
    ],
)
def test_malformed_servegen_distribution_names_file_and_field(tmp_path, field, value, match):
    path = tmp_path / "chunk-0-dataset.json"
    path.write_text(json.dumps({"0": DATASET_OK, "21600": {**DATASET_OK, field: value}}))
    with pytest.raises(ValueError, match=match) as info:
        servegen.read_servegen_dataset(path)
    assert str(path) in str(info.value) and "window '21600'" in str(info.value)


def test_servegen_dataset_reads_a_good_file(tmp_path):
    path = tmp_path / "chunk-0-dataset.json"
    path.write_text(json.dumps({"0": DATASET_OK, "21600": {k: "{}" for k in DATASET_OK}}))
    inputs, outputs = servegen.read_servegen_dataset(path)
    assert list(inputs) == [0] and inputs[0].values.tolist() == [5, 9] and np.allclose(inputs[0].cdf, [0.5, 1.0])


def _trace_csv(path: Path, row_10: str) -> None:
    rows = [f"{600 * i},0,0,,0,0" for i in range(144)]
    rows[10] = row_10
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize(
    "row, match",
    [
        ("6000,0.1,2.0,Lognormal,1,1", "line 11: field 'family' is 'Lognormal'"),
        ("6000,0.1,2.0,,0,0", "line 11: field 'family' is empty but the rate is 0.1"),
        ("6000,0.1,2.0,Gamma,0,1", "line 11: field 'shape' of the Gamma law must be > 0"),
        ("6000,-0.1,2.0,Gamma,1,1", "line 11: field 'rate' must be finite and >= 0"),
        ("6000,x,2.0,Gamma,1,1", "line 11: field 'rate' is not a number"),
        ("6000,0.1,2.0,Gamma,1", "line 11: has 5 fields"),
        ("6600,0.1,2.0,Gamma,1,1", "line 11: field 't' is '6600'; expected 6000"),
    ],
)
def test_malformed_servegen_trace_names_file_line_and_field(tmp_path, row, match):
    path = tmp_path / "chunk-0-trace.csv"
    _trace_csv(path, row)
    with pytest.raises(ValueError, match=match) as info:
        servegen.read_servegen_trace(path)
    assert str(path) in str(info.value)


# --------------------------------------------------------------------------- ServeGen: the generator


def test_r1_day_matches_servegen_readme(r1_day):
    """ServeGen README: outputs mean ~1,527, median ~792, p90 ~3,432, p99 ~12,607, max 32,768, ~8 % >= 4 k."""
    out = r1_day["output_tokens"].to_numpy()
    assert abs(out.mean() / 1_527 - 1) < 0.03
    p50, p90, p99 = np.quantile(out, [0.5, 0.9, 0.99], method="inverted_cdf")
    assert abs(p50 / 792 - 1) < 0.05 and abs(p90 / 3_432 - 1) < 0.05 and abs(p99 / 12_607 - 1) < 0.05
    assert out.max() == 32_768 and abs((out >= 4096).mean() - 0.08) < 0.01
    expected = sum(float(c.rate.sum()) * servegen.WINDOW_S for c in servegen.load_servegen_r1())
    assert abs(len(r1_day) / expected - 1) < 0.02  # the published rates, about 1.38 M requests a day
    assert r1_day["arrival_s"].is_monotonic_increasing and r1_day["arrival_s"].iloc[-1] < 86_400
    assert list(r1_day.columns) == [*datasets.SCHEMA, "client"] and set(r1_day["request_class"]) == {"reasoning"}
    assert r1_day["client"].nunique() == 73


def test_r1_outputs_are_bimodal(r1_day):
    """Two modes on a log axis, near 500 and 1,400 tokens, with a dip near 850 between them."""
    out = r1_day["output_tokens"].to_numpy()
    share = lambda lo, hi: float(((out >= lo) & (out < hi)).mean())  # noqa: E731 (bins of equal log width)
    low, dip, high = share(443, 577), share(752, 980), share(1278, 1665)
    assert low > 1.4 * dip and high > 1.4 * dip


def test_r1_lengths_match_the_rate_weighted_law(servegen_dir, r1_day):
    v, p = servegen.servegen_r1_lengths("output_tokens")
    assert abs(p.sum() - 1) < 1e-12 and abs(float(v @ p) - 1_527) < 1
    cdf = np.cumsum(p)
    emp = np.searchsorted(np.sort(r1_day["output_tokens"].to_numpy()), v, side="right") / len(r1_day)
    assert np.max(np.abs(emp - cdf)) < 0.02  # Kolmogorov distance of the day's draw to the law


def test_r1_input_and_output_drawn_independently(r1_day):
    """Within one client and 6-h window the two lengths are independent (ServeGen's sampler gives a rank
    correlation of exactly 1); over the whole trace the clients' mixture correlates them."""
    df = r1_day.assign(window=r1_day["arrival_s"] // servegen.DATASET_WINDOW_S)
    big = df.groupby(["client", "window"]).size().idxmax()
    one = df[(df["client"] == big[0]) & (df["window"] == big[1])]
    assert len(one) > 20_000
    rho = one[["input_tokens", "output_tokens"]].rank().corr().iloc[0, 1]
    assert abs(rho) < 4 / np.sqrt(len(one))


def test_r1_is_seeded_scaled_and_wraps_the_day(servegen_dir):
    a = workload.servegen_r1(1_800, rng=np.random.default_rng(1))
    b = workload.servegen_r1(1_800, rng=np.random.default_rng(1))
    c = workload.servegen_r1(1_800, rng=np.random.default_rng(2))
    pd.testing.assert_frame_equal(a, b)
    assert not a["arrival_s"].equals(c["arrival_s"])
    double = workload.servegen_r1(1_800, rate_scale=2.0, rng=np.random.default_rng(1))
    assert 1.6 < len(double) / len(a) < 2.4
    late = workload.servegen_r1(3_600, start_s=86_400 - 1_800, rng=np.random.default_rng(3))
    assert late.attrs["start_s"] == 84_600 and late["arrival_s"].iloc[-1] > 1_800  # ran past midnight


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": float("nan")}, "duration_s"),
        ({"duration_s": 60, "rate_scale": -1}, "rate_scale"),
        ({"duration_s": 60, "rate_scale": True}, "rate_scale"),
        ({"duration_s": 60, "start_s": -5}, "start_s"),
        ({"duration_s": 60, "rng": 3}, "rng"),
    ],
)
def test_r1_bad_arguments_are_named(kwargs, match):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}
    duration = kwargs.pop("duration_s")
    with pytest.raises(ValueError, match=match):
        servegen.servegen_r1(duration, **kwargs)
