"""Offline data: determinism of the shipped splits, no train/eval overlap, loaders and their errors."""

import json
from pathlib import Path

import pytest

from grpo_lab import data
from grpo_lab.rewards import is_correct


def test_regeneration_equals_shipped_splits_byte_for_byte(tmp_path):
    config = data.SplitConfig(data_dir=tmp_path)
    written = data.regenerate_splits(config)
    for split, path in written.items():
        assert path.read_bytes() == data.SplitConfig().path(split).read_bytes(), (
            f"data/{split}.jsonl differs from what grpo_lab.data generates; run python -m grpo_lab.data")


def test_same_seed_same_rows_different_seed_different_rows():
    assert data.generate_problems(40, seed=3) == data.generate_problems(40, seed=3)
    assert data.generate_problems(40, seed=3) != data.generate_problems(40, seed=4)


def test_shipped_splits_have_contract_columns_and_are_balanced():
    train, evaluation = data.load_split("train"), data.load_split("eval")
    assert len(train) == data.SplitConfig().train_size and len(evaluation) == data.SplitConfig().eval_size
    for row in train[:50] + evaluation[:50]:
        assert set(row) == {"id", "type", "lang", "prompt", "answer", "unit", "completion"}
        assert row["prompt"][0]["role"] == "user" and row["lang"] in data.LANGS
        assert row["completion"].endswith(f"#### {row['answer']}")
        assert int(row["answer"]) >= 0
    per_type = {t: sum(r["type"] == t for r in evaluation) for t in data.PROBLEM_TYPES}
    assert len(set(per_type.values())) == 1, per_type


def test_train_and_eval_share_no_problem():
    problems = data.build_split_problems()
    eval_keys = {p.key for p in problems["eval"]}
    assert not eval_keys & {p.key for p in problems["train"]}
    assert len(eval_keys) == len(problems["eval"])
    train_prompts = {json.dumps(r["prompt"], ensure_ascii=False) for r in data.load_split("train")}
    assert not train_prompts & {json.dumps(r["prompt"], ensure_ascii=False) for r in data.load_split("eval")}


def test_slips_are_consistent_and_wrong():
    for kind in data.SLIPS:
        for problem in data.generate_problem_objects(20, seed=1, types=[kind]):
            slipped = problem.completion(slip=True)
            assert slipped != problem.completion()
            assert not is_correct(slipped, str(problem.answer)) or problem.key[1:] == (2, 2)  # 2+2 = 2×2
            assert problem.completion().endswith(f"#### {problem.answer}")
    with pytest.raises(ValueError, match="no slip"):
        data.generate_problem_objects(1, seed=0, types=["speed_distance"])[0].completion(slip=True)


def test_unknown_type_or_language_is_rejected():
    with pytest.raises(ValueError, match="unknown or empty problem types"):
        data.generate_problems(2, seed=0, types=["calculus"])
    with pytest.raises(ValueError, match="languages"):
        data.generate_problems(2, seed=0, langs=["fr"])


def test_evaluation_grades_like_the_correctness_reward():
    assert is_correct("3 × 4 = 12\n#### 12", "12") and is_correct("#### 1,200 m", "1200")
    assert is_correct("#### 30.0", "30") and not is_correct("#### 31", "30")
    assert not is_correct("no marker 12", "12")  # the marker is required, as in training


def test_load_jsonl_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data file"):
        data.load_jsonl(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": 1}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: not valid JSON"):
        data.load_jsonl(bad)
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: missing column\(s\) \['answer'\]"):
        data.load_jsonl(no_answer)


def test_load_jsonl_accepts_plain_prompts(tmp_path):
    path = data.write_jsonl([{"prompt": "What is 2 + 3?", "answer": 5}], tmp_path / "plain.jsonl")
    (row,) = data.load_jsonl(path)
    assert row["prompt"] == [{"role": "user", "content": "What is 2 + 3?"}] and row["answer"] == "5"


def test_load_gsm8k_from_a_jsonl_file(tmp_path):
    path = data.write_jsonl([
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "Big numbers?", "answer": "1000 + 234 = 1234\n#### 1,234"},
    ], tmp_path / "gsm8k.jsonl")
    rows = data.load_gsm8k("train", path=path)
    assert [r["answer"] for r in rows] == ["7", "1234"]
    assert rows[0]["completion"] == "3 + 4 = 7\n#### 7" and rows[0]["type"] == "gsm8k"
    assert rows[0]["prompt"][0]["content"].startswith("Tom has 3 apples")
    broken = data.write_jsonl([{"question": "q", "answer": "no final marker"}], tmp_path / "broken.jsonl")
    with pytest.raises(ValueError, match="line 1: the 'answer' does not end with '#### <number>'"):
        data.load_gsm8k("train", path=broken)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['question'\]"):
        data.load_gsm8k("train", path=data.write_jsonl([{"prompt": "q", "answer": "#### 1"}], tmp_path / "x.jsonl"))


def test_to_dataset_keeps_columns():
    dataset = data.to_dataset(data.generate_problems(4, seed=0))
    assert len(dataset) == 4 and {"prompt", "answer", "type", "lang", "unit"} <= set(dataset.column_names)
    with pytest.raises(ValueError, match="no rows"):
        data.to_dataset([])


GSM8K_SAMPLE = Path(__file__).parent / "fixtures" / "gsm8k_train_sample.jsonl"  # real rows, MIT (fixtures/README.md)
GSM8K_SHIPPED = data.REPO_ROOT / "benchmarks" / "gsm8k" / "train.jsonl.xz"


def test_every_gsm8k_gold_solution_is_scored_right():
    """The answer checker the rewards and the evaluation use reads GSM8K's own solutions as right: thousands
    separators (``#### 1,080``) and negative answers included, calculator annotations removed."""
    rows = data.load_gsm8k("train", path=GSM8K_SAMPLE)
    assert len(rows) == 12 and {r["type"] for r in rows} == {"gsm8k"} and {r["lang"] for r in rows} == {"en"}
    assert all(is_correct(r["completion"], r["answer"]) for r in rows)
    assert {"1080", "-7"} <= {r["answer"] for r in rows} and not any("<<" in r["completion"] for r in rows)
    assert rows[0]["prompt"][0]["content"].endswith(data.INSTRUCTION["en"]) and rows[0]["id"] == "gsm8k-train-00000"
    shipped = data.load_gsm8k("train", path=GSM8K_SHIPPED)  # the whole split the benchmark and notebook 08 use
    assert len(shipped) == 7473 and all(is_correct(r["completion"], r["answer"]) for r in shipped)
    assert [r["prompt"] for r in rows[:5]] == [r["prompt"] for r in shipped[:5]]


def test_gsm8k_reads_jsonl_compressed_and_parquet_alike(tmp_path):
    import gzip
    import lzma

    import pyarrow
    import pyarrow.parquet

    records = [json.loads(line) for line in GSM8K_SAMPLE.read_text(encoding="utf-8").splitlines()]
    gzipped, xzipped = tmp_path / "train.jsonl.gz", tmp_path / "train.jsonl.xz"
    gzipped.write_bytes(gzip.compress(GSM8K_SAMPLE.read_bytes()))
    xzipped.write_bytes(lzma.compress(GSM8K_SAMPLE.read_bytes()))
    parquet = tmp_path / "train-00000-of-00001.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(records), parquet)
    rows = data.load_gsm8k("train", path=GSM8K_SAMPLE)
    assert data.load_gsm8k("train", path=gzipped) == rows == data.load_gsm8k("train", path=parquet)
    assert data.load_gsm8k("train", path=xzipped) == rows
    with pytest.raises(ValueError, match="unknown GSM8K split 'eval'"):
        data.load_gsm8k("eval", path=GSM8K_SAMPLE)
    with pytest.raises(FileNotFoundError, match="no parquet file"):
        data.load_gsm8k("test", path=tmp_path / "missing.parquet")


def test_gsm8k_from_the_hub_and_offline(monkeypatch):
    """Without a path the rows come from the hub's openai/gsm8k through datasets (replaced here: no network in
    tests); offline, or when the hub fails, the error names the file to pass instead."""
    import datasets

    records = [json.loads(line) for line in GSM8K_SAMPLE.read_text(encoding="utf-8").splitlines()]
    asked = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: asked.append((args, kwargs)) or records)
    assert data.load_gsm8k("test") == [{**row, "id": row["id"].replace("train", "test")}
                                       for row in data.load_gsm8k("train", path=GSM8K_SAMPLE)]
    assert asked == [(("openai/gsm8k", "main"), {"split": "test"})]

    def no_network(*args, **kwargs):
        raise ConnectionError("could not reach huggingface.co")

    monkeypatch.setattr(datasets, "load_dataset", no_network)
    with pytest.raises(FileNotFoundError, match=r"ConnectionError.*pass path= a local copy of GSM8K's 'train' split: "
                                                r"grade_school_math/data/train.jsonl"):
        data.load_gsm8k("train")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set: pass path=.*the train split, xz-compressed"):
        data.load_gsm8k("train")


def test_hold_out_is_deterministic_disjoint_and_order_free():
    rows = data.load_gsm8k("train", path=GSM8K_SAMPLE)
    train, held = data.hold_out(rows, size=4)
    assert len(held) == 4 and len(train) == 8
    assert not {r["id"] for r in train} & {r["id"] for r in held} and len(train + held) == len(rows)
    assert data.hold_out(rows, size=4) == (train, held)
    assert [r["id"] for r in data.hold_out(rows[::-1], size=4)[1]] == [r["id"] for r in held[::-1]]  # order-free
    assert data.hold_out(rows, size=4, seed=1)[1] != held
    for size in (0, len(rows)):
        with pytest.raises(ValueError, match="hold out at least one row"):
            data.hold_out(rows, size=size)
