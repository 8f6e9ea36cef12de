"""Where a `$ref` points in the schema document it stands in: a JSON pointer (into any key, not
only `$defs` / `definitions`), an `$anchor` (or an older draft's `id: "#name"`), or either of
those behind the root's own `$id`. Anything else lies outside the document."""
from __future__ import annotations

from typing import Any, Mapping, Optional
from urllib.parse import unquote


class RefProblem(ValueError):
    """A reference that names nothing this document holds; the message says why."""


def escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


class SchemaDocument:
    def __init__(self, root: Any):
        self.root = root
        self._anchors: Optional[dict[str, str]] = None

    def locate(self, ref: str) -> str:
        """The JSON pointer that `ref` names (checked to exist)."""
        base, _, fragment = ref.partition("#")
        if base and base.rstrip("/") not in self.root_ids():
            raise RefProblem(f"'$ref' {ref!r} refers outside this schema")
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            target = self.anchors().get(fragment)
            if target is None:
                raise RefProblem(f"'$ref' {ref!r}: no subschema has that anchor")
            return target
        try:
            self.resolve(fragment)
        except KeyError:
            raise RefProblem(f"'$ref' {ref!r} points at nothing in this schema") from None
        return fragment

    def resolve(self, location: str) -> Any:
        """The subschema at JSON pointer `location`; KeyError if there is none."""
        node: Any = self.root
        for part in location.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise KeyError(location)
        return node

    def root_ids(self) -> set[str]:
        ids = {self.root.get(k) for k in ("$id", "id")} if isinstance(self.root, Mapping) else set()
        return {i.split("#")[0].rstrip("/") for i in ids if isinstance(i, str)}

    def anchors(self) -> dict[str, str]:
        """Anchor name -> pointer, found once by walking the whole document."""
        if self._anchors is None:
            self._anchors = {}
            stack: list[tuple[Any, str]] = [(self.root, "")]
            while stack:
                node, where = stack.pop()
                if isinstance(node, Mapping):
                    for key in ("$anchor", "$id", "id"):
                        value = node.get(key)
                        if isinstance(value, str) and (key == "$anchor" or value.startswith("#")):
                            self._anchors.setdefault(value.lstrip("#"), where)
                    stack.extend((v, f"{where}/{escape(str(k))}") for k, v in node.items())
                elif isinstance(node, list):
                    stack.extend((v, f"{where}/{i}") for i, v in enumerate(node))
        return self._anchors
