"""A pull request links to its scan on the dashboard only where the App publishes one."""

from __future__ import annotations

import pytest


@pytest.fixture
def settings_env(monkeypatch):
    from app.settings import get_settings

    monkeypatch.setenv("ADOPTER_WEBHOOK_SECRET", "x")
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_scan_url_follows_the_setting(settings_env):
    from app.settings import get_settings
    from worker.pipeline import dashboard_scan_url

    settings_env.delenv("ADOPTER_DASHBOARD_URL", raising=False)
    assert dashboard_scan_url(7) is None
    settings_env.setenv("ADOPTER_DASHBOARD_URL", "https://adopter.example.com/")
    get_settings.cache_clear()
    assert dashboard_scan_url(7) == "https://adopter.example.com/scans/7"
