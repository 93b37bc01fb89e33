"""What every part of a spec shares: the strict base model, names, placeholders and the size
bounds on what a spec may hold.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
PLACEHOLDERS = ("port", "model", "gpus", "tp", "host")
# In the argv of a worker group or a router (an engine with `groups`): the group's own name and
# GPUs, and the address of any group of the same engine (`{url:decode}`, `{host:prefill}`,
# `{port:prefill}`): every port is picked before the first process starts.
GROUP_PLACEHOLDERS = ("role", "group_gpus")
GROUP_REF_RE = re.compile(r"^(url|host|port):([a-z0-9-]{1,16})$")
MAX_SPEC_BYTES = 1_000_000
# Every string a spec holds is stored with its gate and shown back: three gates whose URLs had
# 300,000-character paths once made every gate list and the `/` page 1.8 MB. A URL or an image
# is shown in every gate list (the engines' labels, 500 characters in the database); any other
# string (an argv item, an env value, a region, a key) is at most MAX_SPEC_STRING.
MAX_SPEC_STRING = 4_096
MAX_URL_CHARS = 500
MAX_LIST_ITEMS = 256  # regions, providers, pools, tolerations, pull secrets: names, not data


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting alphanumeric")
    return v


Name = Annotated[str, AfterValidator(_check_name)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=MAX_SPEC_STRING)


# A placeholder's shape: `{name}` or `{url:GROUP}`; other braces (a JSON argument such as
# vLLM's --kv-transfer-config) are left as written.
ANY_PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?::[^{}\s\"':]*)?)\}")
