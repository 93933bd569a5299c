"""The serve group's settings: the connection limits' validation rows, each one line naming
the value and the fix, and which Host names a server answers to by default."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fwk.errors import UserError
from fwk.serve.settings import ServeConfig, allowed_hosts, check_settings

BAD = [
    ({"header_timeout_s": 0.0}, "serve.header_timeout_s=0.0 is not allowed: expected a number of seconds > 0"),
    (
        {"max_connections": 64},
        "serve.max_connections=64 is not allowed: expected an integer >= serve.max_inflight=128 (each request in "
        "flight holds a connection)",
    ),
    ({"max_connections": 0, "max_inflight": 1}, "serve.max_connections=0 is not allowed: expected an integer >= "),
    (
        {"allowed_hosts": ["api.example:8000"]},
        "serve.allowed_hosts=['api.example:8000'] is not allowed: expected a list of host names without scheme or "
        "port, like [localhost,api.example.com]; [*] for any (fix it with serve.allowed_hosts=...)",
    ),
    ({"allowed_hosts": ["http://api.example"]}, "serve.allowed_hosts=['http://api.example'] is not allowed"),
    ({"allowed_hosts": ["[::1]"]}, "serve.allowed_hosts=['[::1]'] is not allowed"),
    ({"allowed_hosts": [""]}, "serve.allowed_hosts=[''] is not allowed"),
]


@pytest.mark.parametrize("fields,message", BAD, ids=[m.split(" is")[0] for _, m in BAD])
def test_a_bad_connection_setting_is_one_line_naming_it(fields: dict, message: str) -> None:
    with pytest.raises(UserError) as refused:
        check_settings(replace(ServeConfig(), **fields))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_good_connection_settings_pass() -> None:
    cfg = replace(ServeConfig(), max_connections=128, header_timeout_s=0.5, allowed_hosts=["::1", ".example.com", "*"])
    assert check_settings(cfg) is cfg


@pytest.mark.parametrize(
    "listed,bound,answered",
    [
        ([], "127.0.0.1", {"localhost", "127.0.0.1", "::1"}),  # DNS rebinding: only the loopback names
        ([], "::1", {"localhost", "127.0.0.1", "::1"}),
        ([], "localhost", {"localhost", "127.0.0.1", "::1"}),
        ([], "0.0.0.0", None),  # every interface: reached by names fwk cannot know
        ([], "10.1.2.3", None),
        (["API.example.", "localhost"], "0.0.0.0", {"api.example", "localhost"}),
        (["api.example"], "127.0.0.1", {"api.example"}),  # the list replaces the default
        (["api.example", "*"], "127.0.0.1", None),
    ],
)
def test_allowed_hosts_by_default_follow_the_address_bound(listed: list, bound: str, answered: set | None) -> None:
    got = allowed_hosts(replace(ServeConfig(), allowed_hosts=listed), bound)
    assert got == (None if answered is None else frozenset(answered))
