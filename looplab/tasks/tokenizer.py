"""Tokenizers for the language-modelling task, named by a spec string.

    load_tokenizer("mistral")  the Mistral-7B SentencePiece model (vocab 32000), read
                               from the installed mistral-common wheel and checked
                               against a pinned SHA-256 before use
    load_tokenizer("bytes")    UTF-8 bytes: ids 0..255, then <bos> <eos> <pad> (vocab 259)
    load_tokenizer(NAME)       anything else: a HuggingFace AutoTokenizer name or path

Every tokenizer has `encode(text)` (no <bos>/<eos> added: the caller frames
documents), `decode(ids)`, `vocab_size`, `bos_id`, `eos_id`, `pad_id` and `spec`, the
string that rebuilds it; checkpoints store `spec`, never the tokenizer itself.

sentencepiece and transformers are imported inside functions so `import looplab`
stays light.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import os
import socket
from pathlib import Path
from typing import Sequence

from looplab.errors import ConfigError
from looplab.keys import SHA256, file_digest

# Pinned so a different or corrupted file cannot silently change every token id
# (and with them every checkpoint's meaning). mistral-common 1.13.1's copy.
MISTRAL_MODEL_FILE = "data/tokenizer.model.v1"
MISTRAL_SHA256 = "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"
MISTRAL_INSTALL = "pip install --no-deps mistral-common==1.13.1"
MISTRAL_VOCAB_SIZE = 32_000
BYTE_VOCAB_SIZE = 259  # 256 byte values + <bos> <eos> <pad>


class Tokenizer(abc.ABC):
    """What the text task and the evaluation harness rely on."""

    spec: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of text, without bos/eos."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abc.abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids (special ids skipped)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255; specials after them. Needs no files, so it is the
    tokenizer of the seconds-long debug runs and of tests."""

    def __init__(self) -> None:
        self.spec = "bytes"
        self.vocab_size = BYTE_VOCAB_SIZE
        self.bos_id, self.eos_id, self.pad_id = 256, 257, 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # Specials carry no bytes; a cut multi-byte character decodes as U+FFFD.
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model file. pad_id is <unk> (0) when the model defines no pad:
    Mistral's byte fallback means <unk> never occurs in encoded text, so padding
    stays distinguishable from every real token, <eos> included."""

    def __init__(self, model_file: str | Path, spec: str) -> None:
        import sentencepiece

        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.spec = spec
        self.vocab_size = int(self._sp.get_piece_size())
        self.bos_id, self.eos_id = int(self._sp.bos_id()), int(self._sp.eos_id())
        pad = int(self._sp.pad_id())
        self.pad_id = pad if pad >= 0 else int(self._sp.unk_id())

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int)  # one C++ call for the whole list

    def decode(self, ids: Sequence[int]) -> str:
        return self._sp.decode([int(i) for i in ids])

    def piece_to_id(self, piece: str) -> int:
        return int(self._sp.piece_to_id(piece))


class HFTokenizer(Tokenizer):
    """A transformers AutoTokenizer (name on the hub or local directory). Documents
    need an end marker, so a tokenizer without <eos> is refused; pad falls back to
    <eos>, bos to <eos> (GPT-2 style: one token both ends and starts documents)."""

    def __init__(self, spec: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ConfigError(
                f"tokenizer={spec!r} needs transformers ({e}); allowed: mistral | bytes, or pip install transformers"
            ) from None
        local = Path(spec).expanduser().exists()
        try:
            # Offline, from_pretrained retries the hub for a minute: try the local
            # cache first and go online only when the hub answers.
            self._tok = AutoTokenizer.from_pretrained(spec, local_files_only=local or not hub_reachable())
        except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, HTTP errors ...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                f"tokenizer={spec!r} could not be loaded ({reason}); allowed: mistral | bytes | "
                "a local tokenizer directory | a hub name when the hub is reachable"
            ) from None
        tok = self._tok
        if tok.eos_token_id is None:
            raise ConfigError(
                f"tokenizer={spec!r} defines no eos token; allowed: a tokenizer with eos "
                "(documents are separated by it)"
            )
        self.spec = spec
        self.vocab_size = len(tok)
        self.eos_id = int(tok.eos_token_id)
        self.bos_id = int(tok.bos_token_id) if tok.bos_token_id is not None else self.eos_id
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(x) for x in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        text = self._tok.decode([int(i) for i in ids])
        assert isinstance(text, str)  # one sequence decodes to one string (the annotation covers batches too)
        return text


def mistral_model_path() -> Path:
    """The tokenizer file inside the installed mistral-common wheel. find_spec
    locates a top-level package without executing it: mistral_common's import pulls
    pins we do not want, and we need only one data file."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"tokenizer='mistral' needs the mistral-common wheel, which is not installed; "
            f"allowed: run `{MISTRAL_INSTALL}`, or use tokenizer='bytes'"
        )
    return Path(list(spec.submodule_search_locations)[0]) / MISTRAL_MODEL_FILE


def verify_sha256(path: Path, expected: str) -> None:
    """Raise a one-line ConfigError unless the file exists and hashes to `expected`."""
    if not path.is_file():
        raise ConfigError(f"tokenizer='mistral': {path} is missing; allowed: reinstall with `{MISTRAL_INSTALL}`")
    digest = file_digest(path).removeprefix(SHA256)
    if digest != expected:
        raise ConfigError(
            f"tokenizer='mistral': {path} has SHA-256 {digest[:12]}…, expected {expected[:12]}…; "
            f"allowed: the mistral-common 1.13.1 file (`{MISTRAL_INSTALL}`)"
        )


def load_mistral() -> SentencePieceTokenizer:
    path = mistral_model_path()
    verify_sha256(path, MISTRAL_SHA256)
    return SentencePieceTokenizer(path, spec="mistral")


@functools.lru_cache(maxsize=8)
def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by spec (cached: tokenizers are read-only)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"tokenizer={spec!r} is invalid; allowed: mistral | bytes | a HuggingFace tokenizer name or path"
        )
    if spec == "mistral":
        return load_mistral()
    if spec == "bytes":
        return ByteTokenizer()
    return HFTokenizer(spec)


def known_vocab_size(spec: str) -> int | None:
    """The vocabulary size of a built-in spec without loading anything; None otherwise."""
    return {"mistral": MISTRAL_VOCAB_SIZE, "bytes": BYTE_VOCAB_SIZE}.get(spec)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the HuggingFace hub can be reached: False at once when the user said
    offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), else a TCP connect to the hub's
    host. Behind a proxy the hub host is not dialled directly, so we let the library
    try (it reports its own error)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = host.partition(":")
    try:
        with socket.create_connection((host, int(port or 443)), timeout=timeout):
            return True
    except OSError:
        return False
