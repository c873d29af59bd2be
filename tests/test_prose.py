"""Every sentence in the README and docs that makes a claim about results is checked
against the table on its page here, or generated from it (the miniature's verdicts: a
pasted block). A claim phrase (analysis/prose.KINDS: summaries such as "grows with" or
"+A to +B points", equivalences such as "gains nothing" or "within +3 %", causes such as
"comes from", regimes such as "compute-bound", universals such as "nothing learns")
found anywhere in the documents outside generated blocks must sit inside a registered
sentence whose check tests that kind of claim and passes, or inside one registered as no
result claim with a reason. The checks recompute the sentence's figures from the table
on its page (trend: a slope interval above zero; equivalence: two one-sided tests at the
margin the sentence states; a range: the table's extremes; a universal: every row or
seed; a cause or a regime: the interval, test or measurement it cites, found there).
Planted overstatements, among them the nine a review found, fail."""

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
LOOPS = ("p", "1⊗1 (iso-parameter)", "1⊗4 (looped)", "4⊗1 (iso-depth)")  # exact match per seed
EFFECTS = ("axis", "p", "model", "N⊗R − N⊗1", "N⊗R − NR⊗1")
SEEDS = 3  # the scan's seeds 0, 1, 2


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def holes_rows(docs: dict[str, str]) -> list[dict[str, str]]:
    return prose.table_with(docs[SCAN], *HOLES)


def holes_row(docs, axis: str, value: str) -> dict[str, str]:
    """The row at one point of one axis ("6" of n_loops, "mistral" of tokenizer)."""
    return next(r for r in holes_rows(docs) if r[HOLES[0]] == axis and r["value"].split()[0] == value)


def along(docs, axis: str, column: str):
    rows = [r for r in holes_rows(docs) if r[HOLES[0]] == axis]
    return [float(r["value"].split()[0]) for r in rows], [prose.cell(r[column], SEEDS) for r in rows]


def rounded(interval) -> tuple[float, float, float]:
    """(mean, low, high) to one decimal, as the prose quotes them."""
    return tuple(round(v, 1) for v in (interval.mean, interval.low, interval.high))


def quoted(sentence: str):
    """The first 'mean [low, high]' a sentence quotes, to one decimal."""
    return rounded(prose.cell(sentence, SEEDS))


def quoted_all(sentence: str) -> list[tuple[float, float, float]]:
    """Every 'mean [low, high]' a sentence quotes, in order, to one decimal."""
    return [tuple(round(prose.number(g), 1) for g in m.groups()) for m in prose.CELL.finditer(sentence)]


def same(interval, sentence: str) -> bool:
    return quoted(sentence) == rounded(interval)


# ---- the checks: each returns "" when the sentence holds, else why not ----------------------------------


def proves(*kinds: str) -> Callable[[Callable], Callable]:
    """Mark the kinds of claim (prose.KINDS) a check tests: a phrase of a kind is covered
    only by a sentence whose check tests that kind, so "gains nothing" cannot hide behind
    a check that only reads figures back."""

    def mark(check: Callable) -> Callable:
        check.kinds = frozenset(kinds)  # type: ignore[attr-defined]
        return check

    return mark


def kinds_of(check: Callable | None) -> frozenset[str]:
    return getattr(check, "kinds", frozenset())


@proves("summary")
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
    @proves("summary")
    def check(docs, sentence: str) -> str:
        xs, cells = along(docs, axis, column)
        t = prose.trend(xs, cells)
        if not same(t, sentence):
            return f"the slope of {column} along {axis} is {t.text(1)}, the sentence quotes {quoted(sentence)}"
        if prose.grows(t) != grows:
            return f"the slope {t.text(1)} {'does not exclude' if grows else 'excludes'} zero"
        return ""

    return check


@proves("equivalence")
def not_level(docs, sentence: str) -> str:
    rows = prose.table_with(docs[SCAN], *EFFECTS[:3], "N⊗R − NR⊗1")
    c = prose.cell(next(r for r in rows if r["p"] == "2")["N⊗R − NR⊗1"], SEEDS)
    margin = float(re.search(r"smaller than (\d+) points", sentence).group(1))
    if not same(c, sentence):
        return f"the table says {c}, the sentence quotes {quoted(sentence)}"
    if prose.equivalent(c, margin - 0.5) or c.low > 0 or c.high < 0:
        return "the interval does decide at a smaller margin"
    return ""


def within_margin(axis: str, value: str, *verdicts: tuple[str, bool]) -> Callable:
    """Two one-sided tests at the margin the sentence states ("a margin of 3 points"): the
    intervals it quotes, in order, are the row's `column`s, and each lies inside ±margin
    exactly when the sentence says so (`inside`)."""

    @proves("equivalence")
    def check(docs, sentence: str) -> str:
        stated = re.search(r"margin of (\d+(?:\.\d+)?)", sentence)
        if stated is None:
            return "no margin stated: an equivalence is only as narrow as its margin"
        margin = float(stated.group(1))
        row, quotes = holes_row(docs, axis, value), quoted_all(sentence)
        if len(quotes) != len(verdicts):
            return f"the sentence quotes {len(quotes)} intervals, the check reads {len(verdicts)}"
        for (column, inside), quote in zip(verdicts, quotes):
            c = prose.cell(row[column], SEEDS)
            if rounded(c) != quote:
                return f"{column} at {axis} {value} is {rounded(c)}, the sentence quotes {quote}"
            if prose.equivalent(c, margin) != inside:
                return f"{column} {rounded(c)} {'is not' if inside else 'is'} inside ±{margin:g}"
        return ""

    return check


def not_apart(axis: str, a: str, b: str, column: str) -> Callable:
    """'a's interval, b's, their difference (Welch: independent trainings) not apart from
    zero, and a's excluding zero': the three intervals quoted, in order, recomputed."""

    @proves("summary")
    def check(docs, sentence: str) -> str:
        ca, cb = (prose.cell(holes_row(docs, axis, v)[column], SEEDS) for v in (a, b))
        d = prose.apart(ca, cb)
        want = [rounded(ca), rounded(cb), rounded(d)]
        if quoted_all(sentence) != want:
            return f"the table gives {want}, the sentence quotes {quoted_all(sentence)}"
        if ca.low <= 0:
            return f"{a}'s interval does not exclude zero"
        if d.low > 0 or d.high < 0:
            return f"{a} and {b} are apart"
        return ""

    return check


@proves("universal")
def p4_every_model(docs, sentence: str) -> str:
    """'every model reaches A–B % against C % chance' at p = 4, and no effect there
    established: every seed of every model in the exact-match table, its extremes A and B
    (rounded), the page's chance, and each effect's interval including zero."""
    row = next(r for r in prose.table_with(docs[SCAN], *LOOPS) if r["p"] == "4")
    seeds = [float(v) for column in LOOPS[1:] for v in row[column].split("/")]
    low, high = (int(v) for v in re.search(r"(\d+)–(\d+) %", sentence).groups())
    if (low, high) != (round(min(seeds)), round(max(seeds))):
        return f"the seeds span {min(seeds)}–{max(seeds)} %, the sentence says {low}–{high} %"
    chance = re.search(r"\(chance (\d+) %\)", docs[SCAN]).group(1)
    if f"{chance} % chance" not in sentence:
        return f"chance is {chance} % on the page"
    effects = next(r for r in prose.table_with(docs[SCAN], *EFFECTS) if r["p"] == "4")
    if any(prose.grows(prose.cell(effects[c], SEEDS)) for c in EFFECTS[3:]):
        return "an effect at p = 4 is established"
    return ""


def generated(docs) -> str:
    """The miniature's pasted block."""
    return re.search(r"<!--generated:paper_mini-->(.*?)<!--/generated-->", docs[MINI], re.S).group(1)


def trained(steps: int, *arms: str) -> Callable:
    """'… trained N steps': each named arm (every arm the generated block lists, when none
    is named) trained N weight steps by the block's own listing, and the sentence says N."""

    @proves("universal")
    def check(docs, sentence: str) -> str:
        listed = {a: int(n) for a, n in re.findall(r"^ +(\S+) .*: (\d+) weight-training steps$", generated(docs), re.M)}
        if f"{steps:,}" not in sentence:
            return f"the sentence does not say {steps:,}"
        for arm in arms or tuple(listed):
            if listed.get(arm) != steps:
                return f"{arm} trained {listed.get(arm)} weight steps, not {steps:,}"
        return ""

    return check


def verdict_rows(docs) -> dict[str, dict[str, str]]:
    """The miniature's generated verdict table, by claim id."""
    rows = prose.table_with(generated(docs), "claim", "ours (95 %, uncorrected)", "unmatched arm", "verdict")
    return {re.search(r"\*\*(\S+)\*\*", r["claim"]).group(1): r for r in rows}


def figures(*quotes: tuple[str, str, str]) -> Callable:
    """Each (claim, column, number) quoted must be the generated table's figure, to its
    digits; a leading '|' reads the figure's magnitude ("1.04 % worse" of −1.04)."""

    def check(docs, sentence: str) -> str:
        rows = verdict_rows(docs)
        for claim, column, quoted_number in quotes:
            shown = re.search(r"[+−-]?\d+(?:\.\d+)?", rows[claim][column]).group(0).replace("−", "-")
            want = shown.lstrip("+-") if quoted_number.startswith("|") else shown
            if quoted_number.lstrip("|") != want or quoted_number.lstrip("|") not in sentence:
                return f"{claim}'s {column} is {shown}, the sentence says {quoted_number.lstrip('|')}"
        return ""

    return check


def in_a_table(markdown: str, figure: str) -> bool:
    """The figure, as a whole number (not inside a longer one), in a cell of one of the tables."""
    pattern = re.compile(rf"(?<![\d.]){re.escape(figure)}(?![\d])")
    return any(pattern.search(v) for rows in prose.tables(markdown) for row in rows for v in row.values())


def cites(page: str, *evidence: str) -> Callable:
    """A cause or a regime is only as good as what it rests on: each item must be in the
    sentence and be either a file here (a named test or measuring script) or a figure in
    one of its page's tables (the interval or measurement itself)."""

    @proves("causal", "regime")
    def check(docs, sentence: str) -> str:
        if not evidence:
            return "cites nothing: name the interval, test or measurement it rests on"
        for item in evidence:
            if item not in sentence:
                return f"the sentence does not cite {item!r}"
            if item.endswith(".py") and not (ROOT / item).is_file():
                return f"{item} is not a file here"
            if not item.endswith(".py") and not in_a_table(docs[page], item):
                return f"{item} is in no table on {page}"
        return ""

    return check


@dataclass(frozen=True)
class Sentence:
    document: str
    text: str  # as it stands in the document, whitespace collapsed
    check: Callable | None  # None: the phrase makes no result claim (why: `reason`)
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
        "CHASE's increase, −0.7 [−2.5, +1.2] %, is within ±3 % (two one-sided tests at a margin of 3 points), "
        "and Ouro's, +2.5 [+0.4, +4.6] %, is not: its interval reaches past +3",
        within_margin("n_loops", "6", ("CHASE skip", True), ("Ouro skip", False)),
    ),
    Sentence(
        SCAN,
        "the gap is +2.3 [+0.5, +4.0] points against +5.3 [+1.4, +9.3] on bytes at 400 steps. Smaller on "
        "average, but the two are not apart (the difference, Welch: −3.0 [−6.4, +0.4]), and the gap on "
        "Mistral's tokens still excludes zero",
        not_apart("tokenizer", "mistral", "bytes", "Ouro − CHASE"),
    ),
    Sentence(
        SCAN,
        "against the iso-depth 4⊗1 it is −0.3 [−15.7, +15.1] points, an interval too wide to call the two "
        "either equivalent or apart at any margin smaller than 15 points",
        not_level,
    ),
    Sentence(
        SCAN,
        "at p = 4 every model reaches 51–63 % against 25 % chance, and neither difference is established",
        p4_every_model,
    ),
    Sentence(
        "README.md",
        "at p = 4 every model reaches 51–63 % exact match against 25 % chance, with no gain of looping established",
        p4_every_model,
    ),
    Sentence(
        MINI,
        "so the arms C2 and C3 set against CHASE trained their weights as many steps as it, 1,200",
        trained(1200, "chase", "ouro-matched", "fixed-matched"),
    ),
    Sentence(
        MINI,
        "C3's gap falls from +7.50 points against stock Ouro to +3.75 [+3.26, +4.23] against Ouro "
        "given CHASE's extra steps without holes",
        figures(("C3", "unmatched arm", "+7.50"), ("C3", "ours (95 %, uncorrected)", "+3.75")),
    ),
    Sentence(
        MINI,
        "C2's mean hardly changes (+39.44 % unmatched, +38.56 % matched)",
        figures(("C2", "unmatched arm", "+39.44"), ("C2", "ours (95 %, uncorrected)", "+38.56")),
    ),
    Sentence(
        MINI,
        "CHASE's skip is 1.10 % worse than CHASE's own model forced to the same depth",
        figures(("C2-own", "ours (95 %, uncorrected)", "|1.10")),
    ),
    Sentence(
        MINI,
        "skip's prefill is 1.66× faster at batch 1 (what limits a batch-1 prefill on two cores was not measured here)",
        figures(("C4-batch1", "ours (95 %, uncorrected)", "1.66")),
    ),
    Sentence(
        MINI,
        "C3-few, inconclusive under v4 (+3.75 %, its interval reaching above the 5 % bound), is reproduced at "
        "+4.08 % [+3.58, +4.58]",
        figures(("C3-few", "ours (95 %, uncorrected)", "+4.08")),
    ),
    Sentence(
        MINI,
        "C1-mano, inconclusive under v4, at +6.02 points [+2.88, +9.16]",
        figures(("C1-mano", "ours (95 %, uncorrected)", "+6.02")),
    ),
    # phrases that make no claim about a result: design, provenance, tolerances
    Sentence(
        MINI,
        "C4-batch1 and C4-growth test a latency-bound batch-1 prefill at L 2048, a regime two cores do not have",
        None,
        "the paper's reading of its own setting (Table 5), which the claims quote; not a regime measured here",
    ),
    Sentence("docs/generation.md", "neither grows with the context", None, "a cache's size, not a table's figure"),
    Sentence("docs/library.md", "trains each level with its", None, "a task level, not a comparison"),
    Sentence(
        "docs/architecture.md",
        "The vocabulary sits low because every room",
        None,
        "the import graph's design, not a result",
    ),
    Sentence(
        "docs/architecture.md",
        "every `β=0.25` label in the report, the series and the points comes from `format_value`",
        None,
        "where a label is formatted in the code, not a cause of a result",
    ),
    Sentence("docs/generation.md", "Opt-in because of that build", None, "why a setting is opt-in, not a result"),
    Sentence(
        "docs/sweeps.md",
        "because it ends the trials' processes before they save",
        None,
        "why a handler is off: Ray Tune's behaviour, not a result",
    ),
    Sentence(
        "docs/benchmarks.md",
        "Its steps exceed the mean of 2 because every row decodes exactly 32 tokens: the batch ends with its "
        "busiest row",
        None,
        "the schedule's arithmetic (a batch steps until its busiest row is done), not an inference from a table",
    ),
    Sentence(
        "docs/cluster.md",
        "with the same figures as a local run",
        None,
        "a rerun with fixed seeds and data reproducing its figures exactly: an identity observed, no estimate",
    ),
    Sentence(
        "docs/gpu.md",
        "the memory model within 1 % of a `local` step's measured peak",
        None,
        "one measured ratio as `looplab doctor` reports it, not an estimate over seeds",
    ),
    Sentence(
        "docs/paper-scale.md",
        "the whole step against the measured peak on this CPU (within 25%)",
        None,
        "the tolerance a test asserts, not a result",
    ),
)


def audit(docs: dict[str, str], sentences: tuple[Sentence, ...] = SENTENCES) -> list[str]:
    """Why the documents' claims about results do not hold (empty when all hold)."""
    found = []
    for s in sentences:
        text = flat(docs[s.document])
        if s.text not in text:
            found.append(f"{s.document}: registered sentence no longer there: {s.text!r}")
        elif s.check is not None:
            why = s.check(docs, s.text)
            if why:
                found.append(f"{s.document}: {s.text!r}: {why}")
    for name, raw in docs.items():
        text = flat(re.sub(r"<!--generated:.*?<!--/generated-->", "", raw, flags=re.S))
        spans = [
            (text.find(s.text), text.find(s.text) + len(s.text), s)
            for s in sentences
            if s.document == name and s.text in text
        ]
        for kind, m in prose.claims(text):
            around = f"…{text[max(0, m.start() - 80) : m.end() + 40]}…"
            owners = [s for a, b, s in spans if a <= m.start() and m.end() <= b]
            if not owners:
                found.append(f"{name}: an unchecked {kind} statement ({prose.KIND[kind].needs}): {around}")
            elif not any(s.check is None or kind in kinds_of(s.check) for s in owners):
                found.append(f"{name}: a {kind} statement its check does not test ({prose.KIND[kind].needs}): {around}")
    return found


@pytest.fixture(scope="module")
def docs() -> dict[str, str]:
    return {name: (ROOT / name).read_text() for name in DOCUMENTS}


def plant(docs: dict[str, str], document: str, old: str | None, planted: str) -> dict[str, str]:
    """The documents with `planted` in place of `old` (which may wrap), or appended."""
    if old is None:
        return {**docs, document: docs[document] + f"\n\n{planted}\n"}
    pattern = r"\s+".join(map(re.escape, old.split()))
    assert re.search(pattern, docs[document]), old
    return {**docs, document: re.sub(pattern, lambda _: planted, docs[document], count=1)}


def test_every_claim_holds_against_its_table(docs):
    assert audit(docs) == []


def test_every_registration_without_a_check_says_why():
    assert [s.text for s in SENTENCES if s.check is None and not s.reason] == []


@pytest.mark.parametrize(
    "document, now, before, kind",
    [
        (
            MINI,
            "so the arms C2 and C3 set against CHASE trained their weights as many steps as it, 1,200",
            "so every arm a verdict compares trained its weights 1,200 steps",  # C1-LM's arms: 800
            "universal",
        ),
        (
            MINI,
            None,  # v4's two-machine comparison left the page with v4: the review's sentence is appended
            "the LM sweep's figures agree to the last digit shown but one",  # Holm's intervals differ
            "equivalence",
        ),
        (
            MINI,
            "whether 400 more steps help the fixed-loop model at forced depths is not tested here",
            "the fixed-loop model gains nothing at forced depths from 400 more steps",  # no margin, no test
            "equivalence",
        ),
        (
            MINI,
            "C2's gain over the fixed-loop model is not a gain of choosing the depth per token",
            "C2's gain over the fixed-loop model comes from the gated training making shallow loops useful, "
            "not from choosing the depth per token",  # a cause nothing tested
            "causal",
        ),
        (
            MINI,
            "what limits a batch-1 prefill on two cores was not measured here",
            "two cores stay compute-bound",  # measured nowhere
            "regime",
        ),
        (MINI, "are too small to judge here", "do not separate from chance here", "equivalence"),  # no interval
        (
            SCAN,
            "CHASE's increase, −0.7 [−2.5, +1.2] %, is within ±3 % (two one-sided tests at a margin of 3 "
            "points), and Ouro's, +2.5 [+0.4, +4.6] %, is not: its interval reaches past +3",
            "both arms are within +3 %",  # Ouro's interval reaches +4.6
            "equivalence",
        ),
        (
            SCAN,
            "and the gap on Mistral's tokens still excludes zero",
            "and both arms lose about as much",  # the gap's interval excludes zero
            "equivalence",
        ),
        (
            "README.md",
            "every model reaches 51–63 % exact match against 25 % chance, with no gain of looping established",
            "nothing learns",  # 50.6–63.2 % against 25 % chance
            "universal",
        ),
    ],
)
def test_a_sentence_the_review_found_fails_when_planted_back(docs, document, now, before, kind):
    ((found_kind, phrase),) = [(k, m.group(0)) for k, m in prose.claims(before)]
    assert found_kind == kind
    found = audit(plant(docs, document, now, before))
    assert any(f"{kind} statement" in p and phrase in p for p in found), found
    appended = audit(plant(docs, document, None, before[0].upper() + before[1:] + "."))  # in any context
    assert any(f"unchecked {kind} statement" in p for p in appended), appended


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
    assert audit(plant(docs, "README.md", old, planted))


def test_a_planted_level_with_fails(docs):
    """'1⊗4 is level with 4⊗1 (−0.3)' over an interval of [−15.7, +15.1]: unchecked, and no
    equivalence test at a sensible margin would pass it."""
    found = audit(plant(docs, SCAN, None, "1⊗4 is level with the iso-depth 4⊗1 (−0.3)."))
    assert any("unchecked equivalence statement" in p for p in found)
    assert not prose.equivalent(prose.cell("−0.3 [−15.7, +15.1]", SEEDS), 5.0)


def test_an_equivalence_holds_at_a_margin_its_interval_passes_and_no_narrower(docs):
    """CHASE at R = 6, −0.7 [−2.5, +1.2]: inside ±3, not inside ±2; a stated margin is required."""
    check = within_margin("n_loops", "6", ("CHASE skip", True))
    assert check(docs, "CHASE's −0.7 [−2.5, +1.2] % is within ±3 % (a margin of 3 points)") == ""
    assert "is not inside ±2" in check(docs, "CHASE's −0.7 [−2.5, +1.2] % is within ±2 % (a margin of 2 points)")
    assert "no margin stated" in check(docs, "CHASE's −0.7 [−2.5, +1.2] % is within ±3 %")
    assert "the sentence quotes" in check(docs, "CHASE's −0.5 [−2.5, +1.2] % (a margin of 3 points)")
    ouro = within_margin("n_loops", "6", ("Ouro skip", True))  # the review's "both within +3 %"
    assert "is not inside ±3" in ouro(docs, "Ouro's +2.5 [+0.4, +4.6] % is within ±3 % (a margin of 3 points)")


def test_an_equivalence_registered_with_a_check_that_does_not_test_it_fails(docs):
    """A figure check reads +39.44 and +38.56 back; it does not test 'does not move'."""
    claim = "C2 does not move (+39.44 % unmatched, +38.56 % matched)"
    planted = plant(docs, MINI, "C2's mean hardly changes (+39.44 % unmatched, +38.56 % matched)", claim)
    registered = SENTENCES + (Sentence(MINI, claim, figures(("C2", "unmatched arm", "+39.44"))),)
    assert any("equivalence statement its check does not test" in p for p in audit(planted, registered))


def test_a_cause_holds_only_by_what_it_cites(docs):
    cause = "C2's gain is not a gain of choosing the depth per token, because CHASE's skip is 1.10 % worse"
    assert "cites nothing" in cites(MINI)(docs, cause)
    assert cites(MINI, "1.10")(docs, cause) == ""  # C2-own's figure in the verdict table
    assert "in no table" in cites(MINI, "1.42")(docs, cause.replace("1.10", "1.42"))
    assert "does not cite" in cites(MINI, "1.10")(docs, "C2's gain comes from the gated training")
    assert cites(MINI, "tests/test_determinism.py")(docs, "equal because tests/test_determinism.py says so") == ""
    assert "not a file" in cites(MINI, "tests/test_nowhere.py")(docs, "because tests/test_nowhere.py")
    # in the documents: unregistered it fails, registered with its citation it holds
    planted = plant(docs, MINI, None, cause + ".")
    assert any("unchecked causal statement" in p for p in audit(planted))
    assert audit(planted, SENTENCES + (Sentence(MINI, cause, cites(MINI, "1.10")),)) == []
    assert audit(planted, SENTENCES + (Sentence(MINI, cause, cites(MINI)),))


def test_a_regime_needs_a_measurement(docs):
    claim = "At batch 1 two cores stay compute-bound."
    assert any("unchecked regime statement" in p for p in audit(plant(docs, MINI, None, claim)))
    assert "cites nothing" in cites(MINI)(docs, claim)


def test_a_universal_is_checked_over_every_row(docs):
    """The review's 'every arm … trained 1,200 steps': the fixed-loop arm trained 800; and
    a range that leaves out a seed at p = 4."""
    every_arm = "every arm a verdict compares trained its weights 1,200 steps"
    assert "ouro trained 1000 weight steps" in trained(1200)(docs, every_arm)
    assert "fixed trained 800 weight steps" in trained(1200, "fixed")(docs, every_arm)
    assert trained(1200, "chase", "ouro-matched", "fixed-matched")(docs, "as many steps as it, 1,200") == ""
    assert "the seeds span" in p4_every_model(docs, "every model reaches 55–63 % against 25 % chance")
    assert "chance is 25 %" in p4_every_model(docs, "every model reaches 51–63 % against 20 % chance")


def test_the_vocabulary_flags_claims_and_leaves_other_prose_alone():
    kinds = [k for k, _ in prose.claims("it gains nothing; C2 does not move; the same figures as a run")]
    assert kinds == ["equivalence"] * 3
    assert [k for k, _ in prose.claims("Because of it, the gain comes from X; memory-bound")] == [
        "causal",
        "causal",
        "regime",
    ]
    assert [m.group(0) for _, m in prose.claims("both within +3 %; every arm a verdict compares trained")] == [
        "within +3 %",
        "every arm a verdict compares trained",
    ]
    unrelated = "the residue to keep; the same config as before; within a function; every arm, a measure."
    assert prose.claims(unrelated) == []
    assert len(set(prose.PHRASES)) == len(prose.PHRASES) == sum(len(k.phrases) for k in prose.KINDS)


def test_a_trend_claimed_on_a_flat_axis_fails(docs):
    """The statistics themselves: the context axis does not grow, so a registered 'grows'
    over it fails, and a changed table breaks the quoted figures."""
    check = slope("seq_len", "Ouro skip", grows=True)
    assert "does not exclude zero" in check(docs, "+1.2 per doubling [−0.6, +3.0]")
    changed = {**docs, SCAN: docs[SCAN].replace("+16.3 [+13.1, +19.5]", "+26.3 [+23.1, +29.5]")}
    assert "the sentence quotes" in slope("seq_len", "Ouro skip", grows=False)(
        changed, "+1.2 per doubling [−0.6, +3.0]"
    )


def test_a_difference_quoted_as_not_apart_is_recomputed(docs):
    check = not_apart("tokenizer", "mistral", "bytes", "Ouro − CHASE")
    text = "+2.3 [+0.5, +4.0] against +5.3 [+1.4, +9.3]: the difference −3.0 [−6.4, +0.4]"
    assert check(docs, text) == ""
    assert "the sentence quotes" in check(docs, text.replace("[−6.4, +0.4]", "[−6.4, −0.4]"))
    # with a narrower bytes interval the two are apart: the same words would then be false
    row = "| tokenizer | bytes (400 steps) | 2 | +10.7 [+6.9, +14.5] | +5.4 [+3.5, +7.2] |"
    narrower = {**docs, SCAN: docs[SCAN].replace(f"{row} +5.3 [+1.4, +9.3] |", f"{row} +5.3 [+4.3, +6.3] |")}
    assert narrower[SCAN] != docs[SCAN]
    d = prose.apart(prose.cell("+2.3 [+0.5, +4.0]", SEEDS), prose.cell("+5.3 [+4.3, +6.3]", SEEDS))
    now = f"+2.3 [+0.5, +4.0] against +5.3 [+4.3, +6.3]: the difference {d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}]"
    assert check(narrower, now) == "mistral and bytes are apart"


def test_a_figure_quoted_from_the_verdicts_must_be_the_tables(docs):
    changed = plant(docs, MINI, "C2's mean hardly changes (+39.44 %", "C2's mean hardly changes (+36.29 %")
    assert any("C2's mean hardly changes" in p for p in audit(changed))  # the registered sentence is gone: caught
    wrong = figures(("C2", "unmatched arm", "+36.29"))  # and a wrong figure, registered, fails its check
    assert "C2's unmatched arm is +39.44" in wrong(docs, "C2's mean hardly changes (+36.29 % unmatched")


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
