"""Hostile repositories against the real sandbox: these tests require bubblewrap (``.ci/run``
installs it) and fail, rather than skip, where it does not work, since without it they would prove
nothing."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def require_sandbox(monkeypatch):
    monkeypatch.setenv("ADOPTER_SANDBOX", "require")
    from engine.verify.sandbox import sandbox_status

    works, why = sandbox_status()
    if not works:
        pytest.fail(f"the sandbox does not work here ({why}); install bubblewrap (see docs/deploy.md)")
