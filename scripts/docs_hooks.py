"""The docs site's generated parts, and the MkDocs hooks that put them in (mkdocs.yml).

The reference pages are made from the code so that they cannot drift: the settings table
from the ``Settings`` dataclass (:func:`settings_fields`, the one function that reads it), the
map of the packages from each module's opening docstring (:func:`module_map`), the CLI
by mkdocs-click from the click group itself (every command loaded first, as
:func:`cli_commands` walks them). The Performance page is ``docs/performance.md``, whose
figures ``python -m bench report`` writes; its plots stay in ``bench/results`` and are
added to the site as they are. The tests import this module (pytest's ``pythonpath``) to
hold the reference to every setting, command and package; it needs no MkDocs for that.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rmqdelay"
SETTINGS_MARK = "<!-- settings-reference -->"
MODULES_MARK = "<!-- module-map -->"
API_MARK = "<!-- api-reference -->"


@dataclass(frozen=True)
class SettingDoc:
    name: str
    env: str
    type: str
    default: str
    description: str


def _markdown(docstring: str) -> str:
    """A docstring's reST as Markdown, on one line."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(docstring.split()))
    return text.replace("``", "`")


def _toml(name: str, value: Any) -> str:
    """A default as a TOML file would write it (durations are kept in ms, sizes in bytes)."""
    from rmqdelay.core.durations import format_ms

    if isinstance(value, bool):
        return str(value).lower()
    if name == "journal_retention" and isinstance(value, int) and value % 2**30 == 0:
        return f"{value // 2**30}GiB"
    if name == "resolution" and isinstance(value, int):
        return format_ms(value)
    return str(value)


def settings_fields() -> list[SettingDoc]:
    """Every field of ``rmqdelay.settings.Settings`` (a dataclass, each field declared
    once with its reader and description): its name, environment variable, type as
    written, default and description."""
    import dataclasses

    from rmqdelay.settings import Settings

    rows = []
    for field in dataclasses.fields(Settings):
        default: Any = [] if field.default_factory is list else field.default
        shown = "none" if default is None else f"`{_toml(field.name, default)}`"
        description = _markdown(str(field.metadata.get("description", "")))
        rows.append(
            SettingDoc(
                field.name, f"RMQDELAY_{field.name.upper()}", str(field.type), shown, description
            )
        )
    return rows


def settings_reference() -> str:
    lines = ["| setting | environment | type | default | meaning |", "|---|---|---|---|---|"]
    for s in settings_fields():
        cells = (f"`{s.name}`", f"`{s.env}`", f"`{s.type}`", s.default, s.description)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# The API page's sections: a public name not named here goes under "Other names", so that
# every name of rmqdelay.__all__ is on the page.
API_SECTIONS = {
    "Publishing": [
        "Publisher",
        "AsyncPublisher",
        "PublisherProtocol",
        "AsyncPublisherProtocol",
        "PublishResult",
    ],
    "Workers": [
        "Worker",
        "RunningWorker",
        "Context",
        "Delivery",
        "Settled",
        "WorkerHook",
        "Retry",
        "Requeue",
        "Park",
        "Backoff",
        "RetryPolicy",
        "DecodeError",
    ],
    "Settings": ["Settings", "load_settings", "mask_url"],
    "Topology and delays": [
        "TopologyManager",
        "Topology",
        "build_topology",
        "Layout",
        "DelayPlan",
        "plan_delay",
        "DurationLike",
        "format_ms",
        "parse_duration_us",
    ],
    "Parked messages": ["ParkedQueue", "ParkedMessage"],
    "Recurring schedules": ["RecurringSchedule", "RecurringResult"],
    "Testing": ["InMemoryPublisher", "AsyncInMemoryPublisher"],
}


def api_reference() -> str:
    """A mkdocstrings block per name of ``rmqdelay.__all__``, then ``rmqdelay.testing``."""
    import rmqdelay

    public = list(rmqdelay.__all__)
    sections = {title: [n for n in names if n in public] for title, names in API_SECTIONS.items()}
    placed = {n for names in sections.values() for n in names}
    sections["Errors"] = sorted(n for n in public if n not in placed and n.endswith("Error"))
    placed |= set(sections["Errors"])
    sections["Other names"] = sorted(n for n in public if n not in placed)
    out = []
    for title, names in sections.items():
        if names:
            out += [f"## {title}", ""] + [f"::: rmqdelay.{name}\n" for name in names]
    out += [
        "## The module `rmqdelay.testing`",
        "",
        "::: rmqdelay.testing",
        "    options:",
        "      members: false",
        "",
    ]
    return "\n".join(out)


def packages() -> list[str]:
    """Every package of rmqdelay, dotted (``rmqdelay.core.journal``)."""
    return sorted(
        ".".join(init.parent.relative_to(ROOT).parts) for init in PACKAGE.rglob("__init__.py")
    )


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    return _markdown(paragraph).replace("|", "\\|")


def module_map() -> str:
    """For each package, its modules and the first paragraph of each one's docstring."""
    out = []
    for package in packages():
        folder = ROOT.joinpath(*package.split("."))
        out += [f"### `{package}`", "", _first_line(folder / "__init__.py"), ""]
        modules = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        if modules:
            out += ["| module | what it is for |", "|---|---|"]
            out += [f"| `{m.stem}` | {_first_line(m)} |" for m in modules]
            out.append("")
    return "\n".join(out)


def cli_commands() -> list[str]:
    """Every command's full name (``rmqdelay topology apply``), every lazy one loaded."""
    import click

    from rmqdelay.cli import app

    found: list[str] = []

    def walk(command: click.Command, path: str, ctx: click.Context) -> None:
        found.append(path)
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, f"{path} {name}", click.Context(sub, parent=ctx, info_name=name))

    walk(app, "rmqdelay", click.Context(app, info_name="rmqdelay"))
    return found


# MkDocs hooks (mkdocs.yml: hooks). Their arguments are MkDocs objects, typed loosely so
# that this module type-checks and imports without MkDocs.


def on_config(config: Any) -> Any:
    cli_commands()  # mkdocs-click lists a group's loaded commands: load every lazy one
    return config


def on_files(files: Any, config: Any) -> Any:
    """The bench's plots, where docs/performance.md names them (bench/results/*.png)."""
    from mkdocs.structure.files import File

    for plot in sorted((ROOT / "bench" / "results").glob("*.png")):
        uri = f"bench/results/{plot.name}"
        files.append(File(uri, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):<code>~?([^<]+)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The docstrings' reST roles (``:class:`~rmqdelay.Worker```) as plain code."""
    return _ROLE.sub(r"<code>\1</code>", html)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if SETTINGS_MARK in markdown:
        markdown = markdown.replace(SETTINGS_MARK, settings_reference())
    if API_MARK in markdown:
        markdown = markdown.replace(API_MARK, api_reference())
    if MODULES_MARK in markdown:
        markdown = markdown.replace(MODULES_MARK, module_map())
    return markdown
