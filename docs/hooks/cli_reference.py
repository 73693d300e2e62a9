"""mkdocs hook: the CLI reference, generated at build time from the one argparse tree.

Any page that contains the marker ``<!-- geosharp-cli-reference -->`` gets it replaced by one section per
command (and per ``population`` action) of :func:`geosharp_ref.cli.parser.build_parser`: usage, description,
positional arguments and options with their defaults and choices, and the epilog. Nothing is committed, so the
page cannot drift from the parser; building the parser imports no torch, so this costs milliseconds.
"""
from __future__ import annotations

import argparse
import html
import os

MARKER = "<!-- geosharp-cli-reference -->"
WIDTH = 100


def _subparsers(parser: argparse.ArgumentParser):
    """(name, help, subparser) for every subcommand of ``parser``, in declaration order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _escape(text: str) -> str:
    return html.escape(text or "", quote=False).replace("|", "\\|")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                if isinstance(metavar, tuple):
                    metavar = " ".join(metavar)
                name += f" {metavar}" + (" …" if action.nargs in ("+", "*") else "")
        else:
            name = action.metavar or action.dest
        details = []
        if action.choices is not None and not isinstance(action.choices, dict):
            details.append("choices: " + ", ".join(f"`{c}`" for c in action.choices))
        if action.required and action.option_strings:
            details.append("required")
        default = action.default
        if (action.option_strings and action.nargs != 0 and default not in (None, argparse.SUPPRESS, "")
                and not (isinstance(default, (list, tuple)) and not default)
                and "default" not in (action.help or "")):  # the help text states it already
            shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
            details.append(f"default: `{shown}`")
        help_text = _escape((action.help or "").replace("%(default)s", str(default)).replace("%%", "%"))
        extra = f" ({'; '.join(details)})" if details else ""
        rows.append(f"| `{_escape(name)}` | {help_text}{extra} |")
    return rows


def _section(parser: argparse.ArgumentParser, title: str, summary: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{title}`", ""]
    if summary:
        out += [_escape(summary), ""]
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: "):]
    out += ["```text", usage, "```", ""]
    if parser.description and parser.description != summary:
        out += [_escape(parser.description), ""]
    rows = _option_rows(parser)
    if rows:
        out += ["| argument | meaning |", "|---|---|", *rows, ""]
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]
    for name, help_text, sub in _subparsers(parser):
        out += _section(sub, f"{title} {name}", help_text, min(level + 1, 4))
    return out


def cli_reference_markdown() -> str:
    """The whole reference as Markdown, one section per command, from ``build_parser()``."""
    from geosharp_ref.cli.parser import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)  # argparse wraps usage lines to the terminal: the same page everywhere
    try:
        return _reference(build_parser())
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def _reference(parser: argparse.ArgumentParser) -> str:
    out = []
    if parser.description:
        out += [_escape(parser.description), ""]
    out += ["```text", parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    for name, help_text, sub in _subparsers(parser):
        out += _section(sub, f"geosharp {name}", help_text, 2)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files, **kwargs):  # noqa: ARG001 (mkdocs hook signature)
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference_markdown())
    return markdown
