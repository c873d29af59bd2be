"""The README's quoted figures and sample outputs, kept true by measurement.

Every timing the README (and the docs it hands detail to, the registry's "documents")
quotes is written `<!--fig:NAME-->3 min 8 s<!--/fig-->` (the comment is invisible on the
rendered page) and registered in docs/readme_figures.json with the command that produced
it, how it was measured and when. Every sample output is a block between
`<!--sample:NAME-->` and `<!--/sample-->` whose lines are the command's output, filtered
to the lines the README shows. tests/test_readme.py checks the two
agree and regenerates the fast samples; .ci/run checks the main job's table against the
run it just made. This script re-measures and rewrites:

    python scripts/readme_figures.py measure main_job debug_sweep   # run, time, rewrite README + registry
    python scripts/readme_figures.py sample dry_run_140m            # run, rewrite the README block
    python scripts/readme_figures.py check-sample beta_debug OUTPUT # compare a block with a saved output
    python scripts/readme_figures.py check                          # figures and registry agree
    python scripts/readme_figures.py paste paper_mini FILE          # a run's generated section into its block

A generated section (`<!--generated:NAME-->` … `<!--/generated-->`) is text a command
wrote from its own results (sweeps/paper_mini.py's readme_block.md): pasted, never edited.

Measure on a quiet machine: on these 2 cores one other busy process doubles a step.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from looplab.arguments import Parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
REGISTRY = ROOT / "docs" / "readme_figures.json"
FIGURE = re.compile(r"<!--fig:([a-z0-9_]+)-->(.*?)<!--/fig-->")
SAMPLE = re.compile(r"<!--sample:([a-z0-9_]+)-->\n```text\n(.*?)```\n<!--/sample-->", re.S)
GENERATED = re.compile(r"(<!--generated:([a-z0-9_]+)-->\n)(.*?)(<!--/generated-->)", re.S)
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?")


def load_registry() -> dict:
    return json.loads(REGISTRY.read_text())


def load_documents(registry: dict | None = None) -> dict[str, str]:
    """Each document the registry covers (README.md first), by its path from the root."""
    names = (registry or load_registry())["documents"]
    return {name: (ROOT / name).read_text() for name in names}


def duration(seconds: float) -> str:
    """How the README writes a wall time: 49 s, 3 min 8 s, 1 h 2 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {round((s % 3600) / 60)} min"


def quoted_figures(text: str) -> list[tuple[str, str]]:
    """(name, value) of every marked figure, in README order."""
    return FIGURE.findall(text)


def sample_blocks(text: str) -> dict[str, str]:
    return dict(SAMPLE.findall(text))


def problems(text: str, registry: dict) -> list[str]:
    """Where the documents (their texts joined) and the registry disagree (empty when
    they agree)."""
    found, figures = [], registry["figures"]
    quoted = quoted_figures(text)
    for name, value in quoted:
        if name not in figures:
            found.append(f"README quotes figure {name!r}, which docs/readme_figures.json does not register")
        elif figures[name]["value"] != value:
            found.append(f"README quotes {name} as {value!r}; the registry's measurement is {figures[name]['value']!r}")
    for name in figures:
        if name not in {n for n, _ in quoted}:
            found.append(f"registered figure {name!r} is quoted nowhere in the README")
    for fence in re.findall(r"```.*?```", text, flags=re.S):  # a comment in a code block shows as text
        for name, _ in quoted_figures(fence):
            found.append(f"figure {name!r} is marked inside a code block, where the marker would show")
    blocks = sample_blocks(text)
    for name in registry["samples"]:
        if name not in blocks:
            found.append(f"registered sample {name!r} has no <!--sample:{name}--> block in the README")
    for name in blocks:
        if name not in registry["samples"]:
            found.append(f"README block <!--sample:{name}--> is not registered")
    return found


def kept_lines(output: str, keep: str) -> list[str]:
    """The lines of a command's output the README shows: those matching `keep`, right-stripped."""
    pattern = re.compile(keep)
    return [line.rstrip() for line in output.splitlines() if pattern.search(line)]


def same_with_tolerance(shown: list[str], produced: list[str], rel: float) -> list[str]:
    """Line-by-line differences, numbers compared to a relative tolerance (another CPU
    may round the last digit of a perplexity differently), everything else exactly."""
    diffs = []
    if len(shown) != len(produced):
        return [f"{len(shown)} line(s) in the README, {len(produced)} produced"]
    for a, b in zip(shown, produced):
        if NUMBER.sub("#", a).split() != NUMBER.sub("#", b).split():
            diffs.append(f"README: {a!r}\n   run: {b!r}")
            continue
        for x, y in zip(NUMBER.findall(a), NUMBER.findall(b)):
            fx, fy = float(x.replace(",", "")), float(y.replace(",", ""))
            if not math.isclose(fx, fy, rel_tol=rel, abs_tol=0.0):
                diffs.append(f"README: {a!r}\n   run: {b!r}  ({x} vs {y})")
                break
    return diffs


def run(command: str, cwd: Path = ROOT) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{command!r} failed with status {done.returncode}:\n{done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def rewrite_figure(text: str, name: str, value: str) -> str:
    return re.sub(rf"<!--fig:{name}-->.*?<!--/fig-->", f"<!--fig:{name}-->{value}<!--/fig-->", text)


def rewrite_sample(text: str, name: str, lines: list[str]) -> str:
    body = "".join(line + "\n" for line in lines)
    return re.sub(
        rf"<!--sample:{name}-->\n```text\n.*?```\n<!--/sample-->",
        lambda _: f"<!--sample:{name}-->\n```text\n{body}```\n<!--/sample-->",
        text,
        flags=re.S,
    )


def write_documents(texts: dict[str, str]) -> None:
    for name, text in texts.items():
        if (ROOT / name).read_text() != text:
            (ROOT / name).write_text(text)


def cmd_measure(names: list[str]) -> int:
    registry = load_registry()
    texts = load_documents(registry)
    for name in names:
        entry = registry["figures"].get(name)
        if entry is None:
            raise SystemExit(f"figure {name!r} is not registered; registered: {', '.join(registry['figures'])}")
        if "command" not in entry:
            raise SystemExit(f"figure {name!r} has no command to re-run ({entry.get('source', '')})")
        for path in entry.get("fresh", []):  # a wall time from an empty store, not a re-run that reuses
            shutil.rmtree(ROOT / path, ignore_errors=True)
        print(f"measuring {name}: {entry['command']}", file=sys.stderr)
        seconds, output = run(entry["command"])
        entry.update(
            value=duration(seconds),
            measured=time.strftime("%Y-%m-%d"),
            cores=os.cpu_count(),
            source=f"python scripts/readme_figures.py measure {name}",
        )
        texts = {doc: rewrite_figure(text, name, entry["value"]) for doc, text in texts.items()}
        print(f"{name}: {entry['value']}", file=sys.stderr)
        sample = entry.get("sample")
        if sample:
            lines = kept_lines(output, registry["samples"][sample]["keep"])
            texts = {doc: rewrite_sample(text, sample, lines) for doc, text in texts.items()}
    REGISTRY.write_text(json.dumps(registry, indent=2, ensure_ascii=False) + "\n")
    write_documents(texts)
    return 0


def cmd_sample(names: list[str]) -> int:
    registry = load_registry()
    texts = load_documents(registry)
    for name in names:
        entry = registry["samples"][name]
        _, output = run(entry["command"])
        lines = kept_lines(output, entry["keep"])
        texts = {doc: rewrite_sample(text, name, lines) for doc, text in texts.items()}
    write_documents(texts)
    return 0


def cmd_check_sample(name: str, output_file: Path) -> int:
    registry = load_registry()
    text = "\n".join(load_documents(registry).values())
    entry = registry["samples"][name]
    shown = sample_blocks(text)[name].splitlines()
    produced = kept_lines(output_file.read_text(), entry["keep"])
    diffs = same_with_tolerance(shown, produced, entry.get("rel_tol", 0.0))
    for d in diffs:
        print(d, file=sys.stderr)
    if diffs:
        print(
            f"README sample {name!r} differs from {output_file}: run `python scripts/readme_figures.py sample "
            f"{name}` (or measure) and commit",
            file=sys.stderr,
        )
        return 1
    print(f"README sample {name!r} matches {output_file}")
    return 0


def cmd_check() -> int:
    registry = load_registry()
    found = problems("\n".join(load_documents(registry).values()), registry)
    for p in found:
        print(p, file=sys.stderr)
    return 1 if found else 0


def generated_blocks(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in GENERATED.finditer(text)}


def cmd_paste(name: str, source: Path) -> int:
    """Replace the generated block NAME in whichever document has it with SOURCE's text."""
    body = source.read_text()
    for doc, text in load_documents().items():
        if f"<!--generated:{name}-->" in text:
            new = GENERATED.sub(lambda m: m.group(1) + body + m.group(4) if m.group(2) == name else m.group(0), text)
            (ROOT / doc).write_text(new)
            print(f"{doc}: generated block {name!r} now holds {source}")
            return 0
    print(f"no document has a generated block {name!r}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    # Subcommands and positionals only, no flags: written by hand (looplab/arguments.py's
    # flag declares flags and a trailing word list); Parser gives each its one-line errors.
    parser = Parser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run and time figures, rewrite the README and the registry")
    m.add_argument("names", nargs="+")
    s = sub.add_parser("sample", help="run a sample's command, rewrite its README block")
    s.add_argument("names", nargs="+")
    c = sub.add_parser("check-sample", help="compare a README block with a saved output")
    c.add_argument("name")
    c.add_argument("output", type=Path)
    sub.add_parser("check", help="the README's figures and the registry agree")
    g = sub.add_parser("paste", help="put a command's generated text into its README block")
    g.add_argument("name")
    g.add_argument("source", type=Path)
    args = parser.parse_args(argv)
    if args.command == "paste":
        return cmd_paste(args.name, args.source)
    if args.command == "measure":
        return cmd_measure(args.names)
    if args.command == "sample":
        return cmd_sample(args.names)
    if args.command == "check-sample":
        return cmd_check_sample(args.name, args.output)
    return cmd_check()


if __name__ == "__main__":
    sys.exit(main())
