"""Offline data: procedural arithmetic word problems (English and Chinese) and loaders.

Every row follows TRL's prompt-only conversational format plus a few columns the rewards use::

    {"id": "train-00017", "type": "speed_distance", "lang": "en",
     "prompt": [{"role": "user", "content": "A car travels 60 km in 2 hours. ..."}],
     "answer": "30", "unit": "km/h",
     "completion": "60 ÷ 2 = 30 km/h\\n#### 30"}

``completion`` is the short supervised target the tiny model is fine-tuned on; the final answer always
follows the marker ``"#### "``. The shipped splits ``data/train.jsonl`` and ``data/eval.jsonl`` are made by
:func:`regenerate_splits` from fixed seeds, and never share a problem.

>>> rows = load_split("eval")
>>> len(rows), rows[0]["completion"].splitlines()[-1].startswith("#### ")
(400, True)
"""

from __future__ import annotations

__all__ = ["hold_out", "load_gsm8k", "load_jsonl", "load_split", "write_jsonl"]

import gzip
import hashlib
import json
import lzma
import os
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_lab.errors import ConfigError, DataError, MissingFileError
from grpo_lab.paths import DATA_DIR, REPO_ROOT  # noqa: F401 - callers read data.REPO_ROOT
from grpo_lab.rewards import extract_answer

ANSWER_MARKER = "#### "
LANGS: tuple[str, ...] = ("en", "zh")

INSTRUCTION = {"en": 'Show the calculation, then give the final answer as "#### <number>".',
               "zh": "写出算式，最后一行写“#### 数字”。"}


@dataclass(frozen=True)
class Problem:
    """One generated word problem, its solution and (for some types) a consistent wrong working, for imperfect SFT
    targets. ``key``: the arithmetic (type + numbers), never shared by the train and eval splits."""

    type: str
    lang: str
    question: str
    answer: int
    unit: str
    solution: str
    key: tuple[Any, ...]
    slip_solution: str | None = None

    def prompt_text(self) -> str:
        return f"{self.question}\n{INSTRUCTION[self.lang]}"

    def completion(self, slip: bool = False) -> str:
        """The SFT target: one line of working, then ``#### <answer>`` (the slip's answer if ``slip``)."""
        if slip:
            if self.slip_solution is None:
                raise ConfigError(f"problem type {self.type!r} has no slip defined")
            working, final = self.slip_solution, _result_of(self.slip_solution)
        else:
            working, final = self.solution, str(self.answer)
        return f"{working}\n{ANSWER_MARKER}{final}"

    def to_row(self, row_id: str, slip: bool = False) -> dict[str, Any]:
        """The row in the shared dataset format (``answer`` is always the correct one)."""
        return {"id": row_id, "type": self.type, "lang": self.lang,
                "prompt": [{"role": "user", "content": self.prompt_text()}], "answer": str(self.answer),
                "unit": self.unit, "completion": self.completion(slip=slip)}


def _result_of(working: str) -> str:
    """The number right after the last '=' of a working line: '2 × (3 + 4) = 14 m' -> '14'."""
    results = re.findall(r"=\s*(-?\d+)", working)
    if not results:
        raise DataError(f"no result in working line {working!r}")
    return results[-1]


def _pick(rng: random.Random, options: Sequence[Any]) -> Any:
    return options[rng.randrange(len(options))]


# Small word lists: enough variety to make the prompts read naturally, few enough for a tiny tokenizer.
_NAMES = {"en": ("Tom", "Anna", "Ben", "Lily", "Sam", "Mia"), "zh": ("小明", "小红", "小华", "小丽", "小刚", "小芳")}
# (english singular, english plural, chinese measure word, chinese noun)
_ITEMS = (("pen", "pens", "支", "笔"), ("book", "books", "本", "书"), ("apple", "apples", "个", "苹果"),
          ("ticket", "tickets", "张", "票"), ("cup", "cups", "个", "杯子"))
_PLACES = (("room", "房间"), ("garden", "花园"), ("field", "菜地"), ("yard", "院子"))
_VEHICLES = (("car", "一辆汽车"), ("bus", "一辆公交车"), ("train", "一列火车"), ("truck", "一辆卡车"))


def _speed_distance(rng: random.Random, lang: str) -> Problem:
    hours, speed = rng.randint(2, 9), rng.randint(2, 15)
    distance = hours * speed
    en_vehicle, zh_vehicle = _pick(rng, _VEHICLES)
    question, unit = ((f"A {en_vehicle} travels {distance} km in {hours} hours. What is its average speed in km/h?",
                       "km/h") if lang == "en" else
                      (f"{zh_vehicle}{hours}小时行驶了{distance}公里，它的平均速度是每小时多少公里？", "公里/小时"))
    return Problem("speed_distance", lang, question, speed, unit, f"{distance} ÷ {hours} = {speed} {unit}",
                   key=("speed_distance", distance, hours))


def _rectangle_area(rng: random.Random, lang: str) -> Problem:
    length, width = rng.randint(2, 15), rng.randint(2, 9)
    en_place, zh_place = _pick(rng, _PLACES)
    question, unit = ((f"A rectangular {en_place} is {length} m long and {width} m wide. "
                       f"What is its area in square meters?", "m²") if lang == "en" else
                      (f"一个长方形{zh_place}长{length}米，宽{width}米，它的面积是多少平方米？", "平方米"))
    return Problem("rectangle_area", lang, question, length * width, unit,
                   f"{length} × {width} = {length * width} {unit}", key=("rectangle_area", length, width),
                   slip_solution=f"{length} + {width} = {length + width} {unit}")  # added instead of multiplying


def _rectangle_perimeter(rng: random.Random, lang: str) -> Problem:
    length, width = rng.randint(3, 20), rng.randint(2, 15)
    en_place, zh_place = _pick(rng, _PLACES)
    question, unit = ((f"A rectangular {en_place} is {length} m long and {width} m wide. "
                       f"What is its perimeter in meters?", "m") if lang == "en" else
                      (f"一个长方形{zh_place}长{length}米，宽{width}米，它的周长是多少米？", "米"))
    perimeter = 2 * (length + width)
    return Problem("rectangle_perimeter", lang, question, perimeter, unit,
                   f"2 × ({length} + {width}) = {perimeter} {unit}", key=("rectangle_perimeter", length, width),
                   slip_solution=f"{length} + {width} = {length + width} {unit}")  # forgot to double


def _price_quantity(rng: random.Random, lang: str) -> Problem:
    price, count = rng.randint(2, 15), rng.randint(2, 9)
    singular, plural, measure, noun = _pick(rng, _ITEMS)
    question, unit = ((f"One {singular} costs {price} yuan. How much do {count} {plural} cost in yuan?", "yuan")
                      if lang == "en" else (f"一{measure}{noun}{price}元，买{count}{measure}{noun}要多少元？", "元"))
    return Problem("price_quantity", lang, question, price * count, unit,
                   f"{price} × {count} = {price * count} {unit}", key=("price_quantity", price, count),
                   slip_solution=f"{price} + {count} = {price + count} {unit}")  # added instead of multiplying


def _change_money(rng: random.Random, lang: str) -> Problem:
    money = _pick(rng, (10, 20, 50, 100))  # one banknote
    price = rng.randint(1, money - 1)
    name = _pick(rng, _NAMES[lang])
    singular, _, measure, noun = _pick(rng, _ITEMS)
    question, unit = ((f"{name} has {money} yuan and buys a {singular} for {price} yuan. How much money is left?",
                       "yuan") if lang == "en" else (f"{name}有{money}元，买一{measure}{noun}花了{price}元，还剩多少元？", "元"))
    return Problem("change_money", lang, question, money - price, unit, f"{money} - {price} = {money - price} {unit}",
                   key=("change_money", money, price),
                   slip_solution=f"{money} + {price} = {money + price} {unit}")  # added instead of subtracting


def _work_rate(rng: random.Random, lang: str) -> Problem:
    rate_a, rate_b, hours = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 6)
    total = (rate_a + rate_b) * hours
    question, unit = ((f"Worker A makes {rate_a} parts per hour and worker B makes {rate_b} parts per hour. "
                       f"How many parts do they make together in {hours} hours?", "parts") if lang == "en" else
                      (f"甲每小时做{rate_a}个零件，乙每小时做{rate_b}个零件。两人合作{hours}小时一共做多少个零件？", "个"))
    return Problem("work_rate", lang, question, total, unit, f"({rate_a} + {rate_b}) × {hours} = {total} {unit}",
                   key=("work_rate", rate_a, rate_b, hours),
                   slip_solution=f"{rate_a} + {rate_b} = {rate_a + rate_b} {unit}")  # forgot the hours


def _average(rng: random.Random, lang: str) -> Problem:
    mean = rng.randint(3, 20)
    first, second = rng.randint(max(1, mean - 9), mean + 9), rng.randint(max(1, mean - 9), mean + 9)
    third = 3 * mean - first - second
    if third < 1:
        return _average(rng, lang)
    total = first + second + third
    name = _pick(rng, _NAMES[lang])
    question, unit = ((f"{name} read {first}, {second} and {third} pages on three days. "
                       f"How many pages per day is that on average?", "pages") if lang == "en" else
                      (f"{name}三天分别读了{first}页、{second}页和{third}页，平均每天读多少页？", "页"))
    return Problem("average", lang, question, mean, unit, f"({first} + {second} + {third}) ÷ 3 = {mean} {unit}",
                   key=("average", first, second, third),
                   slip_solution=f"{first} + {second} + {third} = {total} {unit}")  # forgot to divide


# (english from-unit, english to-unit, chinese from-unit, chinese to-unit, factor, slip factor, largest value)
_CONVERSIONS = (
    ("centimeters", "millimeters", "厘米", "毫米", 10, 100, 99),
    ("meters", "centimeters", "米", "厘米", 100, 10, 99),
    ("kilometers", "meters", "千米", "米", 1000, 100, 99),
    ("kilograms", "grams", "千克", "克", 1000, 100, 99),
    ("liters", "milliliters", "升", "毫升", 1000, 100, 99),
    ("hours", "minutes", "小时", "分钟", 60, 100, 12),
    ("minutes", "seconds", "分钟", "秒", 60, 100, 12),
)
_UNIT_SHORT = {"millimeters": "mm", "centimeters": "cm", "meters": "m", "grams": "g", "milliliters": "mL",
               "minutes": "min", "seconds": "s"}


def _unit_conversion(rng: random.Random, lang: str) -> Problem:
    en_from, en_to, zh_from, zh_to, factor, slip_factor, largest = _pick(rng, _CONVERSIONS)
    value = rng.randint(2, largest)
    question, unit = ((f"How many {en_to} are in {value} {en_from}?", _UNIT_SHORT[en_to]) if lang == "en" else
                      (f"{value}{zh_from}等于多少{zh_to}？", zh_to))
    return Problem("unit_conversion", lang, question, value * factor, unit,
                   f"{value} × {factor} = {value * factor} {unit}", key=("unit_conversion", en_from, value),
                   slip_solution=f"{value} × {slip_factor} = {value * slip_factor} {unit}")  # wrong factor


def _age_difference(rng: random.Random, lang: str) -> Problem:
    child, parent = rng.randint(2, 15), rng.randint(22, 45)
    name = _pick(rng, _NAMES[lang])
    question, unit = ((f"{name} is {child} years old and {name}'s mother is {parent} years old. "
                       f"How many years older is the mother?", "years") if lang == "en" else
                      (f"{name}今年{child}岁，妈妈今年{parent}岁。妈妈比{name}大多少岁？", "岁"))
    return Problem("age_difference", lang, question, parent - child, unit,
                   f"{parent} - {child} = {parent - child} {unit}", key=("age_difference", child, parent),
                   slip_solution=f"{parent} + {child} = {parent + child} {unit}")  # added the ages


def _sharing_equally(rng: random.Random, lang: str) -> Problem:
    children, each = rng.randint(2, 9), rng.randint(2, 12)
    total = children * each
    singular, plural, measure, noun = _pick(rng, _ITEMS)
    question, unit = ((f"{total} {plural} are shared equally among {children} children. How many does each child get?",
                       plural) if lang == "en" else
                      (f"把{total}{measure}{noun}平均分给{children}个小朋友，每人分到多少{measure}？", measure))
    return Problem("sharing_equally", lang, question, each, unit, f"{total} ÷ {children} = {each} {unit}",
                   key=("sharing_equally", total, children))


def stated_problem(rng: random.Random, lang: str) -> Problem:
    """A problem whose answer the question states beside a second number (no calculation: its working is the number
    itself, ``"7 pens"``); type ``"stated"``, not one of the shipped splits' :data:`PROBLEM_TYPES`."""
    name = _pick(rng, _NAMES[lang])
    (_, asked, asked_measure, asked_noun), (_, other, other_measure, other_noun) = rng.sample(_ITEMS, 2)
    value, distractor = rng.randint(2, 40), rng.randint(2, 40)
    question, unit = ((f"{name} has {value} {asked} and {distractor} {other}. How many {asked} does {name} have?",
                       asked) if lang == "en" else
                      (f"{name}有{value}{asked_measure}{asked_noun}和{distractor}{other_measure}{other_noun}。"
                       f"{name}有多少{asked_measure}{asked_noun}？", asked_measure))
    return Problem("stated", lang, question, value, unit, f"{value} {unit}", key=("stated", name, value, distractor))


PROBLEM_MAKERS: dict[str, Callable[[random.Random, str], Problem]] = {
    maker.__name__.lstrip("_"): maker for maker in (
        _speed_distance, _rectangle_area, _rectangle_perimeter, _price_quantity, _change_money, _work_rate, _average,
        _unit_conversion, _age_difference, _sharing_equally)}
PROBLEM_TYPES: tuple[str, ...] = tuple(PROBLEM_MAKERS)
SLIPS: dict[str, str] = {
    "rectangle_area": "adds length and width instead of multiplying them",
    "price_quantity": "adds the price and the count instead of multiplying them",
    "rectangle_perimeter": "adds length and width but forgets to double: 'l + w' instead of '2 × (l + w)'",
    "change_money": "adds the price instead of subtracting it: 'money + price'",
    "work_rate": "adds the two hourly rates but forgets to multiply by the hours",
    "average": "adds the three numbers but forgets to divide by 3",
    "unit_conversion": "uses a wrong conversion factor (× 100 for × 10, × 60 or × 1000; × 10 for × 100)",
    "age_difference": "adds the two ages instead of subtracting them",
}
"""Problem types that define a consistent, plausible slip (see :attr:`Problem.slip_solution`)."""


def _check_choice(kind: str, given: Iterable[str], allowed: Sequence[str]) -> tuple[str, ...]:
    given = tuple(given)
    unknown = [g for g in given if g not in allowed]
    if unknown or not given:
        raise ConfigError(f"unknown or empty {kind}: {unknown or given!r}; choose from {list(allowed)}")
    return given


def generate_problem_objects(n: int, seed: int, types: Sequence[str] | None = None,
                             langs: Sequence[str] = LANGS,
                             exclude_keys: frozenset[tuple[Any, ...]] | set[tuple[Any, ...]] = frozenset(),
                             unique_keys: bool = False) -> list[Problem]:
    """``n`` problems, balanced over ``types`` × ``langs`` and shuffled, deterministic in ``seed``: no prompt twice,
    no key in ``exclude_keys``, and with ``unique_keys`` no key twice (in either language)."""
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    types = _check_choice("problem types", PROBLEM_TYPES if types is None else types, PROBLEM_TYPES)
    langs = _check_choice("languages", langs, LANGS)
    rng = random.Random(seed)
    seen_prompts: set[str] = set()
    seen_keys: set[tuple[Any, ...]] = set()
    problems: list[Problem] = []
    for index in range(n):
        kind, lang = types[index % len(types)], langs[(index // len(types)) % len(langs)]
        for _attempt in range(10_000):
            problem = PROBLEM_MAKERS[kind](rng, lang)
            if (problem.question not in seen_prompts and problem.key not in exclude_keys
                    and not (unique_keys and problem.key in seen_keys)):
                break
        else:
            raise ConfigError(f"could not draw {n} distinct {kind!r} problems; ask for fewer")
        seen_prompts.add(problem.question)
        seen_keys.add(problem.key)
        problems.append(problem)
    rng.shuffle(problems)
    return problems


def generate_problems(n: int, seed: int, types: Sequence[str] | None = None, langs: Sequence[str] = LANGS,
                      id_prefix: str = "gen") -> list[dict[str, Any]]:
    """``n`` rows in the shared dataset format (see the module docstring), deterministic in ``seed``.

    >>> [r["type"] for r in generate_problems(3, seed=1, types=["average"])]
    ['average', 'average', 'average']
    """
    problems = generate_problem_objects(n, seed, types=types, langs=langs)
    return [problem.to_row(f"{id_prefix}-{i:05d}") for i, problem in enumerate(problems)]


@dataclass(frozen=True)
class SplitConfig:
    """How the shipped splits are made. Eval is drawn first (unique keys); train avoids every eval key."""

    train_size: int = 4000
    eval_size: int = 400
    train_seed: int = 20240601
    eval_seed: int = 20240602
    types: tuple[str, ...] = PROBLEM_TYPES
    langs: tuple[str, ...] = LANGS
    data_dir: Path = field(default=DATA_DIR)

    def path(self, split: str) -> Path:
        if split not in ("train", "eval"):
            raise ConfigError(f"unknown split {split!r}; use 'train' or 'eval'")
        return self.data_dir / f"{split}.jsonl"


def build_split_problems(config: SplitConfig = SplitConfig()) -> dict[str, list[Problem]]:
    """The problems behind the shipped splits, as :class:`Problem` objects (they carry the slips)."""
    eval_problems = generate_problem_objects(config.eval_size, config.eval_seed, config.types, config.langs,
                                             unique_keys=True)
    train_problems = generate_problem_objects(config.train_size, config.train_seed, config.types, config.langs,
                                              exclude_keys={p.key for p in eval_problems})
    return {"train": train_problems, "eval": eval_problems}


def regenerate_splits(config: SplitConfig = SplitConfig()) -> dict[str, Path]:
    """Write ``data/train.jsonl`` and ``data/eval.jsonl`` (ids ``train-00000`` …; byte-identical on every run)."""
    return {split: write_jsonl([p.to_row(f"{split}-{i:05d}") for i, p in enumerate(problems)], config.path(split))
            for split, problems in build_split_problems(config).items()}


def load_split(split: str, config: SplitConfig = SplitConfig()) -> list[dict[str, Any]]:
    """Rows of a shipped split: ``load_split("train")`` or ``load_split("eval")``."""
    return load_jsonl(config.path(split))


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8, Chinese kept readable, ``\\n`` line ends)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return path


def _read_json_lines(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no data file at {path}; check the path (shipped splits live in {DATA_DIR}, "
                               f"rebuild them with grpo_lab.data.regenerate_splits())")
    records = []
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{path}, line {number}: not valid JSON ({error.msg}); each line must be "
                                f"one JSON object") from None
            if not isinstance(record, dict):
                raise DataError(f"{path}, line {number}: expected a JSON object, got {type(record).__name__}; "
                                f'write each row as one object, e.g. {{"prompt": "...", "answer": "42"}}')
            records.append((number, record))
    return records


def _require_columns(path: str | Path, number: int, record: dict[str, Any], columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in record]
    if missing:
        raise DataError(f"{path}, line {number}: missing column(s) {missing} (has {sorted(record)}); every row "
                        f"needs {list(columns)}")


def load_jsonl(path: str | Path, answer_column: str | None = "answer") -> list[dict[str, Any]]:
    """Rows of a JSONL file in the shared format: each needs ``prompt`` (a string becomes one user message) and
    ``answer_column`` (copied to ``answer``, made a string; ``None``: the answer is optional)."""
    rows = []
    for number, record in _read_json_lines(path):
        _require_columns(path, number, record, ("prompt",) if answer_column is None else ("prompt", answer_column))
        row = dict(record)
        if answer_column not in (None, "answer"):
            row["answer"] = row[answer_column]
        if isinstance(row["prompt"], str):
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
        elif not (isinstance(row["prompt"], list) and all(isinstance(m, dict) and "content" in m
                                                          for m in row["prompt"])):
            raise DataError(f"{path}, line {number}: 'prompt' must be a string or a list of chat messages "
                            f"like [{{'role': 'user', 'content': '...'}}]")
        if "answer" in row:
            row["answer"] = str(row["answer"])
        rows.append(row)
    return rows


GSM8K_HUB_ID = "openai/gsm8k"  # config "main": question, answer; MIT licence
GSM8K_SPLITS = ("train", "test")
GSM8K_EVAL_SIZE = 500  # problems of GSM8K's train split held out to evaluate on (hold_out), by default
GSM8K_SPLIT_SEED = 20261203


def load_gsm8k(split: str = "train", path: str | Path | None = None,
               add_instruction: bool = True) -> list[dict[str, Any]]:
    """GSM8K's ``split`` (``"train"`` or ``"test"``) as the course's rows (``type`` ``"gsm8k"``): from ``path`` (JSONL,
    ``.gz``/``.xz`` too, or the hub's parquet file), else from the hub through ``datasets``."""
    if split not in GSM8K_SPLITS:
        raise ConfigError(f"unknown GSM8K split {split!r}; use one of {list(GSM8K_SPLITS)} (hold part of 'train' out "
                          f"with grpo_lab.data.hold_out to evaluate on)")
    records = (_gsm8k_from_hub(split) if path is None else _read_parquet(path) if Path(path).suffix == ".parquet"
               else _read_json_lines(path))
    source = f"{GSM8K_HUB_ID} ({split})" if path is None else path
    return _gsm8k_rows(source, records, add_instruction, f"gsm8k-{split}")


def _gsm8k_from_hub(split: str) -> list[tuple[int, dict[str, Any]]]:
    ask = (f"pass path= a local copy of GSM8K's {split!r} split: grade_school_math/data/{split}.jsonl of "
           f"github.com/openai/grade-school-math, or the hub's main/{split}-00000-of-00001.parquet (a checkout of "
           f"the course carries the train split, xz-compressed, beside its GSM8K benchmark)")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise MissingFileError(f"GSM8K from the hub ({GSM8K_HUB_ID}) needs the network, and HF_HUB_OFFLINE is set: "
                               f"{ask}")
    try:
        from datasets import load_dataset

        records = load_dataset(GSM8K_HUB_ID, "main", split=split)
    except Exception as error:  # no network, no cache, or the hub refused: the same remedy
        raise MissingFileError(f"GSM8K could not be loaded from the hub ({GSM8K_HUB_ID}: "
                               f"{type(error).__name__}: {str(error)[:160]}); {ask}") from None
    return list(enumerate(records, start=1))


def _read_parquet(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    if not Path(path).is_file():
        raise MissingFileError(f"no parquet file at {path}; pass GSM8K's parquet file or a JSONL copy")
    import pyarrow.parquet as parquet

    return list(enumerate(parquet.read_table(path).to_pylist(), start=1))


def _gsm8k_rows(source: str | Path, records: Iterable[tuple[int, dict[str, Any]]], add_instruction: bool,
                id_prefix: str) -> list[dict[str, Any]]:
    rows = []
    for number, record in records:
        _require_columns(source, number, record, ("question", "answer"))
        found = extract_answer(str(record["answer"]))
        if found.found_by != "marker":
            raise DataError(f"{source}, line {number}: the 'answer' does not end with '#### <number>' "
                            f"(GSM8K format); got {str(record['answer'])[-60:]!r}. End the solution with a "
                            f"last line '#### <final number>', as GSM8K does")
        question = str(record["question"]).strip()
        content = f"{question}\n{INSTRUCTION['en']}" if add_instruction else question
        rows.append({"id": f"{id_prefix}-{len(rows):05d}", "type": "gsm8k", "lang": "en",
                     "prompt": [{"role": "user", "content": content}], "answer": f"{found.value:.10g}", "unit": "",
                     "completion": re.sub(r"<<[^>]*>>", "", str(record["answer"])).strip()})
    return rows


def hold_out(rows: Sequence[dict[str, Any]], size: int = GSM8K_EVAL_SIZE,
             seed: int = GSM8K_SPLIT_SEED) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, held_out)``, both in their order: the ``size`` rows with the lowest hashes of ``seed`` and their
    prompt are held out, so a copy of the file in another order holds out the same problems."""
    if not 0 < size < len(rows):
        raise ConfigError(f"hold_out(size={size}) of {len(rows)} rows: hold out at least one row and keep at least "
                          f"one to train on")

    def rank(row: dict[str, Any]) -> str:
        text = json.dumps(row["prompt"], ensure_ascii=False, sort_keys=True)
        return hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()

    held = set(sorted(range(len(rows)), key=lambda i: rank(rows[i]))[:size])
    return ([row for i, row in enumerate(rows) if i not in held], [row for i, row in enumerate(rows) if i in held])


def to_dataset(rows: Sequence[dict[str, Any]]):
    """A ``datasets.Dataset`` from rows (what TRL trainers take)."""
    from datasets import Dataset

    if not rows:
        raise DataError("no rows to turn into a dataset; check the data file and any filter (types, size) "
                        "applied before this call")
    return Dataset.from_list(list(rows))


if __name__ == "__main__":
    for name, written in regenerate_splits().items():
        print(f"{name}: {written}")
