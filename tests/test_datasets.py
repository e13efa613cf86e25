"""kvdro.datasets: registry, resolution order, offline failure, tidy loaders, bad-file errors."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pooch
import pytest
import requests

from kvdro import datasets

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.fixture
def empty_dirs(tmp_path, monkeypatch):
    """KVDRO_DATA_DIR and the pooch cache both point at empty folders; downloads fail."""
    data, cache = tmp_path / "data", tmp_path / "cache"
    data.mkdir()
    cache.mkdir()
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data))
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(cache))
    monkeypatch.delenv(datasets.ALLOW_UNVERIFIED_ENV, raising=False)
    calls = []

    def offline(url, **kwargs):
        calls.append(url)
        raise requests.exceptions.ConnectionError(f"Max retries exceeded with url: {url}")

    monkeypatch.setattr(pooch, "retrieve", offline)
    return data, cache, calls


# --------------------------------------------------------------------------- real shared files


@pytest.fixture(scope="module")
def real(data_dir):
    mp = pytest.MonkeyPatch()
    mp.setenv("KVDRO_DATA_DIR", str(data_dir))
    yield {n: datasets.load_trace(n) for n in ("azure-2023-code", "azure-2023-conv")}
    mp.undo()


def test_real_azure_schema_and_counts(real):
    code, conv = real["azure-2023-code"], real["azure-2023-conv"]
    assert len(code) == 8819 and len(conv) == 19366
    for df, cls in ((code, "code"), (conv, "conversation")):
        assert list(df.columns) == list(datasets.SCHEMA)
        assert df["arrival_s"].dtype == np.float64
        assert df["input_tokens"].dtype == np.int64 and df["output_tokens"].dtype == np.int64
        assert set(df["request_class"]) == {cls}
        assert df["arrival_s"].iloc[0] == 0.0 and df["arrival_s"].is_monotonic_increasing
        assert 3400 < df["arrival_s"].iloc[-1] < 3600  # about an hour
        assert df.attrs["source"].startswith("azure-2023-")


def test_real_azure_summary_figures(real):
    code = real["azure-2023-code"]["output_tokens"].to_numpy()
    conv = real["azure-2023-conv"]["output_tokens"].to_numpy()
    assert np.median(code) == 13 and code.max() == 1899 and code.min() == 6
    assert np.median(conv) == 129 and conv.max() == 1000
    assert real["azure-2023-conv"]["input_tokens"].max() == 14050
    assert abs(code.mean() - 27.88) < 0.01 and abs(conv.mean() - 211.13) < 0.01


def test_fetch_vidur_files(data_dir, monkeypatch):
    monkeypatch.setenv("KVDRO_DATA_DIR", str(data_dir))
    for name in ("vidur-a100-llama2-70b-mlp", "vidur-a100-allreduce"):
        path = datasets.fetch(name)
        assert path.name == datasets.REGISTRY[name].filename
        assert datasets.sha256_of(path) == datasets.REGISTRY[name].sha256
    with pytest.raises(ValueError, match="not a request trace"):
        datasets.load_trace("vidur-a100-allreduce")


# --------------------------------------------------------------------------- resolution order


def test_offline_without_local_copy_fails_fast_with_one_clear_error(empty_dirs):
    _, cache, calls = empty_dirs
    with pytest.raises(FileNotFoundError) as info:
        datasets.load_trace("azure-2023-conv")
    msg = str(info.value)
    src = datasets.REGISTRY["azure-2023-conv"]
    assert src.filename in msg and "KVDRO_DATA_DIR" in msg and src.url in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__  # raised from None
    assert calls == [src.url]  # exactly one attempt: no retries


def test_unknown_name_is_value_error():
    with pytest.raises(ValueError, match="name"):
        datasets.fetch("azure-2099")


def test_local_copy_found_in_any_subfolder(empty_dirs, data_dir):
    data, _, calls = empty_dirs
    nested = data / "somewhere" / "deeper"
    nested.mkdir(parents=True)
    shutil.copy(data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv", nested)
    assert datasets.fetch("azure-2023-code") == nested / "AzureLLMInferenceTrace_code.csv"
    assert calls == []


def test_cache_used_before_download(empty_dirs, data_dir, monkeypatch):
    data, cache, calls = empty_dirs
    monkeypatch.delenv("KVDRO_DATA_DIR")
    (cache / "azure-llm-2023").mkdir()
    shutil.copy(data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv", cache / "azure-llm-2023")
    df = datasets.load_trace("azure-2023-code")
    assert len(df) == 8819 and calls == []


def test_hash_mismatch_names_file_both_hashes_and_remedy(empty_dirs):
    data, _, _ = empty_dirs
    (data / "azure-llm-2023").mkdir()
    bad = data / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
    bad.write_text(AZURE_HEADER + "2023-11-16 18:17:03.9799600,10,5\n")
    with pytest.raises(ValueError) as info:
        datasets.fetch("azure-2023-code")
    msg = str(info.value)
    assert str(bad) in msg and datasets.REGISTRY["azure-2023-code"].sha256 in msg
    assert datasets.sha256_of(bad) in msg and "delete it" in msg


def test_successful_download_goes_to_cache_and_is_verified(empty_dirs, data_dir, monkeypatch):
    data, cache, _ = empty_dirs
    real_file = data_dir / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    seen = {}

    def fake_retrieve(url, known_hash=None, fname=None, path=None, downloader=None, **_):
        seen.update(url=url, known_hash=known_hash, downloader=downloader)
        Path(path).mkdir(parents=True, exist_ok=True)
        return str(shutil.copy(real_file, Path(path) / fname))

    monkeypatch.setattr(pooch, "retrieve", fake_retrieve)
    path = datasets.fetch("azure-2023-conv")
    assert path == cache / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    assert seen["known_hash"] == "sha256:" + datasets.REGISTRY["azure-2023-conv"].sha256
    assert seen["downloader"].kwargs["timeout"][0] <= 10  # short connect timeout


def test_download_with_wrong_hash_is_a_clear_value_error(empty_dirs, monkeypatch):
    def mismatched(url, **_):
        raise ValueError("SHA256 hash of downloaded file (abc) does not match the known hash")

    monkeypatch.setattr(pooch, "retrieve", mismatched)
    with pytest.raises(ValueError, match="upstream file changed"):
        datasets.fetch("azure-2023-code")


# --------------------------------------------------------------------------- unverified sources


def test_azure_2024_unverified_with_row_limit(empty_dirs):
    data, _, _ = empty_dirs
    rows = [
        "2024-05-10 00:00:00.009930+00:00,4808,10",
        "2024-05-10 00:00:00.031002+00:00,3180,8",
        "2024-05-10 00:00:01.5+00:00,110,27",
        "2024-05-10 00:00:02.25+00:00,7433,14",
    ]
    path = data / "AzureLLMInferenceTrace_conv_1week.csv"
    path.write_text(AZURE_HEADER + "\n".join(rows) + "\n")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert datasets.REGISTRY["azure-2024-conv"].sha256 is None
    with pytest.warns(datasets.UnverifiedDataWarning, match=f"sha256 is {digest}"):
        df = datasets.load_trace("azure-2024-conv", nrows=3, allow_unverified=True)
    assert len(df) == 3 and df["request_class"].eq("conversation").all()
    np.testing.assert_allclose(df["arrival_s"], [0.0, 0.021072, 1.49007])
    with pytest.raises(ValueError, match="nrows"):
        datasets.load_trace("azure-2024-conv", nrows=0)


@pytest.mark.parametrize("name", ["azure-2024-code", "azure-2024-conv"])
def test_unhashed_file_without_opt_in_is_an_error_that_prints_its_hash(empty_dirs, name):
    data, _, calls = empty_dirs
    src = datasets.REGISTRY[name]
    assert src.sha256 is None
    path = data / src.subfolder / src.filename
    path.parent.mkdir(parents=True)
    path.write_text("any content\n")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    for call in (lambda: datasets.fetch(name), lambda: datasets.load_trace(name)):
        with pytest.raises(datasets.UnverifiedDataError) as info:
            call()
        message = str(info.value)
        assert digest in message and str(path) in message
        assert "allow_unverified=True" in message and datasets.ALLOW_UNVERIFIED_ENV in message
    assert isinstance(info.value, ValueError)
    with pytest.warns(datasets.UnverifiedDataWarning, match=digest):
        assert datasets.fetch(name, allow_unverified=True) == path
    assert calls == []


def test_unhashed_file_is_not_downloaded_without_opt_in(empty_dirs):
    _, _, calls = empty_dirs
    with pytest.raises(datasets.UnverifiedDataError, match="allow_unverified=True"):
        datasets.fetch("azure-2024-code")
    assert calls == []  # refused before any download
    with pytest.raises(FileNotFoundError):  # opted in: tries the download (offline here)
        datasets.fetch("azure-2024-code", allow_unverified=True)
    assert len(calls) == 1


def test_opt_in_argument_and_variable_are_validated(empty_dirs, monkeypatch):
    with pytest.raises(ValueError, match="allow_unverified"):
        datasets.fetch("azure-2024-code", allow_unverified="yes")
    monkeypatch.setenv(datasets.ALLOW_UNVERIFIED_ENV, "maybe")
    with pytest.raises(ValueError, match=datasets.ALLOW_UNVERIFIED_ENV):
        datasets.fetch("azure-2024-code")
    monkeypatch.setenv(datasets.ALLOW_UNVERIFIED_ENV, "0")
    with pytest.raises(datasets.UnverifiedDataError):
        datasets.fetch("azure-2024-code")
    # an explicit False wins over the variable
    monkeypatch.setenv(datasets.ALLOW_UNVERIFIED_ENV, "1")
    with pytest.raises(datasets.UnverifiedDataError):
        datasets.fetch("azure-2024-code", allow_unverified=False)


def _burstgpt_csv(path: Path, rows: list[str]) -> Path:
    header = "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    path.write_text(header + "\n".join(rows) + "\n")
    return path


def test_burstgpt_loader_drops_failed_requests_with_a_count(tmp_path):
    path = _burstgpt_csv(
        tmp_path / "BurstGPT_1.csv",
        [
            "5,1,0.9,ChatGPT,472,18,490,Conversation log",
            "7,2,2.1,GPT-4,1087,0,1087,Conversation log",  # failed
            "9,3,1.2,ChatGPT,120,245,365,API log",
            "12,1,3.3,GPT-4,35,412,447,API log",
            "6,4,0.5,ChatGPT,60,30,90,Conversation log",  # out of order on purpose
        ],
    )
    with pytest.warns(datasets.DroppedRequestsWarning, match="dropped 1 failed"):
        df = datasets.read_burstgpt_csv(path)
    assert df.attrs["dropped_failed"] == 1 and len(df) == 4
    assert list(df.columns) == list(datasets.SCHEMA)
    np.testing.assert_allclose(df["arrival_s"], [0.0, 1.0, 4.0, 7.0], rtol=0, atol=1e-9)
    assert list(df["request_class"]) == [
        "ChatGPT-Conversation log",
        "ChatGPT-Conversation log",
        "ChatGPT-API log",
        "GPT-4-API log",
    ]
    assert list(df["output_tokens"]) == [18, 30, 245, 412]


def test_burstgpt_registry_uses_the_lfs_media_address_and_pinned_hashes():
    """The raw address of an LFS-tracked file serves a pointer; the media address serves the data.
    Hashes and sizes are those the BurstGPT repository's LFS pointers publish."""
    pinned = {
        "burstgpt": ("BurstGPT_1.csv", "4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122", 52_283_111),
        "burstgpt-2": ("BurstGPT_2.csv", "44bf5942b03fca42c01a226a545ad3a750ec62688faecd67b6831c56a8928bf7", 144_819_209),
        "burstgpt-without-fails-1": ("BurstGPT_without_fails_1.csv",
                                     "a4d068a7113ec0290e74063a1b3447dc6001a30e4298eb313581b71006dda1f4", 51_429_517),
        "burstgpt-without-fails-2": ("BurstGPT_without_fails_2.csv",
                                     "56193aa9b2bb26128ded43d2d29a960df6bf5af062bcfc9b005f3fcaa4e6e501", 142_376_815),
    }
    for name, (filename, sha, size) in pinned.items():
        src = datasets.REGISTRY[name]
        assert (src.filename, src.sha256, src.size, src.kind) == (filename, sha, size, "burstgpt")
        assert src.url == f"https://media.githubusercontent.com/media/HPMLL/BurstGPT/main/data/{filename}"


LFS_POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122\n"
    "size 52283111\n"
)


def test_a_downloaded_lfs_pointer_is_named_as_such(empty_dirs):
    data, _, calls = empty_dirs
    path = data / "burstgpt" / "BurstGPT_1.csv"
    path.parent.mkdir()
    path.write_text(LFS_POINTER)  # what the raw.githubusercontent.com address serves (133 bytes)
    assert path.stat().st_size == 133
    for call in (lambda: datasets.fetch("burstgpt"), lambda: datasets.load_trace("burstgpt"),
                 lambda: datasets.read_burstgpt_csv(path)):
        with pytest.raises(ValueError, match="Git LFS pointer") as info:
            call()
        assert str(path) in str(info.value) and "52283111" in str(info.value)
    assert calls == []
    assert datasets.lfs_pointer(path)["oid"].endswith("e12122")
    # the same pointer under an Azure name (a pointer is never data, whatever it claims to be)
    azure = data / "AzureLLMInferenceTrace_code.csv"
    azure.write_text(LFS_POINTER)
    with pytest.raises(ValueError, match="Git LFS pointer"):
        datasets.read_azure_csv(azure, "code")


def test_a_truncated_pinned_file_is_a_size_mismatch(empty_dirs):
    data, _, calls = empty_dirs
    _burstgpt_csv(data / "BurstGPT_1.csv", ["5,1,0.9,ChatGPT,472,18,490,Conversation log"])
    with pytest.raises(ValueError, match=r"size mismatch.*52,283,111 bytes") as info:
        datasets.load_trace("burstgpt")
    assert str(data / "BurstGPT_1.csv") in str(info.value)
    assert calls == []


# --------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,10\n", r"missing column.*GeneratedTokens"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9,10,-5\n", r"'GeneratedTokens' has a negative"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9,10.5,5\n", r"'ContextTokens' has a non-integer"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9,ten,5\n", r"'ContextTokens' has a non-numeric"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9,10,5\nyesterday noon,3,4\n", r"'TIMESTAMP' has an unparseable"),
        # the case: an empty prompt, reported with the file's own column and row
        (AZURE_HEADER + "2023-11-16 18:17:03.9,0,5\n", r"'ContextTokens' has a token count below 1 .*: 0 at data row 0 \(line 2"),
        (AZURE_HEADER + "2023-11-16 18:17:03.9,7,5\n2023-11-16 18:17:04.9,3,-1\n", r"'GeneratedTokens' has a negative -1 at data row 1 \(line 3"),
    ],
)
def test_bad_azure_file_errors_name_file_and_column(tmp_path, body, match):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=match) as info:
        datasets.read_azure_csv(path, "code")
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ("soon,1,0.9,ChatGPT,472,18,490,Conversation log", r"'Timestamp' has an unparseable"),
        ("5,1,0.9,ChatGPT,-1,18,490,Conversation log", r"'Request tokens' has a negative"),
        ("5,1,0.9,ChatGPT,4,1.5,490,Conversation log", r"'Response tokens' has a non-integer"),
        ("5,1,0.9,ChatGPT,0,18,18,Conversation log", r"'Request tokens' has a token count below 1 .* data row 1 \(line 3"),
    ],
)
def test_bad_burstgpt_file_errors(tmp_path, row, match):
    path = _burstgpt_csv(tmp_path / "b.csv", ["4,1,0.9,ChatGPT,47,18,65,API log", row])
    with pytest.raises(ValueError, match=match):
        datasets.read_burstgpt_csv(path)


def test_burstgpt_missing_column(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens\n1,ChatGPT,5\n")
    with pytest.raises(ValueError, match=r"missing column.*Response tokens") as info:
        datasets.read_burstgpt_csv(path)
    assert str(path) in str(info.value)


def test_registry_is_read_only_and_complete():
    with pytest.raises(TypeError):
        datasets.REGISTRY["x"] = None  # type: ignore[index]
    for src in datasets.REGISTRY.values():
        assert src.url.startswith("https://") and src.filename
        assert src.sha256 is None or len(src.sha256) == 64
    assert {n for n, s in datasets.REGISTRY.items() if s.sha256 is None} == {
        "azure-2024-code",
        "azure-2024-conv",
    }


# --------------------------------------------------------------------------- sha256 memo (issue 36)


def _edit_in_place_keeping_size_and_mtime(path):
    st = path.stat()
    with path.open("r+b") as fh:
        fh.write(b"9")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_sha256_memo_sees_an_edit_that_keeps_size_and_mtime(tmp_path, monkeypatch):
    """The memo keys on inode and ctime too: os.utime can restore the mtime, not the ctime."""
    path = tmp_path / "trace.csv"
    path.write_bytes(b"1,2,3\n")
    monkeypatch.setattr(datasets, "RACY_NS", 0)  # memoise at once: the key alone must catch the edit
    first = datasets.sha256_of(path)
    assert any(key[0] == str(path.resolve()) for key in datasets._HASH_MEMO)
    time.sleep(0.05)  # past the file system's timestamp tick
    _edit_in_place_keeping_size_and_mtime(path)
    assert datasets.sha256_of(path) == hashlib.sha256(b"9,2,3\n").hexdigest() != first


def test_sha256_of_a_just_changed_file_is_not_memoised(tmp_path):
    """A file changed within RACY_NS of its hashing is re-hashed every time (an edit in the same
    timestamp tick keeps even the ctime)."""
    path = tmp_path / "trace.csv"
    path.write_bytes(b"1,2,3\n")
    first = datasets.sha256_of(path)
    assert not any(key[0] == str(path.resolve()) for key in datasets._HASH_MEMO)
    _edit_in_place_keeping_size_and_mtime(path)
    assert datasets.sha256_of(path) == hashlib.sha256(b"9,2,3\n").hexdigest() != first


def test_sha256_memo_serves_an_unchanged_file(tmp_path, monkeypatch):
    path = tmp_path / "trace.csv"
    path.write_bytes(b"1,2,3\n")
    monkeypatch.setattr(datasets, "RACY_NS", 0)
    first = datasets.sha256_of(path)
    monkeypatch.setattr(datasets.hashlib, "sha256", lambda: pytest.fail("re-hashed an unchanged file"))
    assert datasets.sha256_of(path) == first


def test_a_cache_folder_that_is_a_file_is_named_not_blamed_on_the_network(tmp_path, monkeypatch):
    """Issue 36: with no local copy and KVDRO_CACHE_DIR pointing at a file, fetch names the folder
    (before any download is tried) instead of reporting a network error."""
    from kvdro.cachefile import FolderNotWritableError

    not_a_folder = tmp_path / "cache-file"
    not_a_folder.write_text("x")
    monkeypatch.setenv("KVDRO_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("KVDRO_CACHE_DIR", str(not_a_folder))

    def no_network(*args, **kwargs):
        raise AssertionError("fetch tried to download")

    monkeypatch.setattr(datasets, "_download", no_network)
    with pytest.raises(FolderNotWritableError, match="KVDRO_CACHE_DIR"):
        datasets.fetch("azure-2023-conv")


@pytest.mark.parametrize("count", ["99999999999999999999", "9223372036854775000"])
def test_a_token_count_beyond_2_53_is_refused_naming_file_column_and_row(tmp_path, count):
    """Issue 36: a GeneratedTokens that int64 cannot hold (or that float64 no longer holds exactly) was read
    as -9223372036854775808; now the reader names the file, the column and the row."""
    p = tmp_path / "trace.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,100,10\n"
                 f"2023-11-16 18:15:47.6805900,100,{count}\n")
    with pytest.raises(ValueError, match=r"trace\.csv.*GeneratedTokens.*2\*\*53"):
        datasets.read_azure_csv(p, "conversation")
