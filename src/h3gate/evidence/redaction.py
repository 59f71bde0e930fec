"""Redaction: home folders, host and user names replaced by placeholders inside the statement (and the JUnit XML it
digests) before signing; ``redaction.json`` lists the redacted fields, never their values."""

from __future__ import annotations

import io
import re
from pathlib import Path

from h3gate.files import write_atomic

REDACTION_SCHEMA = "h3gate.redaction/1"
REDACTION_NAME = "redaction.json"
PLACEHOLDERS = {"home": "~", "host": "<host>", "user": "<user>"}


class Redactor:
    """Replaces the home folder (as a path prefix), and the host and user names where they are a whole path
    component or the whole value of a ``hostname``/``user``/``home`` field, by placeholders. Matching whole
    components only keeps a short user name from eating parts of tap or gate names."""

    FIELDS = {"hostname": "host", "user": "user", "home": "home"}

    def __init__(self, environment: dict):
        host = environment.get("hostname")
        self.own = {"host": host, "user": environment.get("user"), "home": environment.get("home")}
        self.components = [("host", name) for name in sorted({host, host.split(".")[0]})] if host else []
        if self.own["user"]:
            self.components.append(("user", self.own["user"]))

    def __call__(self, value, pointer: str = "") -> tuple[object, dict[str, list[str]]]:
        """(``value`` redacted, {JSON pointer under ``pointer``: kinds redacted there})."""
        fields: dict[str, list[str]] = {}
        return self._walk(value, pointer, None, fields), fields

    def field(self, key: str | None, value: str) -> str:
        """One string redacted as the value of a field named ``key`` (an XML attribute, or None for text)."""
        return self._walk(value, "", key, {})

    def _walk(self, value, pointer: str, key: str | None, fields: dict):
        if isinstance(value, dict):
            return {k: self._walk(v, f"{pointer}/{pointer_token(k)}", k, fields) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, f"{pointer}/{i}", None, fields) for i, v in enumerate(value)]
        if not isinstance(value, str):
            return value
        kinds = []
        kind = self.FIELDS.get(key)
        if kind and value and value == self.own[kind]:
            kinds.append(kind)
            value = PLACEHOLDERS[kind]
        home = self.own["home"]
        if home and (value == home or home + "/" in value):
            value = "~" if value == home else value.replace(home + "/", "~/")
            kinds.append("home")
        for kind, name in self.components:
            replaced = re.sub(rf"(?<=/){re.escape(name)}(?=/|$)", PLACEHOLDERS[kind], value)
            if replaced != value:
                value = replaced
                kinds.append(kind)
        if kinds:
            fields[pointer] = sorted(set(kinds))
        return value


def redact_xml(path: Path, environment: dict) -> None:
    """Redact a JUnit XML file in place, as the statement is redacted, before it is hashed as a subject: pytest
    writes the host name and absolute paths into it, and it is uploaded beside the evidence."""
    import xml.etree.ElementTree as ElementTree

    redact = Redactor(environment)
    tree = ElementTree.parse(path)
    for element in tree.iter():
        for name, value in element.attrib.items():
            element.set(name, redact.field(name, value))
        if element.text:
            element.text = redact.field(None, element.text)
        if element.tail:
            element.tail = redact.field(None, element.tail)
    buffer = io.BytesIO()
    tree.write(buffer, encoding="utf-8", xml_declaration=True)
    write_atomic(path, buffer.getvalue())



def pointer_token(key: str) -> str:
    """A JSON pointer (RFC 6901) reference token."""
    return str(key).replace("~", "~0").replace("/", "~1")



def redaction_record(statement: dict) -> dict:
    """redaction.json: which fields were redacted and by what placeholders, never their values."""
    return {"schema": REDACTION_SCHEMA, "placeholders": PLACEHOLDERS, "fields": statement["predicate"]["h3"]["redacted"]}

