"""JSON request bodies that are valid Unicode.

JSON may spell an unpaired UTF-16 surrogate (`"\\ud800"`); Python decodes it into a
string that cannot be encoded as UTF-8, so it would pass validation and then fail in the
database driver (a 500) or in any client reading it back. Such bodies are refused here, as
malformed JSON (400), for every endpoint: the app's JSON provider uses `loads`."""
from __future__ import annotations

import json
import re
from typing import Any

from flask.json.provider import DefaultJSONProvider

# Only bodies with a \uD800-\uDFFF escape can decode to a surrogate; the others skip the check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")


class UnpairedSurrogate(ValueError):
    pass


def loads(data: str | bytes) -> Any:
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise UnpairedSurrogate("body contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff): "
                                    "not valid Unicode") from None
    return value


class StrictJSONProvider(DefaultJSONProvider):
    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s)
