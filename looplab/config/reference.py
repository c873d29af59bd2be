"""The options reference: every override key of an ExperimentConfig, documented from
its declaration.

A config field is declared once, in its dataclass (looplab/config/, the task configs in
looplab/tasks/), with the comment that says what it means. That declaration is already
an override on every command line (`looplab train --preset debug train.lr=0.001`, a
sweep's `--set train.lr=0.001`); this module makes it a documented option too:

    options()          every option: its key, type, default, role in the run's key and description
    describe(prefix)   the options whose key starts with prefix, as plain text for a terminal
    render_markdown()  the whole reference as a Markdown page (docs/options.md)

`python -m looplab.config.reference > docs/options.md` writes the page;
tests/test_config_reference.py checks that the page is that output.

The keys follow `apply_overrides`: `section.field` for the fields of the sections
model, task, train, exit and hole (a task's fields are those of its kind, task.kind),
and the bare names stage and parent. The default is the dataclass's own (not a
preset's); the key role is the field's `keyed(...)` metadata (looplab/fields.py):
keyed, added (enters a key only when set away from its default) or no.

A field's description is its source comment, read with `inspect.getsource` and
`tokenize`: the comment trailing the field's line, else the comment lines directly
above it (no blank line between). A field with neither is undocumented:
`render_markdown` refuses to render the page and names it, so a new field without
its comment fails the test that compares the page. Nothing here imports torch.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import sys
import textwrap
import tokenize
import typing
from dataclasses import dataclass
from typing import Any

from looplab.config.experiment import TASK_KINDS, ExperimentConfig, is_keyed, parse_value
from looplab.errors import invalid
from looplab.fields import ADDED, KEY
from looplab.stages import STAGES

REGENERATE = "python -m looplab.config.reference > docs/options.md"
# ExperimentConfig's fields that apply_overrides sets by their bare name (preset, the
# other one that is no section, is a note for readers and no override).
TOP_LEVEL = ("stage", "parent")
TOP_SECTION = "stage"  # the section the bare names are listed under
KEY_ROLES = ("keyed", "added", "no")


class UndocumentedField(ValueError):
    """A config field with no comment beside or above it: it has no description."""


@dataclass(frozen=True)
class Option:
    """One override: where it is declared and what the reference says about it."""

    key: str  # the dotted override key, e.g. "train.lr" ("stage" for a bare name)
    section: str  # model | task | train | exit | hole | stage
    task_kind: str  # the task.kind the option belongs to ("" outside the task section)
    owner: str  # where it is declared: "TrainConfig.lr"
    type: str  # the field's annotation as written
    default: Any  # the dataclass's default
    key_role: str  # keyed | added | no
    description: str  # the source comment ("" when it has none)

    @property
    def default_text(self) -> str:
        """The default as a command line writes it (parse_value reads it back)."""
        return override_text(self.default)


def override_text(value: Any) -> str:
    """value as the text of an override (`key=TEXT`): a string bare where parse_value
    reads it back unchanged, anything else (and "") as JSON."""
    if isinstance(value, str) and value and parse_value(value) == value:
        return value
    return json.dumps(list(value) if isinstance(value, tuple) else value)


# ---- descriptions from the source ---------------------------------------------------


@functools.cache
def field_descriptions(cls: type) -> dict[str, str]:
    """Each field of the dataclass cls (its bases' too) with its description: the
    comment trailing its line, else the comment lines directly above it; "" for none."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and klass is not object:
            out.update(_class_comments(klass))
    return {f.name: out.get(f.name, "") for f in dataclasses.fields(cls)}


def _class_comments(klass: type) -> dict[str, str]:
    """The descriptions of the fields a class body declares itself."""
    source = textwrap.dedent(inspect.getsource(klass))
    lines = source.splitlines()
    trailing: dict[int, list[str]] = {}
    standalone: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            text = token.string.lstrip("#").strip()
            if lines[row - 1][:col].strip():
                trailing.setdefault(row, []).append(text)
            else:
                standalone[row] = text
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.ClassDef), klass
    out = {}
    for statement in node.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            end = statement.end_lineno or statement.lineno
            own = [text for row in range(statement.lineno, end + 1) for text in trailing.get(row, [])]
            above: list[str] = []
            row = statement.lineno - 1
            while row in standalone:
                above.insert(0, standalone[row])
                row -= 1
            out[statement.target.id] = " ".join(part for part in (own or above) if part)
    return out


# ---- the options --------------------------------------------------------------------


def options_of(cls: type, section: str, task_kind: str = "") -> list[Option]:
    """The options of one config dataclass, addressed as `section.field`."""
    described = field_descriptions(cls)
    hints = _hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get(KEY):
            role = "added" if f.metadata.get(ADDED) else "keyed"
        else:
            role = "no"
        out.append(
            Option(
                key=f"{section}.{f.name}",
                section=section,
                task_kind=task_kind,
                owner=f"{cls.__name__}.{f.name}",
                type=_type_text(f.type, hints.get(f.name)),
                default=_default(f),
                key_role=role,
                description=described[f.name],
            )
        )
    return out


def _hints(cls: type) -> dict[str, Any]:
    """The class's field types resolved (a `Literal` alias such as Arch to its values)."""
    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # a name only the type checker sees: the text as written
        return {}


def _type_text(written: Any, resolved: Any = None) -> str:
    """A field's type as the page shows it: a Literal (also behind an alias such as Arch)
    as its values, mamba2 | transformer | hybrid; any other as written in the source."""
    if typing.get_origin(resolved) is typing.Literal:
        return " | ".join(str(v) for v in typing.get_args(resolved))
    if isinstance(written, str):
        return written
    return getattr(written, "__name__", repr(written))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def sections() -> list[tuple[str, list[tuple[str, type]]]]:
    """The sections in ExperimentConfig's order, each with its (task kind, dataclass)
    pairs (the task section one per kind, the others one with kind ""), then the bare
    names' section (TOP_SECTION, ExperimentConfig itself)."""
    out: list[tuple[str, list[tuple[str, type]]]] = []
    for f in dataclasses.fields(ExperimentConfig):
        if f.name == "task":
            out.append((f.name, list(TASK_KINDS.items())))
        elif isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            out.append((f.name, [("", f.default_factory)]))
    out.append((TOP_SECTION, [("", ExperimentConfig)]))
    return out


@functools.cache
def _all_options() -> tuple[Option, ...]:
    out: list[Option] = []
    for section, classes in sections():
        for kind, cls in classes:
            if cls is ExperimentConfig:
                out.extend(_top_level())
            else:
                out.extend(options_of(cls, section, kind))
    return tuple(out)


def _top_level() -> list[Option]:
    """The bare names apply_overrides sets: ExperimentConfig's stage and parent."""
    described = field_descriptions(ExperimentConfig)
    fields = {f.name: f for f in dataclasses.fields(ExperimentConfig)}
    hints = _hints(ExperimentConfig)
    return [
        Option(
            key=name,
            section=TOP_SECTION,
            task_kind="",
            owner=f"ExperimentConfig.{name}",
            type=_type_text(fields[name].type, hints.get(name)),
            default=_default(fields[name]),
            key_role="keyed" if is_keyed(name) else "no",
            description=described[name],
        )
        for name in TOP_LEVEL
    ]


def options() -> list[Option]:
    """Every override key of an ExperimentConfig (a task's keys once per task kind)."""
    return list(_all_options())


def undocumented(opts: list[Option] | None = None) -> list[str]:
    """The options without a description, as "Owner.field (key)"."""
    return [f"{o.owner} ({o.key})" for o in (options() if opts is None else opts) if not o.description]


def check_documented(opts: list[Option]) -> None:
    """Raise UndocumentedField naming every option without a description."""
    missing = undocumented(opts)
    if missing:
        raise UndocumentedField(
            f"no description for {', '.join(missing)}: write a comment beside or above the field "
            f"(looplab/config/, looplab/tasks/), then run `{REGENERATE}`"
        )


# ---- plain text ---------------------------------------------------------------------


def describe(prefix: str = "") -> str:
    """The options whose key starts with prefix ("" for all; "train." for a section,
    "train.lr" for one), as plain text for a terminal: per option a line with its key,
    default, type and key role, then its description indented."""
    chosen = [o for o in options() if o.key.startswith(prefix)]
    if not chosen:
        starts = " | ".join(sorted({o.key.partition(".")[0] + ("." if "." in o.key else "") for o in options()}))
        raise invalid("prefix", prefix, f"the start of an option's key: {starts} (e.g. train.lr)")
    blocks = []
    for o in chosen:
        facts = [o.type, o.key_role if o.key_role != "no" else "not keyed"]
        if o.task_kind:
            facts.append(f"task.kind={o.task_kind}")
        head = f"{o.key}={o.default_text}  ({', '.join(facts)})"
        body = textwrap.fill(
            o.description or "(no description)", width=92, initial_indent="    ", subsequent_indent="    "
        )
        blocks.append(f"{head}\n{body}")
    return "\n".join(blocks) + "\n"


# ---- Markdown -----------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text inside a Markdown table cell, read literally: Markdown's and HTML's special
    characters escaped, a pipe so it does not end the cell."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    for char in "\\`*_[]|":
        text = text.replace(char, "\\" + char)
    return text


def _code(text: str) -> str:
    """text as a code span in a table cell (a pipe escaped: the table is split first)."""
    return f"`{text.replace('|', chr(92) + '|')}`"


def _intro(cls: type) -> list[str]:
    """The class docstring: its first paragraph as prose, the rest verbatim."""
    doc = inspect.getdoc(cls) or ""
    first, _, rest = doc.partition("\n\n")
    lines = [_cell(" ".join(first.split())), ""]
    if rest.strip():
        lines += ["```text", rest.strip(), "```", ""]
    return lines


def _table(opts: list[Option]) -> list[str]:
    lines = ["| Option | Type | Default | Key | Description |", "|---|---|---|---|---|"]
    for o in opts:
        cells = [_code(o.key), _cell(o.type), _code(o.default_text), o.key_role, _cell(o.description)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _readers(section: str) -> str:
    """The stages whose key a section's keyed fields enter, beyond model, task and train."""
    return ", ".join(name for name, stage in STAGES.items() if section in stage.reads)


def _header() -> list[str]:
    default_kind = ExperimentConfig().task.kind
    return [
        f"<!-- Generated by `{REGENERATE}` from the config dataclasses and the comments",
        "     beside their fields: edit those (looplab/config/, looplab/tasks/), not this page. -->",
        "",
        "# Options",
        "",
        "Every field of an experiment's config is an override, on every command line "
        "(`looplab train --preset debug train.lr=0.001`) and in a sweep (`--set train.lr=0.001`): "
        "`KEY=VALUE`, the value read as JSON when it parses and as a string otherwise. "
        "This page lists them all, each with its type, its default (the config's own; a preset "
        "sets many of them, and `looplab train` applies the stage's recipe before the overrides) and "
        "its description, the comment beside the field's declaration. "
        "`looplab options PREFIX` prints the same in a terminal, e.g. `looplab options train.`.",
        "",
        "A bare name (`n_loops=2`) is looked up in model, then train, then task. "
        f"A task's options are those of its kind: `task.kind` (default `{default_kind}`) picks it, "
        "and setting it resets the task to that kind's defaults before the other task options apply.",
        "",
        "**Key** says whether the option enters the run's content key (looplab/fields.py's `keyed`): "
        "*keyed*, a change makes another run; *added*, only when set away from its default "
        "(a field added after keys were stored, so older keys stay valid); *no*, never "
        "(cadence, device, memory, speed): a re-run that changes it reuses the run. "
        "The keyed options of exit and hole enter only the keys of the stages that read them.",
        "",
    ]


def render_markdown() -> str:
    """The options reference as a Markdown page: one table per section (one per task
    kind in the task section). Raises UndocumentedField for an option without a
    description."""
    opts = options()
    check_documented(opts)
    lines = _header()
    for section, classes in sections():
        lines += [f"## {section}", ""]
        if section == TOP_SECTION:
            lines += [
                "Set by their bare names. `looplab train --stage` sets the stage and `--init` the parent; "
                "a continued stage needs its parent.",
                "",
            ]
        for kind, cls in classes:
            chosen = [o for o in opts if o.section == section and o.task_kind == kind]
            if kind:
                lines += [f"### task.kind={kind}", ""]
            if cls is not ExperimentConfig:
                lines += _intro(cls)
            if section != "task" and _readers(section):
                lines += [
                    _cell(f"Its keyed options enter the keys of the stages that read it: {_readers(section)}."),
                    "",
                ]
            lines += _table(chosen)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the Markdown page (`python -m looplab.config.reference > docs/options.md`);
    with a prefix argument, the plain-text listing of the options it starts."""
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(describe(args[0]) if args else render_markdown())
    return 0


__all__ = [
    "Option",
    "UndocumentedField",
    "check_documented",
    "describe",
    "field_descriptions",
    "options",
    "options_of",
    "override_text",
    "render_markdown",
    "undocumented",
]

if __name__ == "__main__":
    raise SystemExit(main())
