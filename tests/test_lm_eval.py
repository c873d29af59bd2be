"""The lm-eval adapter (looplab/evaluation/harness.py) and the paper suite (looplab/evaluation/paper_tasks.py),
offline: a tiny freshly initialised byte-level LoopedLM, a toy multiple-choice task
over tests/data/lm_eval, and stand-in parquet files for the seven suite tasks."""

import json
import os
import subprocess
import sys
from pathlib import Path

# Before lm-eval / datasets / huggingface_hub read them at import: fail fast, never
# reach for the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("datasets")

import looplab
from looplab.checkpoint import save_model
from looplab.config import ConfigError
from looplab.policy import ExitPolicy

DATA = Path(__file__).parent / "data" / "lm_eval"
TOY_TASK = "looplab_toy_mc"
R = 4


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
    """Offline hub flags and a private datasets cache, also when another test module
    imported datasets before the environment variables were set."""
    import datasets
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf_datasets")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny R=4 byte-level model whose exit gate has large random weights and a
    positive bias: under skip, tokens exit at different steps, mostly early, so
    skip runs fewer steps than dense and packing of survivors is exercised."""
    model = looplab.load_model("phop-debug", vocab_size=259, n_loops=R, seed=0)
    model.metadata["tokenizer"] = "bytes"
    with torch.no_grad():
        weights = torch.randn(model.exit_gate.weight.shape, generator=torch.Generator().manual_seed(1))
        model.exit_gate.weight.copy_(10 * weights)
        model.exit_gate.bias.fill_(1.0)
    path = tmp_path_factory.mktemp("lm") / "checkpoint"
    save_model(model, path)
    return path


@pytest.fixture(scope="module")
def toy_tasks(tmp_path_factory) -> Path:
    """The toy task's YAML with data_files made absolute (datasets resolves relative
    paths against the working directory)."""
    import yaml

    config = yaml.safe_load((DATA / "toy_mc.yaml").read_text())
    config["dataset_kwargs"]["data_files"]["test"] = str(DATA / "toy_mc.jsonl")
    out = tmp_path_factory.mktemp("tasks")
    (out / "toy_mc.yaml").write_text(yaml.safe_dump(config))
    return out


def make_lm(checkpoint, **kw):
    from looplab.evaluation.harness import LoopLabLM

    kw.setdefault("device", "cpu")
    return LoopLabLM(checkpoint=str(checkpoint), **kw)


def direct_logprobs(model, ids: list[int], **execution) -> torch.Tensor:
    """log p(ids[i+1] | ids[..i]) for every i, from one unpadded forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids]), **execution).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)
    return logprobs.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_import_looplab_does_not_import_lm_eval():
    code = "import sys, looplab, looplab.cli; sys.exit('lm_eval' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_registered_under_looplab_without_hiding_builtin_models():
    from lm_eval.api.registry import get_model, model_registry

    from looplab.evaluation.harness import LoopLabLM

    assert get_model("looplab") is LoopLabLM
    assert "hf" in model_registry  # lm-eval's own names were registered first


def test_loglikelihood_tokens_match_direct_computation(checkpoint):
    lm = make_lm(checkpoint, policy="full", batch_size=2)
    tok = lm.tokenizer
    assert (tok.spec, tok.bos_id, tok.eos_id, tok.pad_id) == ("bytes", 256, 257, 258)
    contexts = ["The cat sat on the", "Q: 2+2?\nA:", "x"]
    continuations = [" mat", " 4", "yz and more"]
    requests = [((c, d), lm.tok_encode(c), tok.encode(d)) for c, d in zip(contexts, continuations)]
    results = lm._loglikelihood_tokens(requests)
    for (_, context, continuation), (logprob, _) in zip(requests, results):
        ids = context + continuation
        expected = direct_logprobs(lm.model, ids)[-len(continuation) :].sum()
        assert logprob == pytest.approx(float(expected), abs=1e-4)

    # Greedy: the continuation the model would decode token by token.
    context = lm.tok_encode("Hello")
    greedy = []
    for _ in range(3):
        with torch.no_grad():
            greedy.append(int(lm.model(torch.tensor([context + greedy])).logits[0, -1].argmax()))
    (_, is_greedy), (_, not_greedy) = lm._loglikelihood_tokens(
        [((None, None), context, greedy), ((None, None), context, greedy[:-1] + [(greedy[-1] + 1) % 256])]
    )
    assert is_greedy and not not_greedy


def test_loglikelihood_via_lm_eval_instances_prepends_bos(checkpoint):
    from lm_eval.api.instance import Instance

    lm = make_lm(checkpoint, batch_size=4)
    request = Instance(
        "loglikelihood", doc={}, arguments=("Question: sky?\nAnswer:", " blue"), idx=0, metadata=("toy", 0, 1)
    )
    ((logprob, _),) = lm.loglikelihood([request])
    ids = [256] + list(b"Question: sky?\nAnswer: blue")
    assert logprob == pytest.approx(float(direct_logprobs(lm.model, ids)[-5:].sum()), abs=1e-4)
    assert lm.executed_loops_by_task == {"toy": pytest.approx(R)}


def test_contexts_are_left_truncated_to_max_length(checkpoint):
    lm = make_lm(checkpoint, max_length=16)
    context, continuation = list(range(60, 100)), [101, 102, 103]
    ((logprob, _),) = lm._loglikelihood_tokens([((None, None), context, continuation)])
    window = (context + continuation)[-17:]  # 16 inputs predict the last 16 tokens
    assert logprob == pytest.approx(float(direct_logprobs(lm.model, window)[-3:].sum()), abs=1e-4)


def test_right_padding_does_not_change_skip_scores(checkpoint):
    texts = [b"ab", b"The cat", b"sat on the mat, said the", b"1 + 2 = 3", b"looped models"]
    requests = [((None, None), [256] + list(t), list(b" end")) for t in texts]
    alone = make_lm(checkpoint, policy="skip:0.6", batch_size=1)
    batched = make_lm(checkpoint, policy="skip:0.6", batch_size=5)
    with torch.no_grad():  # the gate really mixes exit steps here
        steps = alone.model(torch.tensor([requests[2][1]]), ExitPolicy.skip(0.6)).exit_step
    assert len(set(steps.flatten().tolist())) > 1
    for (a, _), (b, _) in zip(alone._loglikelihood_tokens(requests), batched._loglikelihood_tokens(requests)):
        assert a == pytest.approx(b, abs=1e-4)
    # Padding is no token: both count the same real tokens and loops.
    assert alone.executed_loops == pytest.approx(batched.executed_loops)
    assert 1 <= batched.executed_loops < R


def test_loglikelihood_rolling_scores_each_token_once(checkpoint):
    from lm_eval.api.instance import Instance

    text = "Looped models reuse one block R times."  # 38 bytes: three windows of 16
    request = Instance("loglikelihood_rolling", doc={}, arguments=(text,), idx=0, metadata=("toy", 0, 1))
    lm = make_lm(checkpoint, max_length=16, batch_size=2)
    (rolling,) = lm.loglikelihood_rolling([request])

    # Independent reference: token i of block k (16 tokens each) is predicted from
    # the (up to) 16 sequence tokens that end where its block ends.
    seq = [lm.prefix_token_id] + list(text.encode())
    n, expected = len(seq) - 1, 0.0
    for start in range(0, n, 16):
        end = min(start + 16, n)  # block predicts seq[start+1 .. end]
        window_start = max(0, end - 16)
        logprobs = direct_logprobs(lm.model, seq[window_start : end + 1])
        expected += float(logprobs[start - window_start :].sum())
    assert rolling == pytest.approx(expected, abs=1e-3)

    # With room for the whole text it is one forward pass.
    (whole,) = make_lm(checkpoint, max_length=64).loglikelihood_rolling([request])
    assert whole == pytest.approx(float(direct_logprobs(lm.model, seq).sum()), abs=1e-3)


def test_generate_until_is_greedy_and_stops():
    from lm_eval.api.instance import Instance

    from looplab.evaluation.harness import LoopLabLM

    model = looplab.load_model("phop-debug", vocab_size=259, n_loops=R, seed=0)
    with torch.no_grad():  # only printable ASCII can win the argmax: readable text, exact stops
        model.lm_head.weight[:32] = 0
        model.lm_head.weight[127:] = 0
    lm = LoopLabLM(checkpoint=model, tokenizer="bytes", device="cpu", batch_size=2)  # an in-memory model
    ids, generated = lm.tok_encode("Once upon"), []
    for _ in range(8):
        with torch.no_grad():
            generated.append(int(model(torch.tensor([ids + generated])).logits[0, -1].argmax()))
    assert all(32 <= t < 127 for t in generated)
    text = bytes(generated).decode()
    stop = text[3:5]

    def request(context, **gen_kwargs):
        return Instance("generate_until", doc={}, arguments=(context, gen_kwargs), idx=0)

    texts = lm.generate_until(
        [
            request("Once upon", until=[], max_gen_toks=8),
            request("Another, longer prompt", max_gen_toks=2),
            request("Once upon", until=["never", stop], max_gen_toks=8),
        ]
    )
    assert texts[0] == text
    assert len(texts[1]) == 2
    assert texts[2] == text[: text.index(stop)]


def uncached_greedy(model, ids: list[int], until: list[str], max_new: int, policy, eos: int) -> str:
    """The reference: greedy decoding by re-running the full forward over the whole
    sequence for every new token (no cache), with generate_until's stop rules."""
    generated, text = [], ""
    for _ in range(max_new):
        with torch.no_grad():
            token = int(model(torch.tensor([ids + generated]), policy).logits[0, -1].argmax())
        if token == eos:
            break
        generated.append(token)
        text = bytes(t for t in generated if t < 256).decode("utf-8", errors="replace")
        if any(stop in text for stop in until):
            return text[: min(text.index(stop) for stop in until if stop in text)]
    return text


@pytest.mark.parametrize("policy", ["skip:0.4", "dense:0.4", "forced:2"])
def test_cached_generate_until_equals_uncached_greedy_decoding(checkpoint, policy):
    """Contexts of different lengths in one batch, tokens exiting at different loops:
    the cached continuation is the uncached one, and every position the model ran
    counts towards the executed loops."""
    from lm_eval.api.instance import Instance

    lm = make_lm(checkpoint, policy=policy, batch_size=3)
    contexts = ["Once upon a time", "A", "The quick brown fox jumps", "zzz"]
    first = uncached_greedy(lm.model, lm.tok_encode(contexts[0]), [], 10, ExitPolicy.parse(policy), lm.eot_token_id)
    stops = [[], ["never"], [first[4:6]] if len(first) > 6 else [], ["q"]]
    requests = [
        Instance("generate_until", doc={}, arguments=(c, {"until": u, "max_gen_toks": n}), idx=0)
        for c, u, n in zip(contexts, stops, [10, 7, 12, 5])
    ]
    lm.reset_loop_tally()
    texts = lm.generate_until(requests)
    for (context, gen_kwargs), text in zip((r.args for r in requests), texts):
        assert text == uncached_greedy(
            lm.model,
            lm.tok_encode(context),
            gen_kwargs["until"],
            gen_kwargs["max_gen_toks"],
            ExitPolicy.parse(policy),
            lm.eot_token_id,
        )
    loops = lm.executed_loops
    assert (
        loops == pytest.approx(R)
        if policy.startswith("dense")
        else loops == pytest.approx(2.0)
        if policy == "forced:2"
        else 1.0 <= loops < R
    )


def test_argument_errors_are_one_line(checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="policy 'skip' is invalid"):
        make_lm(checkpoint, policy="skip")
    with pytest.raises(ConfigError, match="policy 'fast:1' is invalid"):
        make_lm(checkpoint, policy="fast:1")
    with pytest.raises(ConfigError, match=r"depth=5 is invalid; allowed: an integer in \[1, R=4\]"):
        make_lm(checkpoint, policy="forced:5")
    with pytest.raises(ConfigError, match="batch_size='auto' is invalid"):
        make_lm(checkpoint, batch_size="auto")
    bare = looplab.load_model("phop-debug", vocab_size=259, n_loops=R, seed=0)
    save_model(bare, tmp_path / "bare")
    with pytest.raises(ConfigError, match="carries no metadata\\['tokenizer'\\]"):
        make_lm(tmp_path / "bare")
    assert make_lm(tmp_path / "bare", tokenizer="bytes").max_length == 128  # phop-debug's train.seq_len


def test_toy_task_end_to_end_skip_runs_fewer_loops_than_dense(checkpoint, toy_tasks):
    from looplab.evaluation.harness import evaluate_tasks

    runs = {
        mode: evaluate_tasks(
            checkpoint, [TOY_TASK], include_path=toy_tasks, policy=f"{mode}:0.4", batch_size=4, device="cpu"
        )
        for mode in ("dense", "skip")
    }
    for results in runs.values():
        row = results["results"][TOY_TASK]
        assert 0.0 <= row["acc,none"] <= 1.0 and 0.0 <= row["acc_norm,none"] <= 1.0
        assert results["n-samples"][TOY_TASK]["effective"] == 10
        assert row["executed_loops"] == pytest.approx(results["executed_loops"])  # one task: same tokens
    assert runs["dense"]["results"][TOY_TASK]["executed_loops"] == pytest.approx(R)
    assert 1.0 <= runs["skip"]["results"][TOY_TASK]["executed_loops"] < R
    assert runs["skip"]["config"]["policy"] == "skip:0.4"


def test_simple_evaluate_by_model_name(checkpoint, toy_tasks):
    import lm_eval
    from lm_eval.tasks import TaskManager

    import looplab.evaluation.harness  # noqa: F401  (registers the model name)

    results = lm_eval.simple_evaluate(
        model="looplab",
        model_args=f"checkpoint={checkpoint},policy=skip:0.4,batch_size=8,device=cpu",
        tasks=[TOY_TASK],
        limit=4,
        task_manager=TaskManager(include_path=str(toy_tasks), include_defaults=False),
    )
    assert results["n-samples"][TOY_TASK]["effective"] == 4
    assert 1.0 <= results["config"]["executed_loops_by_task"][TOY_TASK] < R


def test_cli_lm_eval_writes_json(checkpoint, toy_tasks, tmp_path, capsys):
    from looplab.cli import main

    out = tmp_path / "results.json"
    code = main(
        [
            "lm-eval",
            "--checkpoint",
            str(checkpoint),
            "--tasks",
            TOY_TASK,
            "--include-path",
            str(toy_tasks),
            "--policy",
            "skip:0.4",
            "--limit",
            "3",
            "--batch-size",
            "4",
            "--device",
            "cpu",
            "--output",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == report
    row = report["tasks"][TOY_TASK]["results"]
    assert "acc,none" in row and 1.0 <= row["executed_loops"] < R
    assert main(["lm-eval", "--checkpoint", str(checkpoint)]) == 2  # neither --tasks nor --suite
    assert "--tasks is empty" in capsys.readouterr().err


# ---- the seven-task suite, offline ---------------------------------------------------
def _choices(texts):
    return {"text": texts, "label": ["A", "B", "C", "D"][: len(texts)]}


def standin_row(task: str, split: str, i: int) -> dict:
    """One row with the columns the task's lm-eval YAML (and its process_docs) read."""
    if task == "piqa":
        return {"goal": f"Open jar {i}", "sol1": "twist the lid", "sol2": "hit it", "label": i % 2}
    if task == "boolq":
        return {"question": f"is {i} even", "passage": f"The number {i}.", "idx": i, "label": int(i % 2 == 0)}
    if task == "winogrande":
        return {
            "sentence": f"Ann thanked Bo {i} because _ was kind.",
            "option1": "Ann",
            "option2": "Bo",
            "answer": "1" if i % 2 else "2",
        }
    if task == "openbookqa":
        return {
            "id": f"{split}-{i}",
            "question_stem": f"Plants need {i}",
            "choices": _choices(["light", "rocks", "noise", "glass"]),
            "answerKey": "A",
        }
    if task == "hellaswag":
        return {
            "ind": i,
            "activity_label": "Cooking",
            "ctx_a": f"A man cracks egg {i}.",
            "ctx_b": "he",
            "ctx": "",
            "endings": ["fries it.", "eats the pan.", "sings.", "leaves."],
            "source_id": "x",
            "split": split,
            "split_type": "indomain",
            "label": str(i % 4),
        }
    return {
        "id": f"{split}-{i}",
        "question": f"What melts ice {i}?",
        "choices": _choices(["heat", "cold", "dark"]),
        "answerKey": "ABC"[i % 3],
    }  # arc_easy, arc_challenge


@pytest.fixture(scope="module")
def suite_data(tmp_path_factory) -> Path:
    """DIR/<task>/<split>.parquet for every split each built-in YAML reads; 30
    training rows so arc_challenge's 25 shots can be drawn."""
    import pandas as pd

    from looplab.evaluation.paper_tasks import PAPER_TASKS, builtin_config, builtin_yaml_paths, required_splits

    root = tmp_path_factory.mktemp("suite_data")
    for task, path in builtin_yaml_paths(PAPER_TASKS).items():
        (root / task).mkdir()
        for split in required_splits(builtin_config(task, path)):
            rows = [standin_row(task, split, i) for i in range(30 if split == "train" else 3)]
            pd.DataFrame(rows).to_parquet(root / task / f"{split}.parquet")
    return root


def test_paper_suite_offline_uses_builtin_configs_and_paper_shots(checkpoint, suite_data):
    from looplab.evaluation.paper_tasks import PAPER_SHOTS, SUITE_METRICS, builtin_config, run_suite

    summary = run_suite(checkpoint, policy="skip:0.4", limit=2, local_data_dir=suite_data, batch_size=8, device="cpu")
    results = summary["lm_eval"]
    assert results["n-shot"] == PAPER_SHOTS
    assert set(summary["tasks"]) == set(PAPER_SHOTS)
    for task, row in summary["tasks"].items():
        config = results["configs"][task]
        builtin = builtin_config(task)
        # lm-eval's own prompt, splits and metrics; only the shots and the data source replaced.
        for key in ("training_split", "validation_split", "output_type"):
            assert config.get(key) == builtin.get(key), (task, key)
        if isinstance(builtin["doc_to_text"], str):
            assert config["doc_to_text"] == builtin["doc_to_text"]
        assert [m["metric"] for m in config["metric_list"]] == [m["metric"] for m in builtin["metric_list"]]
        assert config["num_fewshot"] == PAPER_SHOTS[task] == row["num_fewshot"]
        assert config["dataset_path"] == "parquet"
        assert all(Path(f).parent == suite_data / task for f in config["dataset_kwargs"]["data_files"].values())
        assert row["metric"] == SUITE_METRICS[task]
        assert row["accuracy"] == results["results"][task][f"{SUITE_METRICS[task]},none"]
        assert row["n_samples"] == 2
        assert 1.0 <= row["executed_loops"] < R
    assert summary["average"] == pytest.approx(sum(t["accuracy"] for t in summary["tasks"].values()) / 7)


def test_suite_reports_missing_local_files(tmp_path):
    from looplab.evaluation.paper_tasks import suite_configs

    with pytest.raises(ConfigError, match="local data for piqa is missing"):
        suite_configs(["piqa"], local_data_dir=tmp_path)
    with pytest.raises(ConfigError, match="suite tasks \\['mmlu'\\] are invalid"):
        suite_configs(["mmlu"])


def test_export_writes_the_splits_each_task_reads(monkeypatch, tmp_path):
    """The exporter, with the hub replaced by stand-in rows: it asks for the dataset
    each built-in YAML names and writes files that suite_configs accepts."""
    import datasets

    from looplab.evaluation.paper_tasks import export_suite_data, suite_configs

    asked = []

    def fake_load_dataset(path, name=None, **kwargs):
        asked.append((path, name))
        task = {"baber/piqa": "piqa", "allenai/ai2_arc": "arc_challenge"}[path]
        return datasets.DatasetDict(
            {
                split: datasets.Dataset.from_list([standin_row(task, split, i) for i in range(4)])
                for split in ("train", "validation", "test")
            }
        )

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    manifest = export_suite_data(tmp_path, ["piqa", "arc_challenge"])
    assert asked == [("baber/piqa", None), ("allenai/ai2_arc", "ARC-Challenge")]
    assert manifest["piqa"]["rows"] == {"train": 4, "validation": 4}  # piqa reads no test split
    assert sorted(manifest["arc_challenge"]["rows"]) == ["test", "train", "validation"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    configs = suite_configs(["piqa", "arc_challenge"], local_data_dir=tmp_path)
    assert [c["num_fewshot"] for c in configs] == [5, 25]
