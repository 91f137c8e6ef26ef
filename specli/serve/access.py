"""`specli serve`'s access options checked before anything loads: --alias, the API key (--api-key or
SPECLI_API_KEY) and --allow-origin."""

from __future__ import annotations

import os

from specli.settings import UsageProblem, valid_text


def checked_access(alias: str | None, api_key: str | None, allow_origin: list[str] | None) -> str | None:
    """serve's --alias, --api-key (or SPECLI_API_KEY) and --allow-origin checked: the API key to require."""
    if alias is not None and not valid_text(alias, "--alias").strip():
        raise UsageProblem("--alias is empty: give the name clients should use for the model")
    if api_key is None and os.environ.get("SPECLI_API_KEY") == "":
        api_key = ""  # click reads an empty variable as unset: that would serve with no key, silently
    if api_key is not None:
        api_key = checked_api_key(api_key)
    if allow_origin:
        from specli.serve.origins import canonical_origin

        for origin in allow_origin:
            if canonical_origin(valid_text(origin, "--allow-origin")) is None:
                raise UsageProblem(f"--allow-origin {origin!r} is not an origin such as "
                                   "http://localhost:3000")
    return api_key


def checked_api_key(key: str) -> str:
    """A key a client can send: printable ASCII (HTTP headers carry nothing else: the openai package
    cannot even encode another), no spaces at its ends (header values lose them), not empty (an empty
    SPECLI_API_KEY would silently start a server without one)."""
    valid_text(key, "--api-key")
    if not key:
        raise UsageProblem("the API key is empty (is SPECLI_API_KEY set to nothing?): give a key, or "
                           "unset it to serve without one")
    if key != key.strip():
        raise UsageProblem("the API key begins or ends with a space, which an HTTP header cannot carry")
    if not all(" " <= c <= "~" for c in key):
        bad = next(c for c in key if not " " <= c <= "~")
        raise UsageProblem(f"the API key holds {bad!r}: HTTP headers carry printable ASCII only, so no "
                           "client could send it")
    return key
