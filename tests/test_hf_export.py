"""`looplab export --format hf` (looplab/export.py): the exported folder, loaded by
transformers with trust_remote_code, against looplab's own model, generate and lm-eval
adapter, for tiny Mamba-2, Transformer and hybrid checkpoints with a byte tokenizer."""

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# transformers copies remote code to HF_MODULES_CACHE (read when it is imported): a private one.
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="looplab_hf_modules_"))

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from looplab.checkpoint import save_model
from looplab.cli import main
from looplab.config import ConfigError, ModelConfig
from looplab.export import export_hf
from looplab.inference.generate import generate
from looplab.models.looped import LoopedLM
from looplab.policy import ExitPolicy

pytestmark = pytest.mark.usefixtures("one_thread")

R = 3
ARCHS = {
    "mamba2": dict(arch="mamba2"),
    "transformer": dict(arch="transformer", d_intermediate=48),
    "hybrid": dict(arch="hybrid", attn_layer_idx=(1,)),
}
DEFAULT_POLICY = "skip:0.5"
# Every kind of policy the export exposes (given exits are tensors, not config values).
POLICIES = [
    "full",
    "forced:1",
    "forced:2",
    "dense:0.5",
    "skip:0.5",
    "skip:0.8",
    "dense-entropy:5.0",
    "skip-entropy:5.0",
    "skip-kl:0.01",
    "skip-stable:2",
]
TEXT = "The cat sat on the mat. Q: 2+2?"


def tiny_model(arch: str, seed: int = 0) -> LoopedLM:
    """A float32 byte-level model whose gate is spread out, so tokens exit at different
    steps under the gate's policies; trained (so says its metadata) by pretrain, then chase."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=259,
        d_model=32,
        n_layers=2,
        n_loops=R,
        d_state=8,
        headdim=16,
        chunk_size=8,
        attn_head_dim=16,
        rope_dim=16,
        **ARCHS[arch],
    )
    model = LoopedLM(cfg).eval()
    with torch.no_grad():
        model.exit_gate.weight.normal_(0, 5.0)
        model.exit_gate.bias.fill_(0.0)
    model.metadata = {"tokenizer": "bytes", "stage": "chase", "lineage": ["pretrain", "chase"], "task": "text"}
    return model


@pytest.fixture(scope="module")
def modules_cache(tmp_path_factory):
    """transformers' copies of remote code go to a private folder (read at its import)."""
    return tmp_path_factory.mktemp("hf_modules")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """arch -> (looplab model, its checkpoint, the exported folder)."""
    out = {}
    for arch in ARCHS:
        model = tiny_model(arch)
        base = tmp_path_factory.mktemp(arch)
        save_model(model, base / "checkpoint")
        export_hf(base / "checkpoint", base / "hf", DEFAULT_POLICY)
        out[arch] = (model, base / "checkpoint", base / "hf")
    return out


@pytest.fixture(scope="module")
def loaded(exported):
    from transformers import AutoModelForCausalLM

    return {
        arch: AutoModelForCausalLM.from_pretrained(str(d), trust_remote_code=True).eval()
        for arch, (_, _, d) in exported.items()
    }


def byte_ids(text: str) -> list[int]:
    return [256] + list(text.encode("utf-8"))


def test_the_folder_holds_config_code_weights_and_tokenizer(exported):
    model, _, folder = exported["hybrid"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_looplab.LoopLabConfig",
        "AutoModelForCausalLM": "modeling_looplab.LoopLabForCausalLM",
    }
    assert (config["n_loops"], config["exit_policy"], config["stage"], config["lineage"], config["method"]) == (
        R,
        DEFAULT_POLICY,
        "chase",
        ["pretrain", "chase"],
        "CHASE",
    )
    assert config["looplab_model"]["attn_layer_idx"] == [1] and config["looplab_tokenizer"] == "bytes"
    assert "skip:0.4" in config["exit_policies"]  # what a gated stage evaluates
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "modeling_looplab.py",
        "looplab_models_looped.py",
        "looplab_models_mamba2.py",
        "looplab_models_attention.py",
    ):
        assert (folder / name).is_file(), name
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~umask, modes  # as readable as every other file
    assert set(modes.values()) == {0o666 & ~umask}, modes
    # The model's source is looplab's own, its imports made local to the folder.
    looped = (folder / "looplab_models_looped.py").read_text()
    assert "class LoopedLM(nn.Module)" in looped and "from .looplab_models_execution import" in looped
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            assert not any(n.split(".")[0] == "looplab" for n in names), (path.name, node.lineno)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_looplab_in_every_policy(exported, loaded, arch):
    model, hf = exported[arch][0], loaded[arch]
    ids = torch.tensor([byte_ids(TEXT), byte_ids(TEXT[::-1])])
    with torch.no_grad():
        default = hf(ids).logits
        for spec in POLICIES:
            expected = model(ids, ExitPolicy.parse(spec)).logits
            got = hf(ids, exit_policy=spec).logits
            assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), spec
            if spec == DEFAULT_POLICY:
                assert torch.allclose(default, expected, atol=1e-5, rtol=1e-5)
        # The policies are not all one model: skip's exits change the logits.
        full = model(ids, ExitPolicy.full())
        skip = model(ids, ExitPolicy.parse(DEFAULT_POLICY))
    assert 1 in skip.exit_step.tolist()[0] and not torch.allclose(full.logits, skip.logits, atol=1e-3)


def test_exit_policy_is_a_config_field_overridable_at_load_time(exported):
    from transformers import AutoModelForCausalLM

    model, _, folder = exported["mamba2"]
    hf = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True, exit_policy="forced:1").eval()
    assert hf.config.exit_policy == "forced:1"
    ids = torch.tensor([byte_ids(TEXT)])
    with torch.no_grad():
        expected = model(ids, ExitPolicy.forced(1)).logits
        out = hf(ids, labels=ids)
    assert torch.allclose(out.logits, expected, atol=1e-5)
    # labels: the mean next-token cross-entropy, as a causal LM's loss is in transformers
    assert float(out.loss) == pytest.approx(
        float(torch.nn.functional.cross_entropy(expected[0, :-1], ids[0, 1:])), abs=1e-5
    )
    with pytest.raises(ValueError, match="depth=7"):  # the folder's own copy of ConfigError
        hf(ids, exit_policy="forced:7")


@pytest.mark.parametrize("arch", ["mamba2", "hybrid"])
def test_padded_rows_score_as_if_unpadded(exported, loaded, arch):
    """Left padding (what generate uses) and right padding: every real token gets the
    logits of its unpadded sequence."""
    model, hf = exported[arch][0], loaded[arch]
    short, long = byte_ids("Hi there"), byte_ids(TEXT)
    width, pad = len(long), 258
    for left in (True, False):
        row = [pad] * (width - len(short)) + short if left else short + [pad] * (width - len(short))
        mask = [0] * (width - len(short)) + [1] * len(short) if left else [1] * len(short) + [0] * (width - len(short))
        with torch.no_grad():
            got = hf(
                torch.tensor([row, long]), attention_mask=torch.tensor([mask, [1] * width]), exit_policy=DEFAULT_POLICY
            ).logits
            want = model(torch.tensor([short]), ExitPolicy.parse(DEFAULT_POLICY)).logits[0]
        real = torch.tensor(mask).bool()
        assert torch.allclose(got[0][real], want, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("spec", ["full", DEFAULT_POLICY, "skip-entropy:5.0"])
def test_greedy_generate_equals_looplab_generate(exported, loaded, arch, spec):
    """transformers' generation loop (greedy, batch of two prompts of different lengths,
    left-padded) against looplab's cached generate."""
    model, hf = exported[arch][0], loaded[arch]
    prompts = [byte_ids("Once upon a"), byte_ids("Q: 2+2? A:")]
    new = 8
    with torch.no_grad():
        ours = generate(model, prompts, new, ExitPolicy.parse(spec), eos_id=257).tokens
    width = max(map(len, prompts))
    ids = torch.tensor([[258] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, exit_policy=spec)
    for row, expected in zip(out[:, width:].tolist(), ours):
        tokens = row[: row.index(257)] if 257 in row else row  # <eos> ends a row; padding follows it
        assert tokens == expected
    assert any(len(t) == new for t in ours)  # some row ran its full length


def test_auto_tokenizer_is_the_byte_tokenizer(exported):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = exported["mamba2"][2]
    for tok in (
        AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True),
        PreTrainedTokenizerFast.from_pretrained(str(folder)),
    ):  # no remote code at all
        for text in ("héllo wörld 🙂", "  two  spaces\n\ttab", ""):
            assert tok(text, add_special_tokens=False)["input_ids"] == list(text.encode("utf-8"))
            assert tok(text)["input_ids"] == byte_ids(text)
            assert tok.decode(byte_ids(text), skip_special_tokens=True) == text
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)


def test_mistral_tokenizer_encodes_and_decodes_as_sentencepiece_does(tmp_path):
    """The pinned Mistral SentencePiece model, through AutoTokenizer, against looplab's
    tokenizer (the sentencepiece library called directly)."""
    pytest.importorskip("sentencepiece")
    from transformers import AutoTokenizer

    from looplab.tasks.tokenizer import load_tokenizer

    try:
        ref = load_tokenizer("mistral")
    except ConfigError:
        pytest.skip("the mistral-common wheel is not installed")
    torch.manual_seed(0)
    model = LoopedLM(
        ModelConfig(vocab_size=32000, d_model=16, n_layers=1, n_loops=2, d_state=8, headdim=16, chunk_size=8)
    )
    model.metadata = {"tokenizer": "mistral"}
    folder = export_hf(model, tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    texts = ("Hello world", " leading space", "two  spaces\nnewline\n\n", "héllo 世界 🙂", "  ", "a\tb 1234567", "")
    for text in texts:
        ids = ref.encode(text)
        assert tok(text, add_special_tokens=False)["input_ids"] == ids
        assert tok(text)["input_ids"] == [ref.bos_id] + ids
        assert tok.decode(ids) == ref.decode(ids)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, len(tok)) == (
        ref.bos_id,
        ref.eos_id,
        ref.pad_id,
        ref.vocab_size,
    )
    config = json.loads((folder / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)


def test_lm_eval_hf_backend_scores_the_export_as_looplab_does(exported):
    pytest.importorskip("lm_eval")
    pytest.importorskip("accelerate")  # lm-eval's hf backend imports it
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from looplab.evaluation.harness import LoopLabLM

    model, checkpoint, folder = exported["hybrid"]
    requests = [
        Instance("loglikelihood", doc={}, arguments=(c, x), idx=i, metadata=("toy", i, 1))
        for i, (c, x) in enumerate([("Question: sky?\nAnswer:", " blue"), ("The cat sat on the", " mat")])
    ]
    hf = HFLM(pretrained=str(folder), trust_remote_code=True, device="cpu", batch_size=2)
    ours = LoopLabLM(checkpoint=str(checkpoint), policy=DEFAULT_POLICY, device="cpu", batch_size=2)
    got, want = hf.loglikelihood(requests), ours.loglikelihood(requests)
    for request, (logprob, greedy), (ref, ref_greedy) in zip(requests, got, want):
        context, continuation = request.arguments
        ids = byte_ids(context + continuation)
        with torch.no_grad():
            logits = model(torch.tensor([ids]), ExitPolicy.parse(DEFAULT_POLICY)).logits[0]
        direct = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[-len(continuation) :]
        assert logprob == pytest.approx(float(direct.sum()), abs=1e-4)
        assert (logprob, greedy) == (pytest.approx(ref, abs=1e-4), ref_greedy)


BLOCKER = """
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == "looplab" or name.startswith("looplab."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
sys.meta_path.insert(0, Blocker())
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, spec = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, exit_policy=spec).eval()
tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
ids = torch.tensor([tok(sys.argv[3])["input_ids"]])
with torch.no_grad():
    logits = model(ids).logits
torch.save({"ids": ids, "logits": logits, "looplab_loaded": [m for m in sys.modules if m.split(".")[0] == "looplab"]},
           sys.argv[4])
"""


def test_the_folder_loads_where_looplab_cannot_be_imported(exported, tmp_path, modules_cache):
    model, _, folder = exported["hybrid"]
    result = tmp_path / "out.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(modules_cache), "PYTHONPATH": ""}
    run = subprocess.run(
        [sys.executable, "-c", BLOCKER, str(folder), "skip:0.8", TEXT, str(result)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = torch.load(result)
    assert out["looplab_loaded"] == [] and out["ids"][0].tolist() == byte_ids(TEXT)
    with torch.no_grad():
        assert torch.allclose(out["logits"], model(out["ids"], ExitPolicy.skip(0.8)).logits, atol=1e-5)


def test_the_blocker_blocks(tmp_path):
    """The subprocess above would load looplab from the checkout if the blocker let it."""
    code = BLOCKER.split("import torch")[0] + "import looplab\n"
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "blocked" in run.stderr


def test_cli_export_and_its_one_line_errors(exported, tmp_path, capsys):
    checkpoint = exported["mamba2"][1]
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(checkpoint), "--format", "hf", "--policy", "dense:0.5", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["exit_policy"] == "dense:0.5"
    capsys.readouterr()

    def error(*argv) -> str:
        assert main(["export", *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("looplab: error: ")
        return lines[0]

    assert "--checkpoint=" in error("--checkpoint", str(tmp_path / "missing"), str(tmp_path / "a"))
    assert "--format='gguf' is invalid; allowed: hf" in error(
        "--checkpoint", str(checkpoint), "--format", "gguf", str(tmp_path / "b")
    )
    assert "--policy='forced:9'" in error("--checkpoint", str(checkpoint), "--policy", "forced:9", str(tmp_path / "c"))
    assert "is not empty" in error("--checkpoint", str(checkpoint), str(out))  # a previous export, no --force
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert "not a looplab export" in error("--checkpoint", str(checkpoint), "--force", str(other))
    assert (other / "notes.txt").read_text() == "keep me"
    assert main(["export", "--checkpoint", str(checkpoint), "--force", str(out)]) == 0  # replaces an export
    assert json.loads((out / "config.json").read_text())["exit_policy"] == "full"
