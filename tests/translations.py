"""Reading a ``.po`` catalog as ``gettext`` keys it: both apps' translation tests compare
their ``.po`` with the compiled ``.mo`` through it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

Catalog = dict[Any, str]


def read_po(path: Path) -> tuple[Catalog, list[str]]:
    """A ``.po`` file's messages as ``gettext`` keys them (``msgid``, ``(msgid, n)`` for each
    plural form, ``"context\x04msgid"`` for a message with a ``msgctxt``), and the key of each
    fuzzy entry.
    (metrics_app's catalog has a context: ``"series"`` is one word in English, two in
    French.)
    """
    catalog: Catalog = {}
    fuzzy: list[str] = []
    for entry in path.read_text(encoding="utf-8").strip().split("\n\n"):
        fields: dict[str, str] = {}
        name = ""
        for line in entry.splitlines():
            if line.startswith("#"):
                continue
            match = re.match(r"(msgctxt|msgid_plural|msgid|msgstr(?:\[\d+\])?) ", line)
            if match:
                name = match[1]
                line = line[match.end() :]
            fields[name] = fields.get(name, "") + ast.literal_eval(line)
        msgid = fields["msgid"]
        if "msgctxt" in fields:
            msgid = f"{fields['msgctxt']}\x04{msgid}"
        if re.search(r"^#,.*\bfuzzy\b", entry, re.M):
            fuzzy.append(msgid)
        for name, text in fields.items():
            if name.startswith("msgstr["):
                catalog[(msgid, int(name[7:-1]))] = text
            elif name == "msgstr":
                catalog[msgid] = text
    return catalog, fuzzy
