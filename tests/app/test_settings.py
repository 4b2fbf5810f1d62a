from __future__ import annotations

import pytest

from app.settings import Settings, SettingsError, get_settings

pytestmark = pytest.mark.usefixtures("no_adopter_env")


def test_production_without_secrets_stops_with_the_names_to_set(monkeypatch):
    monkeypatch.setenv("ADOPTER_ENV", "production")
    with pytest.raises(SettingsError) as error:
        get_settings()
    message = str(error.value)
    for name in ("ADOPTER_WEBHOOK_SECRET", "ADOPTER_GITHUB_APP_ID", "ADOPTER_GITHUB_PRIVATE_KEY"):
        assert name in message


def test_development_needs_the_webhook_secret_but_not_the_key(monkeypatch):
    with pytest.raises(SettingsError, match="ADOPTER_WEBHOOK_SECRET"):
        get_settings()
    monkeypatch.setenv("ADOPTER_WEBHOOK_SECRET", "s3cret")
    settings = get_settings()
    assert settings.env == "development" and settings.private_key() is None
    assert settings.github_api_url == "https://api.github.com"
    assert settings.database_url.startswith("sqlite:///")


def test_private_key_from_a_file_and_a_missing_file(tmp_path, monkeypatch):
    key = tmp_path / "app.pem"
    key.write_text("-----BEGIN PRIVATE KEY-----\n...")
    settings = Settings(webhook_secret="s", env="production", github_app_id="1", github_private_key_path=key)
    assert settings.private_key().startswith("-----BEGIN")
    monkeypatch.setenv("ADOPTER_WEBHOOK_SECRET", "s")
    monkeypatch.setenv("ADOPTER_GITHUB_PRIVATE_KEY_PATH", str(tmp_path / "absent.pem"))
    with pytest.raises(SettingsError, match="no file at"):
        get_settings()


def test_the_app_refuses_to_start_without_settings():
    from fastapi.testclient import TestClient

    from app.main import create_app

    with pytest.raises(SettingsError, match="ADOPTER_WEBHOOK_SECRET"):
        with TestClient(create_app()):
            pass
