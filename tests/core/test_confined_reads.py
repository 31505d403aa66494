"""Reads confined to the roots before anything is opened (issue 21 items 1 and 6, engine side): a GPT-2
tokenizer read without tiktoken's cache, a checkpoint whose tokenizer lies outside refused before its
files are read, corpora that are text files and never the service's own files, model folders with a
link that leads out refused, and caches kept under the data dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from aah_core.checkpoint import load_checkpoint, save_checkpoint
from aah_core.data.corpus import check_corpus
from aah_core.data.tokenizers import make_tokenizer
from aah_core.errors import InvalidConfig
from aah_core.paths import ReadRoots, confine_data_paths, confine_folder_files, library_caches
from tests.untouched import age, atime_updates, listing, read_since_aged

# GPT-2's byte alphabet as its release defines it: these bytes stand for themselves, the other 68 are
# shifted to chr(256 + n) in byte order; ranks 0..255 are these bytes first, then the others.
SHOWN = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]


def _letter(b: int) -> str:
    hidden = [x for x in range(256) if x not in SHOWN]
    return chr(b) if b in SHOWN else chr(256 + hidden.index(b))


def write_gpt2_folder(folder: Path, merges: list[tuple[str, str]] = MERGES) -> Path:
    """encoder.json + vocab.bpe of a small GPT-2-style BPE: the 256 bytes, then one token per merge."""
    folder.mkdir(parents=True, exist_ok=True)
    order = SHOWN + [b for b in range(256) if b not in SHOWN]
    encoder = {_letter(b): rank for rank, b in enumerate(order)}
    for a, b in merges:
        encoder[a + b] = len(encoder)
    encoder["<|endoftext|>"] = len(encoder)
    (folder / "encoder.json").write_text(json.dumps(encoder))
    (folder / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    return folder


def test_a_gpt2_folder_is_read_without_tiktoken_s_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    tok = make_tokenizer("gpt2", str(write_gpt2_folder(tmp_path / "gpt2")))
    assert tok.vocab_size == 256 + len(MERGES) + 1
    ids = tok.encode("hello world")
    merged = {a + b: 256 + i for i, (a, b) in enumerate(MERGES)}
    byte = {chr(b): SHOWN.index(b) for b in SHOWN}
    # "hello" -> hell + o; " world" -> Ġw (space written Ġ) + o r l d
    assert ids == [merged["hell"], byte["o"], merged["Ġw"], byte["o"], byte["r"], byte["l"], byte["d"]]
    assert tok.decode(ids) == "hello world"
    assert listing(tmp_path / "tmp") == set()  # tiktoken's loader would have copied both files here


@pytest.mark.parametrize("damage", ["mismatch", "not-json", "deep", "alphabet", "three-part merge"])
def test_a_broken_gpt2_folder_is_invalid_config(tmp_path, damage):
    folder = write_gpt2_folder(tmp_path / "gpt2")
    if damage == "mismatch":  # the merges disagree with encoder.json (tiktoken asserted: a 500)
        (folder / "vocab.bpe").write_text("#version: 0.2\nl l\nh e\n")
    elif damage == "not-json":
        (folder / "encoder.json").write_text("{")
    elif damage == "deep":
        (folder / "encoder.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "alphabet":
        (folder / "encoder.json").write_text(json.dumps({" ": 0}))  # a raw space is not in the alphabet
    else:
        (folder / "vocab.bpe").write_text("#version: 0.2\nh e l\n")
    with pytest.raises(InvalidConfig):
        make_tokenizer("gpt2", str(folder))


@pytest.fixture
def outside_tokenizer(tmp_path):
    """(data root, outside tokenizer folder with aged files, its files)."""
    root, outside = tmp_path / "root", write_gpt2_folder(tmp_path / "outside")
    root.mkdir()
    files = [outside / "encoder.json", outside / "vocab.bpe"]
    age(*files)
    return root, outside, files


def test_a_checkpoint_naming_an_outside_tokenizer_is_refused_before_it_is_read(tiny_model, tiny_config, tmp_path,
                                                                              outside_tokenizer):
    root, outside, files = outside_tokenizer
    ckpt = save_checkpoint(root / "ck", tiny_model, tiny_config)
    header = json.loads((ckpt / "config.json").read_text())
    header["config"]["data"].update(tokenizer="gpt2", tokenizer_dir=str(outside))
    (ckpt / "config.json").write_text(json.dumps(header))
    with pytest.raises(InvalidConfig, match="tokenizer_dir.*not under an allowed root"):
        load_checkpoint(ckpt, roots=ReadRoots([root], [root]))
    if atime_updates(tmp_path):
        assert read_since_aged(*files) == []


def test_tokenizer_files_that_link_out_are_refused(tiny_config, tmp_path, outside_tokenizer):
    root, outside, files = outside_tokenizer
    inside = root / "tok"
    inside.mkdir()
    (inside / "encoder.json").symlink_to(files[0])
    (inside / "vocab.bpe").write_text((outside / "vocab.bpe").read_text())
    age(*files)
    config = tiny_config.__class__.from_dict({**tiny_config.to_dict(),
                                              "data": {"tokenizer": "gpt2", "tokenizer_dir": str(inside)}})
    with pytest.raises(InvalidConfig, match="encoder.json.*not under an allowed root"):
        confine_data_paths(config, [root])
    if atime_updates(tmp_path):
        assert read_since_aged(*files) == []


def test_single_file_corpora_are_text_files_and_never_the_service_s_own(tiny_config, tmp_path):
    store = tmp_path / "aah.db"
    store.write_bytes(b"SQLite format 3\0" + b"\0" * 100)
    with pytest.raises(InvalidConfig, match="not a text file"):
        check_corpus(str(store))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "api.txt").write_text("a log line\n" * 100)
    for corpus, private in (("aah.db", [store]), ("logs", [logs]), ("logs/api.txt", [logs])):
        config = tiny_config.__class__.from_dict({**tiny_config.to_dict(), "data": {"corpus": corpus}})
        with pytest.raises(InvalidConfig, match="own store or logs|not a text file"):
            confine_data_paths(config, [tmp_path], private)


def test_a_model_folder_with_a_link_out_is_refused(tmp_path):
    root, outside = tmp_path / "models", tmp_path / "outside"
    (root / "m" / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "tokenizer.json").write_text("{}")
    (root / "m" / "config.json").write_text("{}")
    (root / "m" / "inside-link.json").symlink_to(root / "m" / "config.json")  # stays inside: fine
    confine_folder_files(root / "m", [root])
    (root / "m" / "sub" / "tokenizer.json").symlink_to(outside / "tokenizer.json")
    with pytest.raises(InvalidConfig, match="sub/tokenizer.json is a link that leads out"):
        confine_folder_files(root / "m", [root])
    (root / "m" / "sub" / "tokenizer.json").unlink()
    (root / "m" / "loop").symlink_to(root / "m" / "loop")
    with pytest.raises(InvalidConfig, match="loop is a link that leads out"):
        confine_folder_files(root / "m", [root])


def test_library_caches_live_under_the_data_dir(tmp_path):
    caches = library_caches(tmp_path)
    assert {"TIKTOKEN_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"} <= set(caches)
    assert all(Path(v).is_relative_to(tmp_path) for v in caches.values())
    assert os.path.commonpath(list(caches.values())) == str(tmp_path / "cache")
