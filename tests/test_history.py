"""The product holds code, not history: no file under grpo_lab/ names a card model the project measured on, a date,
a commit, an issue, a notebook number, a path under benchmarks/ or a measured figure. The figure behind a caveat lives
beside its run under benchmarks/; the package states the rule. One test per file, so a failure names what remains."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_lab"
FILES = sorted([*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.txt")])  # code and the stack files shipped with it

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sep(?:t(?:ember)?)?"
          r"|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_NUMBER = r"(?<![\w.])[+-]?\d+(?:[.,]\d+)?"
_TIME = r"(?:ms|µs|us|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)"
_SIZE = r"(?:[KMGT]i?B|bytes)"

PATTERNS: dict[str, re.Pattern[str]] = {
    "card model": re.compile(
        r"\b(?:[ABH]\d{2,3}[A-Z]?|GB\d{3}|[VPT]100|T4|L4|L40S?|A10G?|A[4-6]000|MI\d{3}[AX]?|RTX\s?\d{4}"
        r"|(?:Ascend\s?)?910[ABC]\d?|310P\d?)\b"),
    "date": re.compile(rf"\b(?:20\d\d-[01]\d-[0-3]\d|{_MONTH}\.?\s+(?:[0-3]?\d(?:st|nd|rd|th)?,?\s+)?20\d\d)\b"),
    "commit": re.compile(r"(?<![\w#./:-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w.-])"
                         r"|\brun_[0-9a-f]{7,40}\b"),
    "issue": re.compile(r"\b(?:issues?|PR|pull request)\s+#?\d+\b|(?<![\w&#])#\d{1,5}\b(?![\w.])", re.IGNORECASE),
    "notebook": re.compile(r"\bnotebooks?\s+\d\d\b|\b[0-9]\d_[a-z][a-z0-9]*(?:_[a-z0-9]+)*\b|\blessons?\s+\d\d\b",
                           re.IGNORECASE),
    "benchmarks path": re.compile(r"\bbenchmarks/"),
    "measured figure": re.compile(
        rf"{_NUMBER}\s?(?:{_TIME}|{_SIZE}|%)\s*(?:→|->)"  # a before/after pair: 22 % -> 45 %
        rf"|(?<![\w.:<>^])\d+\.\d+\s?(?:{_TIME}|{_SIZE}|%)(?![\w/])"  # 95.6 s, 15.4 GiB, 6.0 % (not {x:5.1%})
        rf"|{_NUMBER}\s?k?\s?(?:tok(?:ens)?|it|samples|req(?:uests)?)/s\b"  # 40 k tok/s
        rf"|(?<![\w.])(?:\d+\.\d+\s?[x×](?!\s*[(\d])|\d+[x×](?![\w(]))"  # 1.70x, 40x (not 2 × (3 + 4))
        rf"|{_NUMBER}\s?SE\b"  # +7.7 SE
        rf"|(?:measured|took|ran|takes|runs at|≈|~)\s?(?:about\s)?\d+(?:\.\d+)?\s?(?:{_TIME}|{_SIZE}|%)(?![\w/])",
        re.IGNORECASE),
}

_PICKED = "the memory calculator's device sizes a user picks from: a user's choice, not a measurement"
_BF16 = "a hardware rule the device module applies (910A has no bf16), not a measurement"
_DOCTEST = "a doctest: the function's output for the inputs on the line above, not a measurement"
ALLOWED: tuple[tuple[str, str, str, str], ...] = (
    # (kind, the matched text, a piece of its line, why it is not history); every entry must still match somewhere
    ("card model", "Ascend 910B", 'DevicePreset("Ascend 910B', _PICKED),
    ("card model", "RTX 4090", 'DevicePreset("24 GB GPU (RTX 4090, A10)"', _PICKED),
    ("card model", "A10", 'DevicePreset("24 GB GPU (RTX 4090, A10)"', _PICKED),
    ("card model", "A100", 'DevicePreset("A100', _PICKED),
    ("card model", "H200", 'DevicePreset("H200 141 GB"', _PICKED),
    ("card model", "Ascend 910B", "Ascend 910B and later (910A has no bf16)", _BF16),
    ("card model", "910A", "Ascend 910B and later (910A has no bf16)", _BF16),
    ("card model", "910B", '"910B" in device_name(kind="npu")', _BF16),
    ("measured figure", "23.4% →", "'greedy accuracy fell 9.6 points (23.4% → 13.8%)'", _DOCTEST),
    ("measured figure", "13.8%", "'greedy accuracy fell 9.6 points (23.4% → 13.8%)'", _DOCTEST),
    ("measured figure", "22.8%", "types 22.8% before training: the model was fine-tuned", _DOCTEST),
)


def _allowed(kind: str, text: str, line: str) -> bool:
    return any(kind == k and text == t and piece in line for k, t, piece, _ in ALLOWED)


def hits(path: Path) -> list[tuple[int, str, str]]:
    """``(line, kind, text)`` of every match in one file that the allowlist does not cover."""
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for kind, pattern in PATTERNS.items():
            found += [(number, kind, m.group().strip()) for m in pattern.finditer(line)
                      if not _allowed(kind, m.group().strip(), line)]
    return found


@pytest.mark.parametrize("path", FILES, ids=[p.relative_to(PACKAGE).as_posix() for p in FILES])
def test_the_file_holds_no_history(path):
    found = hits(path)
    where = path.relative_to(PACKAGE.parent).as_posix()
    assert not found, "history in the package (state the rule; the figure lives beside its run):\n" + "\n".join(
        f"{where}:{line}: {kind}: {text!r}" for line, kind, text in found)


def test_every_allowed_exception_still_matches():
    lines = [line for path in FILES for line in path.read_text(encoding="utf-8").splitlines()]
    stale = [(kind, text, piece) for kind, text, piece, _ in ALLOWED
             if not any(piece in line and text in [m.group().strip() for m in PATTERNS[kind].finditer(line)]
                        for line in lines)]
    assert not stale, f"allowlist entries that match nothing any more (remove them): {stale}"


@pytest.mark.parametrize("kind, text", [
    ("card model", "measured on the H200"), ("card model", "an Ascend 910B3"), ("card model", "one A100"),
    ("date", "re-measured 2026-12-01"), ("date", "in December 2026"), ("commit", "at commit `9efcfac`"),
    ("commit", "see run_533a896"), ("issue", "issue 42's target"), ("issue", "fixed in #26"),
    ("notebook", "notebook 04 plans it"), ("notebook", "notebooks 03-05"), ("notebook", "03_grpo_training"),
    ("benchmarks path", "benchmarks/capped/results/"), ("measured figure", "took 95.6 s"),
    ("measured figure", "1.70x faster"), ("measured figure", "≈ 40 k tok/s"), ("measured figure", "15.4 GiB"),
    ("measured figure", "+7.7 SE"), ("measured figure", "format 22 % → 45 %"), ("measured figure", "measured 22 %"),
])
def test_the_scan_finds_history(kind, text):
    assert PATTERNS[kind].search(text), (kind, text)


@pytest.mark.parametrize("text", [
    "color='#1f77b4'", "timeout_s: float = 600.0", "def f(x):  # 4-bit base", "sha256 = 'ab' * 32",
    "max_tokens=256", "a LoRA update smaller than one 4-bit step", "GRPO_LAB_PROFILE=tiny", "f'{x:.1f} s'",
    "2**30", "the v0.2 shims", "Qwen2.5-0.5B", "item[0]", "# noqa: E402", "utf-8", "x_03_name",
    "'2 × (3 + 4) = 14 m'", "ceil(1.1 x (prompt + completion))", "f'{share:>6.1%}'", "10_000", "notebooks/NN_*.ipynb",
])
def test_the_scan_passes_code(text):
    assert not [kind for kind, pattern in PATTERNS.items() if pattern.search(text)], text
