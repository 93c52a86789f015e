"""YAML for the files an operator or a client hands the product (configuration, API keys,
the chaos inventory, demo scenarios, registered queries): safe types only, and no
aliases. An alias repeats a whole subtree by reference, so a few hundred bytes of nested
aliases ("billion laughs") expand to millions of nodes once something walks them; none
of these files needs one, so the first is refused with its line and column, before any
expansion."""
from __future__ import annotations

from typing import Any

import yaml


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted; write the value out",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def load(text: str | bytes) -> Any:
    """Like yaml.safe_load, refusing aliases (a yaml.YAMLError with a problem_mark)."""
    return yaml.load(text, Loader=_NoAliasLoader)
