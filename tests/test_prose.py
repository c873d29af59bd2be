"""Every sentence in the README and docs that summarises a table is checked against the
table here, or generated from it (the miniature's verdicts: a pasted block). A summary
phrase (analysis/prose.PHRASES: "grows with", "level with", "every paired interval",
"excludes zero", "+A to +B points") found anywhere in the documents must sit inside a
registered sentence whose check passes; the checks recompute the sentence's figures from
the table in the same document (trend: a slope interval above zero; level: two one-sided
tests at a stated margin; a range: the table's extremes). Planted overstatements fail."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from analysis import prose

ROOT = Path(__file__).resolve().parents[1]
SCAN = "docs/scale_scan.md"
MINI = "docs/paper-mini.md"  # the miniature's generated verdicts and what the docs say of them
DOCUMENTS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
HOLES = ("axis (others at the centre)", "value", "Ouro skip", "CHASE skip", "Ouro − CHASE")
SEEDS = 3  # the scan's seeds 0, 1, 2


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def holes_rows(docs: dict[str, str]) -> list[dict[str, str]]:
    return prose.table_with(docs[SCAN], *HOLES)


def along(docs, axis: str, column: str):
    rows = [r for r in holes_rows(docs) if r[HOLES[0]] == axis]
    return [float(r["value"].split()[0]) for r in rows], [prose.cell(r[column], SEEDS) for r in rows]


def quoted(sentence: str):
    """The first 'mean [low, high]' a sentence quotes, to one decimal."""
    c = prose.cell(sentence, SEEDS)
    return round(c.mean, 1), round(c.low, 1), round(c.high, 1)


def same(interval, sentence: str) -> bool:
    return quoted(sentence) == tuple(round(v, 1) for v in (interval.mean, interval.low, interval.high))


# ---- the checks: each returns "" when the sentence holds, else why not ----------------------------------


def gap_range(docs, sentence: str) -> str:
    rows = holes_rows(docs)
    gaps = [prose.cell(r["Ouro − CHASE"], SEEDS) for r in rows]
    on_bytes = [prose.cell(r["Ouro − CHASE"], SEEDS) for r in rows if "mistral" not in r["value"]]
    ranges = re.findall(r"([+−-]\d+(?:\.\d+)?) to ([+−-]\d+(?:\.\d+)?)", sentence)
    want = [(min(c.mean for c in gaps), max(c.mean for c in gaps))]
    if "on bytes" in sentence:
        want.append((min(c.mean for c in on_bytes), max(c.mean for c in on_bytes)))
    got = [(prose.number(a), prose.number(b)) for a, b in ranges]
    if got != want:
        return f"the table's range is {want}, the sentence says {got}"
    if not all(c.low > 0 for c in gaps):
        return "not every paired interval excludes zero"
    return ""


def slope(axis: str, column: str, *, grows: bool) -> Callable:
    def check(docs, sentence: str) -> str:
        xs, cells = along(docs, axis, column)
        t = prose.trend(xs, cells)
        if not same(t, sentence):
            return f"the slope of {column} along {axis} is {t.text(1)}, the sentence quotes {quoted(sentence)}"
        if prose.grows(t) != grows:
            return f"the slope {t.text(1)} {'does not exclude' if grows else 'excludes'} zero"
        return ""

    return check


def not_level(docs, sentence: str) -> str:
    rows = prose.table_with(docs[SCAN], "axis", "p", "model", "N⊗R − NR⊗1")
    c = prose.cell(next(r for r in rows if r["p"] == "2")["N⊗R − NR⊗1"], SEEDS)
    margin = float(re.search(r"smaller than (\d+) points", sentence).group(1))
    if not same(c, sentence):
        return f"the table says {c}, the sentence quotes {quoted(sentence)}"
    if prose.equivalent(c, margin - 0.5) or c.low > 0 or c.high < 0:
        return "the interval does decide at a smaller margin"
    return ""


def verdict_rows(docs) -> dict[str, dict[str, str]]:
    """The miniature's generated verdict table, by claim id."""
    block = re.search(r"<!--generated:paper_mini-->(.*?)<!--/generated-->", docs[MINI], re.S).group(1)
    rows = prose.table_with(block, "claim", "ours (95 %, uncorrected)", "unmatched arm", "verdict")
    return {re.search(r"\*\*(\S+)\*\*", r["claim"]).group(1): r for r in rows}


def figures(*quotes: tuple[str, str, str]) -> Callable:
    """Each (claim, column, number) quoted must be the generated table's figure, to its
    digits; a leading '-' reads the figure's magnitude ("1.04 % worse" of −1.04)."""

    def check(docs, sentence: str) -> str:
        rows = verdict_rows(docs)
        for claim, column, quoted_number in quotes:
            shown = re.search(r"[+−-]?\d+(?:\.\d+)?", rows[claim][column]).group(0).replace("−", "-")
            want = shown.lstrip("+-") if quoted_number.startswith("|") else shown
            if quoted_number.lstrip("|") != want or quoted_number.lstrip("|") not in sentence:
                return f"{claim}'s {column} is {shown}, the sentence says {quoted_number.lstrip('|')}"
        return ""

    return check


@dataclass(frozen=True)
class Sentence:
    document: str
    text: str  # as it stands in the document, whitespace collapsed
    check: Callable | None  # None: the phrase is not a table summary (why: `reason`)
    reason: str = ""


SENTENCES = (
    Sentence(
        SCAN,
        "by +2.3 to +10.7 points of perplexity increase (+3.2 to +10.7 on bytes), and the 95 % interval "
        "of the paired gap excludes zero in all 16 rows",
        gap_range,
    ),
    Sentence(
        "README.md",
        "by +2.3 to +10.7 points of perplexity increase, every paired interval above zero, uncorrected",
        gap_range,
    ),
    Sentence(
        SCAN,
        "Ouro's failure grows with training**: +4.3 points per doubling of the pre-training steps [+2.9, +5.7]",
        slope("pretrain_steps", "Ouro skip", grows=True),
    ),
    Sentence(
        SCAN,
        "CHASE's own increase grows with training too (+2.5 per doubling [+0.9, +4.0])",
        slope("pretrain_steps", "CHASE skip", grows=True),
    ),
    Sentence(
        SCAN, "and the gap by +1.8 per doubling [+0.8, +2.8]", slope("pretrain_steps", "Ouro − CHASE", grows=True)
    ),
    Sentence(
        SCAN,
        "Along the context no trend in Ouro's failure is established: +1.2 per doubling [−0.6, +3.0]",
        slope("seq_len", "Ouro skip", grows=False),
    ),
    Sentence(
        SCAN,
        "CHASE's own increase rises with context (+1.1 per doubling [+0.1, +2.1])",
        slope("seq_len", "CHASE skip", grows=True),
    ),
    Sentence(
        "README.md",
        "Ouro's failure grows with training (+4.3 points per doubling of the steps [+2.9, +5.7])",
        slope("pretrain_steps", "Ouro skip", grows=True),
    ),
    Sentence(
        "README.md",
        "along the context no trend is established (+1.2 per doubling [−0.6, +3.0])",
        slope("seq_len", "Ouro skip", grows=False),
    ),
    Sentence(
        SCAN,
        "against the iso-depth 4⊗1 it is −0.3 [−15.7, +15.1] points, an interval too wide to call the two "
        "either equivalent or apart at any margin smaller than 15 points",
        not_level,
    ),
    Sentence(
        MINI,
        "C3's gap falls from +6.63 points against stock Ouro to +3.08 [+1.49, +4.67] against Ouro "
        "given CHASE's extra steps without holes",
        figures(("C3", "unmatched arm", "+6.63"), ("C3", "ours (95 %, uncorrected)", "+3.08")),
    ),
    Sentence(
        MINI,
        "C2 does not move (+34.29 % unmatched, +34.36 % matched)",
        figures(("C2", "unmatched arm", "+34.29"), ("C2", "ours (95 %, uncorrected)", "+34.36")),
    ),
    Sentence(
        MINI,
        "CHASE's skip is 1.31 % worse than CHASE's own model forced to the same depth",
        figures(("C2-own", "ours (95 %, uncorrected)", "|1.31")),
    ),
    Sentence(
        MINI,
        "(skip is 1.75× faster at batch 1: two cores stay compute-bound)",
        figures(("C4-batch1", "ours (95 %, uncorrected)", "1.75")),
    ),
    Sentence(
        MINI,
        "C3-few is inconclusive under v4 (+3.75 %, its interval reaching above the 5 % bound)",
        figures(("C3-few", "ours (95 %, uncorrected)", "+3.75")),
    ),
    Sentence(
        MINI,
        "On the judged seeds 1⊗2 is ahead by +12.84 points [−0.47, +26.15], p 0.111 after the correction",
        figures(("C1-mano", "ours (95 %, uncorrected)", "+12.84")),
    ),
    Sentence("docs/generation.md", "neither grows with the context", None, "a cache's size, not a table's figure"),
    Sentence("docs/library.md", "trains each level with its", None, "a task level, not a comparison"),
)


def audit(docs: dict[str, str]) -> list[str]:
    """Why the documents' summary sentences do not hold (empty when all hold)."""
    found = []
    for s in SENTENCES:
        text = flat(docs[s.document])
        if s.text not in text:
            found.append(f"{s.document}: registered sentence no longer there: {s.text!r}")
        elif s.check is not None:
            why = s.check(docs, s.text)
            if why:
                found.append(f"{s.document}: {s.text!r}: {why}")
    for name, raw in docs.items():
        text = flat(re.sub(r"<!--generated:.*?<!--/generated-->", "", raw, flags=re.S))
        covered = [
            (text.find(s.text), text.find(s.text) + len(s.text))
            for s in SENTENCES
            if s.document == name and s.text in text
        ]
        for m in prose.SUMMARY.finditer(text):
            if not any(a <= m.start() and m.end() <= b for a, b in covered):
                found.append(f"{name}: an unchecked summary: …{text[max(0, m.start() - 80) : m.end() + 40]}…")
    return found


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return {name: (ROOT / name).read_text() for name in DOCUMENTS}


def test_every_summary_sentence_holds_against_its_table(docs):
    assert audit(docs) == []


@pytest.mark.parametrize(
    "old, planted",
    [
        # the range that left out the Mistral row
        (
            "by +2.3 to +10.7 points of perplexity increase, every",
            "by +3.2 to +10.7 points of perplexity increase, every",
        ),
        # "grows with context" over 13.0, 15.0, 17.1, 16.3 with overlapping intervals
        ("Ouro's failure grows with training (+4.3", "Ouro's failure grows with training and context (+4.3"),
    ],
)
def test_a_planted_overstatement_in_the_readme_fails(docs, old, planted):
    pattern = r"\s+".join(map(re.escape, old.split()))  # the sentence may wrap
    assert re.search(pattern, docs["README.md"])
    planted_docs = {**docs, "README.md": re.sub(pattern, planted, docs["README.md"], count=1)}
    assert audit(planted_docs)


def test_a_planted_level_with_fails(docs):
    """'1⊗4 is level with 4⊗1 (−0.3)' over an interval of [−15.7, +15.1]: unchecked, and no
    equivalence test at a sensible margin would pass it."""
    planted = docs[SCAN] + "\n\n1⊗4 is level with the iso-depth 4⊗1 (−0.3).\n"
    assert any("unchecked summary" in p for p in audit({**docs, SCAN: planted}))
    assert not prose.equivalent(prose.cell("−0.3 [−15.7, +15.1]", SEEDS), 5.0)


def test_a_trend_claimed_on_a_flat_axis_fails(docs):
    """The statistics themselves: the context axis does not grow, so a registered 'grows'
    over it fails, and a changed table breaks the quoted figures."""
    check = slope("seq_len", "Ouro skip", grows=True)
    assert "does not exclude zero" in check(docs, "+1.2 per doubling [−0.6, +3.0]")
    changed = {**docs, SCAN: docs[SCAN].replace("+16.3 [+13.1, +19.5]", "+26.3 [+23.1, +29.5]")}
    assert "the sentence quotes" in slope("seq_len", "Ouro skip", grows=False)(
        changed, "+1.2 per doubling [−0.6, +3.0]"
    )


def test_a_figure_quoted_from_the_verdicts_must_be_the_tables(docs):
    pattern = r"\s+".join(map(re.escape, "C2 does not move (+34.29 %".split()))
    assert re.search(pattern, docs[MINI])
    changed = {**docs, MINI: re.sub(pattern, "C2 does not move (+36.29 %", docs[MINI], count=1)}
    assert any("C2 does not move" in p for p in audit(changed))  # the registered sentence is gone: caught
    wrong = figures(("C2", "unmatched arm", "+36.29"))  # and a wrong figure, registered, fails its check
    assert "C2's unmatched arm is +34.29" in wrong(docs, "C2 does not move (+36.29 % unmatched")


def test_trend_and_equivalence_by_hand():
    # three points on a line, slope 2 per doubling, each mean ± 1 with n 3: se = 1/t(0.975, 2)
    cells = [prose.Cell(m, m - 1, m + 1, 3) for m in (0.0, 2.0, 4.0)]
    t = prose.trend([1, 2, 4], cells)
    se = 1 / 4.302652730  # each cell's standard error
    # weights (x − x̄)/Σ(x − x̄)² = −1/2, 0, +1/2 over log2 x = 0, 1, 2: Var = 2 · se²/4
    assert t.mean == pytest.approx(2.0) and t.se == pytest.approx(se * (0.5**0.5))
    assert t.df == pytest.approx(4.0)  # Welch–Satterthwaite: two equal parts of df 2 each
    assert prose.grows(t)
    assert prose.equivalent(prose.Cell(0.1, -1.0, 1.2, 3), 1.5) and not prose.equivalent(
        prose.Cell(0.1, -1.0, 1.2, 3), 1.0
    )
    d = prose.apart(prose.cell("+10.5 [+6.6, +14.4]", 3), prose.cell("+9.3 [+5.3, +13.2]", 3))
    assert d.mean == pytest.approx(1.2) and d.low < 0 < d.high


# ---- the report's "What this sweep found", on hand-made tables ------------------------------------------


def arm(name, mean, half=None, n=1):
    return prose.Arm(name, mean, mean - half if half else None, mean + half if half else None, n)


def test_findings_with_one_seed_name_best_worst_and_conclude_nothing():
    arms = [arm("β=0.1", 262.7), arm("β=0.5", 272.2), arm("β=0.9", 265.0)]
    base = arm("the pre-trained model (pretrain)", 252.67)
    acc = [arm("β=0.1", 0.3120), arm("β=0.5", 0.3135), arm("β=0.9", 0.3128)]  # spread 0.48 % of the mean
    out = prose.findings(
        arms, measure="perplexity", axis="β", higher_is_better=False, baseline=base, others=(("accuracy", acc),)
    )
    assert out[0] == "Best β on perplexity: β=0.1 (262.7); worst: β=0.5 (272.2)."
    assert "n=1" in out[1] and "nothing can be concluded" in out[1] and "9.5" in out[1]
    assert out[2].startswith("The pre-trained model (pretrain) (perplexity 252.67) beats every β value's")
    assert "(262.7–272.2)" in out[2]
    assert out[3].startswith("Accuracy is flat across β: 0.312–0.3135")


def test_findings_spread_against_the_seed_interval_by_hand():
    # Welch with equal se: se_d = √2·se; half-width t(0.975, df) · se_d; df = 2(n−1) = 4 for n = 3
    t2, t4 = 4.302652729911275, 2.7764451051977987
    se = 1.0
    far = [arm("a", 10.0, t2 * se, 3), arm("b", 20.0, t2 * se, 3)]
    text = prose.spread(far, "ppl", "β", higher_is_better=False)
    half = t4 * math.sqrt(2) * se
    assert f"{-10 - half:+.4g}" in text and "larger than the seed noise" in text
    near = [arm("a", 10.0, t2 * se, 3), arm("b", 11.0, t2 * se, 3)]
    assert "within the seed noise" in prose.spread(near, "ppl", "β", higher_is_better=False)
    assert prose.spread(far[:1], "ppl", "β", higher_is_better=False) == ""


def test_findings_baseline_branches_and_direction():
    arms = [arm("β=0.1", 0.40), arm("β=0.5", 0.30)]
    up = dict(measure="accuracy", axis="β", higher_is_better=True)
    assert "beats every" in prose.against_baseline(arm("base", 0.45), arms, **up)
    assert prose.against_baseline(arm("base", 0.20), arms, **up).startswith("Every β value's result (0.3–0.4) improves")
    mixed = prose.against_baseline(arm("base", 0.35), arms, **up)
    assert "beats 1 and is beaten by 1 of 2" in mixed
    # lower is better: the same numbers read the other way
    assert "beats every" in prose.against_baseline(
        arm("base", 0.20), arms, measure="ppl", axis="β", higher_is_better=False
    )
    assert prose.best_and_worst(arms, "accuracy", "β", True) == "Best β on accuracy: β=0.1 (0.4); worst: β=0.5 (0.3)."
    assert "same accuracy" in prose.best_and_worst([arm("a", 0.4), arm("b", 0.4)], "accuracy", "β", True)
    assert "nothing to compare" in prose.best_and_worst(arms[:1], "accuracy", "β", True)


def test_flatness_threshold():
    assert "is flat" in prose.flatness([arm("a", 100.0), arm("b", 101.0)], "accuracy", "β")  # 0.995 %
    varies = prose.flatness([arm("a", 100.0), arm("b", 103.0)], "accuracy", "β")
    assert varies == "Accuracy varies across β: from 100 (a) to 103 (b)."


def test_a_difference_is_written_to_its_values_decimals():
    assert prose.value_text(272.1598) == "272.16" and prose.difference_text(272.1598 - 262.6675, 272.1598) == "9.49"
    assert prose.difference_text(0.00049, 0.22681) == "0.00049"
    assert prose.difference_text(1234.5, 12345.6) == "1234"  # value_text writes 12346
