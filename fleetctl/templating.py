"""Rendering one Jinja2 template, with errors that name the template, the line and the variable.

Both the desired tree (:mod:`fleetctl.render`) and credential files (:mod:`fleetctl.credentials`)
render templates; this module is below both, so neither imports the other for it.
"""

from __future__ import annotations

import re
import traceback
from typing import Any, Literal

import jinja2

from fleetctl.errors import InputError

_UNDEFINED = re.compile(r"'([^']+)' is undefined")


def render_template(source: bytes, name: str, context: dict[str, Any]) -> bytes:
    """Render one Jinja2 template given as bytes; return bytes.

    Args:
        source: the template's bytes (UTF-8).
        name: how errors name the template (its path in the blueprint).
        context: template variables.

    Raises:
        InputError: not UTF-8, a syntax error, or an undefined variable (with line and name).
    """
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{name}: a template must be UTF-8 text (bad byte at offset {exc.start})",
                         hint="drop the .j2 suffix to copy the file byte for byte") from None
    # Jinja normalises every newline to newline_sequence: keep the template's own style.
    newline: Literal["\r\n", "\n"] = "\r\n" if "\r\n" in text else "\n"
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             newline_sequence=newline, autoescape=False)
    try:
        template = env.from_string(text)
        template.name = name
        out = template.render(context)
    except jinja2.TemplateSyntaxError as exc:
        raise InputError(f"{name}:{exc.lineno}: template syntax error: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        line = _template_line(exc)
        match = _UNDEFINED.search(exc.message or "")
        what = f"undefined variable {match.group(1)!r}" if match else (exc.message or "undefined")
        hint = ("define it under vars: for the host or the agent in the inventory"
                if match else None)
        raise InputError(f"{name}{':' + str(line) if line else ''}: {what}", hint=hint) from None
    except jinja2.TemplateError as exc:
        line = _template_line(exc)
        where = f"{name}:{line}" if line else name
        raise InputError(f"{where}: template error: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a template's own arithmetic, filters, include...
        line = _template_line(exc)
        what = ("include/extends/import are not supported: each template renders on its own"
                if "no loader" in str(exc) else f"{exc.__class__.__name__}: {exc}")
        where = f"{name}:{line}" if line else name
        raise InputError(f"{where}: template error: {what}") from None
    return out.encode("utf-8")


def _template_line(exc: BaseException) -> int | None:
    # Jinja rewrites tracebacks so template frames carry the template's own line numbers.
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == "<template>":
            line = frame.lineno
    return line


def template_variables(source: bytes) -> set[str]:
    """The top-level variable names a template reads (Jinja2's own analysis of its syntax);
    empty when it is not UTF-8 or does not parse."""
    from jinja2 import meta

    try:
        return set(meta.find_undeclared_variables(jinja2.Environment().parse(
            source.decode("utf-8"))))
    except (UnicodeDecodeError, jinja2.TemplateSyntaxError):
        return set()
