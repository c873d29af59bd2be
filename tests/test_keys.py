"""looplab/keys.py: one digest and one output-path rule, and keys that stay what they were.

Every value pinned below was computed on the code before looplab/keys.py existed (the
separate helpers of looplab/config/, sweeps/sweep.py, trainables/evaluation.py, checkpoint.py
and storage.py). A store written then names its stages, sweeps, trials, evaluations and
speed points by these values, so equal values mean such a store is found and reused,
not trained or evaluated again. A test that fails here means stored results would be
orphaned: change the key on purpose (and say so), never the pinned value to match.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from looplab import keys, tracking
from looplab.checkpoint import parent_ref
from looplab.policy import ExitPolicy
from looplab.presets import get_preset, stage_config
from trainables.pipeline import PipelineSpec, checkpoint_of, stage_configs, stage_dir

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"b": [1, 2.5, None], "a": {"z": "é", "y": True}}
# pretrain → stage1 on the debug preset, β searched in stage1 (log_every: unkeyed, no effect)
SPEC = PipelineSpec(
    preset="debug",
    stages=("pretrain", "stage1"),
    overrides={"model.n_loops": 4, "train.log_every": 5},
    searched={"beta": "exit.beta"},
    searched_stages=("stage1",),
)
POINT = {"beta": 0.5, "seed": 0}
PRETRAIN_KEY, PRETRAIN_HASH = "80187bb079e5", "e7248c8ce43a"
# Moved on purpose: continued stages continue their parent's data stream since
# train.data_start (CHANGELOG.md), which enters every continued stage's key (here 3,200
# samples: pre-training's 200 steps × 16). Pre-training keys are unchanged. The keys
# before are kept: a stored Stage-1 is named by them, and the same config with
# train.data_start=0 still makes them (nothing else moved).
STAGE1_KEY, STAGE1_HASH = "ada0adf77d35", "0450541b716d"
STAGE1_KEY_BEFORE, STAGE1_HASH_BEFORE = "77cc702b6968", "e3695dd24cf1"


# ---- the digest ------------------------------------------------------------------------
def test_canonical_json_sorts_keys_in_both_forms():
    assert keys.canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert keys.canonical_json({"b": 1, "a": [1, 2]}, keys.LENIENT) == '{"a": [1, 2], "b": 1}'


def test_digest_reproduces_the_old_helpers():
    assert keys.digest(PAYLOAD) == "6077fe4a88ab"  # config._digest: stage keys, eval and speed keys
    # sweeps/plan.short_hash (since renamed sweeps/sweep.py): LENIENT form, 10 digits, str() for what JSON lacks
    assert keys.digest({**PAYLOAD, "p": Path("/a/b")}, keys.SWEEP_KEY_LENGTH, keys.LENIENT) == "eeeca92a8c"


def test_strict_form_refuses_what_json_lacks():
    with pytest.raises(TypeError):  # a stage key never depends on some object's str()
        keys.digest({"p": Path("/a/b")})


def test_a_shorter_key_is_a_prefix_of_a_longer_one():
    assert keys.digest(PAYLOAD, 20).startswith(keys.digest(PAYLOAD))


# ---- stage keys and stage folders --------------------------------------------------------
def test_stage_keys_of_the_debug_preset_are_unchanged():
    pretrain = stage_config(get_preset("debug"), "pretrain")
    assert (pretrain.stage_key(), pretrain.config_hash()) == (PRETRAIN_KEY, PRETRAIN_HASH)
    assert "data_start" not in pretrain.key_payload()["train"]  # pre-training's stream starts at 0: no key moved
    parent = pretrain.as_parent("/elsewhere/checkpoint")
    stage1 = stage_config(get_preset("debug"), "stage1", parent=parent)
    # Moved on purpose (STAGE1_KEY's comment): Stage-1 continues pre-training's stream.
    assert (stage1.stage_key(), stage1.config_hash()) == ("055dd319018f", "296f532727a9")
    before = stage_config(get_preset("debug"), "stage1", parent=parent, overrides={"train.data_start": 0})
    assert (before.stage_key(), before.config_hash()) == ("7b123be592a4", "203e8f01002a")


def test_continued_keys_moved_only_by_the_data_stream():
    spec = PipelineSpec(**{**SPEC.to_dict(), "stage_overrides": {"stage1": {"train.data_start": 0}}})
    pretrain, stage1 = stage_configs(spec, POINT, "/store")
    assert (pretrain.stage_key(), pretrain.config_hash()) == (PRETRAIN_KEY, PRETRAIN_HASH)
    assert (stage1.stage_key(), stage1.config_hash()) == (STAGE1_KEY_BEFORE, STAGE1_HASH_BEFORE)


@pytest.mark.parametrize("root", ["/store", "/another/root"])
def test_pipeline_stage_keys_do_not_depend_on_the_storage_root(root):
    pretrain, stage1 = stage_configs(SPEC, POINT, root)
    assert (pretrain.stage_key(), pretrain.config_hash()) == (PRETRAIN_KEY, PRETRAIN_HASH)
    assert (stage1.stage_key(), stage1.config_hash()) == (STAGE1_KEY, STAGE1_HASH)


def test_stage_folders_are_unchanged():
    pretrain, stage1 = stage_configs(SPEC, POINT, "/store")
    assert stage_dir("/store", pretrain) == "/store/stages/pretrain-80187bb079e5"
    # Stage-1's folder follows its key, moved on purpose (STAGE1_KEY's comment); the rule is unchanged.
    assert checkpoint_of("/store", stage1) == "/store/stages/stage1-ada0adf77d35/checkpoint"
    assert stage_dir("s3://bucket/store", stage1) == "s3://bucket/store/stages/stage1-ada0adf77d35"
    assert keys.stage_path("stage1", STAGE1_KEY_BEFORE, "checkpoint") == (
        "stages",
        "stage1-77cc702b6968",
        "checkpoint",
    )


def test_a_store_written_before_is_reused(tmp_path):
    """Stage folders named as the old code named them (literal names, done markers as
    trial.py writes them) are found as trained stages by the new code: pre-training is
    reused; the Stage-1 stored before trained on pre-training's first batches again, so
    its key moved (STAGE1_KEY's comment) and it trains again, with Stage-1 folders of
    the new key found as before."""
    from tests.store_fixture import store_stage
    from trainables.checkpoints import pipeline_checkpoints
    from trainables.pipeline import stage_configs
    from trainables.shared_stage import write_done
    from trainables.storage import Storage

    pretrain, stage1 = stage_configs(SPEC, POINT, tmp_path)
    assert store_stage(tmp_path, pretrain, "run-pre").parent.name == "pretrain-80187bb079e5"
    write_done(Storage(tmp_path), str(tmp_path / "stages" / "stage1-77cc702b6968"), {"run_id": "run-s1", "metrics": {}})
    found = pipeline_checkpoints(SPEC, [POINT], tmp_path)
    assert [(c.stage_key, c.config_hash, c.run_id) for c in found] == [(PRETRAIN_KEY, PRETRAIN_HASH, "run-pre")]
    assert store_stage(tmp_path, stage1, "run-s1-new").parent.name == "stage1-ada0adf77d35"
    found = pipeline_checkpoints(SPEC, [POINT], tmp_path)
    assert [(c.stage_key, c.config_hash, c.run_id) for c in found] == [
        (PRETRAIN_KEY, PRETRAIN_HASH, "run-pre"),
        (STAGE1_KEY, STAGE1_HASH, "run-s1-new"),
    ]
    assert found[1].path == str((tmp_path / "stages" / "stage1-ada0adf77d35" / "checkpoint").resolve())


def test_parent_ref_of_a_checkpoint_without_keys_is_unchanged():
    ref = parent_ref("/nonexistent/looplab-keys/ckpt")
    assert ref.key == ref.group == "path-f145f4eece35"


# ---- sweep and trial names ---------------------------------------------------------------
def test_sweep_keys_are_unchanged():
    from sweeps.beta_ablation import beta_ablation
    from sweeps.flags import Common, Launch
    from sweeps.sweep import Sweep, sweep_key

    launch = Launch(storage_path="/tmp/x", seeds=(0,))
    sweep = Sweep(name="keys_golden", spec=SPEC, grid={"beta": [0.1, 0.5]}, ranges={"beta": (0.01, 2.0, "log")})
    assert sweep_key(sweep, launch) == "e444ee3c51"
    assert sweep_key(beta_ablation(Common("debug"), [0.1, 0.5]), launch) == "1c35fd525e"


def test_trial_names_are_unchanged():
    from sweeps.sweep import trial_name

    assert trial_name({"beta": 0.1, "seed": 0}) == "trial-beta0.1-seed0-583acf"
    long = {"n_layers": 4, "n_loops": 6, "beta": 0.25, "arm": "chase", "hp": "1,2,3,4,5,6,7,8,9,10,11,12", "seed": 3}
    assert trial_name(long) == "trial-armchase-beta0.25-hp1,2,3,4,5,6,7,8,9,10,11,12-n_layers4-n_loops6-seed3-e1f3c3"


def test_run_and_lock_names_follow_the_rule():
    assert tracking.sweep_run_name("keys_golden", "0123456789") == "keys_golden-0123456789"
    assert tracking.trial_run_name("0123456789ab") == "trial-0123456789ab"
    assert tracking.stage_run_name("stage1", STAGE1_KEY_BEFORE) == "stage1-77cc702b6968"
    assert tracking.eval_run_name("golden", ExitPolicy.full(), "0123456789ab") == "eval-golden-full-0123456789ab"
    assert tracking.speed_run_name(1, 128, "skip:0.2", "0123456789ab") == "speed-b1-L128-skip:0.2-012345"


def test_sweep_lock_files_keep_their_names(tmp_path):
    from sweeps.lock import sweep_lock
    from trainables.storage import Storage

    with sweep_lock(Storage(tmp_path), "e444ee3c51", "keys_golden"):
        assert (tmp_path / "locks" / "sweep-e444ee3c51.lock").is_file()
        assert (tmp_path / "locks" / "sweep-e444ee3c51.json").is_file()


# ---- evaluation and speed keys -------------------------------------------------------------
# Moved on purpose (CHANGELOG.md): an evaluation or a speed point is of the weights a
# checkpoint holds, so its key reads them (keyed_step.weights_key: the stage key and the
# weights' digest); a stage trained again into other weights is no longer credited with
# its predecessor's figures. Each stored evaluation and speed point is computed once more.
WEIGHTS = "0123456789abcdef" * 4


def test_a_checkpoint_is_keyed_by_its_stage_and_its_weights():
    from trainables.keyed_step import weights_key

    assert weights_key(PRETRAIN_KEY, WEIGHTS) == "4ef65b3090a8"


def test_evaluation_keys_are_unchanged():
    from trainables.eval_tasks import EvalTask
    from trainables.evaluation import eval_key
    from trainables.keyed_step import weights_key

    task = EvalTask("golden", "include", 2, "acc", "sha256:0123456789abcdef", "cfg-0123456789ab", "/x.yaml")
    assert eval_key(weights_key(PRETRAIN_KEY, WEIGHTS), "full", task, None) == "fee9324c9c29"
    assert eval_key(weights_key(STAGE1_KEY_BEFORE, WEIGHTS), "skip:0.5", task, 0.25) == "dd4900a92e7b"


def _task_files(folder: Path) -> Path:
    (folder / "train.jsonl").write_text('{"q": "1+1", "a": "2"}\n')
    (folder / "val.jsonl").write_text('{"q": "2+2", "a": "4"}\n')
    yaml = folder / "task.yaml"
    yaml.write_text(
        "task: golden\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    train: train.jsonl\n"
        "    validation: val.jsonl\noutput_type: generate_until\ndoc_to_text: '{{q}}'\n"
        "doc_to_target: '{{a}}'\nnum_fewshot: 2\n"
    )
    return yaml


def test_task_data_digest_is_unchanged(tmp_path):
    _task_files(tmp_path)
    files = {"train": [tmp_path / "train.jsonl"], "validation": [tmp_path / "val.jsonl"]}
    assert keys.files_digest(files) == "sha256:134293de95a68caa"


def test_task_config_version_is_unchanged(tmp_path):
    pytest.importorskip("lm_eval")
    from trainables.eval_tasks import config_version

    assert config_version(_task_files(tmp_path)) == "cfg-43c8d2d4a2ea"


def test_speed_key_is_unchanged():
    from trainables.bench import SpeedPoint, speed_key

    host = {"processor": "x86_64", "cpus": 2, "threads": 1, "device": "cpu"}
    from trainables.keyed_step import weights_key

    assert speed_key(weights_key("0123456789ab", WEIGHTS), SpeedPoint(1, 128, "skip:0.2"), host, 3) == "7d8138d3eaf6"


# ---- scratch folders of an object store ---------------------------------------------------
def test_scratch_folders_are_unchanged(monkeypatch):
    from trainables import storage

    monkeypatch.setenv("LOOPLAB_SCRATCH", "/scratch-golden")
    assert storage.Storage("s3://bucket/runs").scratch("stages", "x") == Path("/scratch-golden/0863ef5cf26d/stages/x")
    monkeypatch.setattr(storage.Storage, "download_dir", lambda *args: True)  # as if downloaded
    local = storage.local_checkpoint("s3://bucket/runs/stages/pretrain-abc/checkpoint")
    assert local.name == "0843a98d62308879"


# ---- one home for keys ------------------------------------------------------------------------
SCANNED = ("looplab", "trainables", "sweeps", "analysis", "benchmarks", "scripts")


def _sources():
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def test_no_module_but_keys_hashes():
    """One text digest and one file digest (issue 36): a text's identity in a corpus and the
    tokenizer file's check are keys.text_digest and keys.file_digest too."""
    users = {name for name, text in _sources() if re.search(r"\bhashlib\b", text)}
    assert users == {"looplab/keys.py"}, sorted(users - {"looplab/keys.py"})


def test_a_documents_digest_is_unchanged():
    """A corpus is deduplicated and split into validation and training documents in the
    order of its documents' digests (looplab/tasks/text.py): the whole SHA-256 of the text."""
    from looplab.tasks.text import Document

    whole = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"  # SHA-256 of b"hello"
    assert Document("d", "hello").digest == keys.text_digest("hello", keys.FULL_LENGTH) == whole
    assert keys.text_digest("hello") == whole[: keys.KEY_LENGTH]


def test_no_module_but_keys_spells_a_stage_folder():
    spelled = re.compile(r'f"\{[^}"]*stage[^}"]*\}-\{|(?:path|scratch)\(\s*"stages"')
    offenders = [name for name, text in _sources() if name != "looplab/keys.py" and spelled.search(text)]
    assert offenders == []


def test_keys_imports_only_the_standard_library():
    tree = ast.parse((ROOT / "looplab" / "keys.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "collections", "dataclasses", "hashlib", "json", "pathlib", "typing"}


# ---- keys that follow the data ------------------------------------------------------------------
def _text_chain(dataset: str) -> tuple[str, str]:
    """(pretrain key, stage1 key) of the debug preset reading `dataset`."""
    pretrain = stage_config(get_preset("debug"), "pretrain", overrides={"task.dataset": dataset})
    stage1 = stage_config(
        get_preset("debug"), "stage1", parent=pretrain.as_parent("/anywhere"), overrides={"task.dataset": dataset}
    )
    return pretrain.stage_key(), stage1.stage_key()


def test_local_data_enters_the_key_by_content(tmp_path):
    """A file changed under the same path makes new keys down the chain (a sweep never
    reuses a child of the old data); the same bytes under another path make the same keys."""
    data = tmp_path / "a" / "corpus.jsonl"
    data.parent.mkdir()
    data.write_text('{"text": "to be or not to be"}\n')
    before = _text_chain(str(data))
    data.write_text('{"text": "that is the question, whether"}\n')
    after = _text_chain(str(data))
    assert before[0] != after[0] and before[1] != after[1]
    moved = tmp_path / "b" / "renamed.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(data.read_bytes())
    assert _text_chain(str(moved)) == after
    # read as JSON rows or as one text document: another corpus from the same bytes
    as_text = tmp_path / "b" / "renamed.txt"
    as_text.write_bytes(data.read_bytes())
    assert _text_chain(str(as_text))[0] != after[0]


def test_the_data_digest_is_read_once_per_config(tmp_path, monkeypatch):
    from looplab.tasks import text_sources

    data = tmp_path / "corpus.txt"
    data.write_text("some text\n")
    cfg = stage_config(get_preset("debug"), "pretrain", overrides={"task.dataset": str(data)})
    reads = []
    monkeypatch.setattr(text_sources, "file_digest", lambda path: reads.append(path) or "sha256:0")
    for _ in range(3):
        cfg.stage_key(), cfg.config_hash()
    assert len(reads) == 1
