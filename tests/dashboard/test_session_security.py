"""Dashboard sessions follow GitHub (re-checked with a short cache, revocable), sign-out is
same-origin only, links go only to https, and every response forbids framing and foreign scripts."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from app.dashboard.access import SESSION_COOKIE
from app.dashboard.links import https_url
from tests.dashboard.conftest import PEOPLE
from tests.dashboard.seed import ACME, VISION

pytestmark = pytest.mark.service
SITE = "http://127.0.0.1"


@pytest.fixture
def recheck_now(monkeypatch):
    """Access re-checked with GitHub at every request (no cache)."""
    from app.dashboard.config import service_config

    monkeypatch.setenv("ADOPTER_SESSION_RECHECK_S", "0")
    service_config.cache_clear()


@pytest.fixture
def restore_people(github):
    yield
    for login, ids in PEOPLE.items():
        github.users[login]["installations"] = set(ids)


def test_every_response_forbids_framing_and_foreign_scripts(service):
    alice = service("alice")
    for path in ("/", "/api/me", "/healthz", "/auth/login"):
        answer = alice.get(path, follow_redirects=False)
        policy = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy, path
        assert "'unsafe-inline'" not in policy
        assert answer.headers["x-frame-options"] == "DENY", path
        assert answer.headers["x-content-type-options"] == "nosniff"


def test_losing_access_on_github_ends_it_here_after_the_recheck(service, github, recheck_now, restore_people):
    alice = service("alice")
    assert alice.get("/api/me").json()["installation_ids"] == [ACME]
    assert alice.get(f"/api/repositories/{VISION}").status_code == 200
    github.users["alice"]["installations"] = set()
    assert alice.get("/api/me").json()["installation_ids"] == []
    assert alice.get(f"/api/repositories/{VISION}").status_code == 404


def test_what_github_said_is_trusted_for_the_short_cache_only(service, github, restore_people):
    alice = service("alice")  # default: re-checked every 60 s
    asked = github.requests.count(("GET", "/api/v3/user/installations"))
    github.users["alice"]["installations"] = set()
    assert alice.get("/api/me").json()["installation_ids"] == [ACME]  # within the minute
    assert github.requests.count(("GET", "/api/v3/user/installations")) == asked


def test_a_token_revoked_on_github_ends_the_session(service, github, recheck_now):
    alice = service("alice")
    assert alice.get("/api/me").status_code == 200
    for token in [t for t, login in github.user_tokens.items() if login == "alice"]:
        del github.user_tokens[token]
    assert alice.get("/api/me").status_code == 401
    assert alice.get("/", follow_redirects=False).status_code in (302, 303, 307)


def test_sign_out_is_same_origin_only_and_revokes_every_copy_of_the_session(service, github):
    alice = service("alice")
    cookie = alice.cookies.get(SESSION_COOKIE)
    tokens_before = {t for t, login in github.user_tokens.items() if login == "alice"}
    for headers in ({"Origin": "https://evil.example"}, {"Referer": "https://evil.example/page"}, {},
                    {"Origin": "null"}):
        refused = alice.post("/auth/logout", headers=headers, follow_redirects=False)
        assert refused.status_code == 403, headers
        assert alice.get("/api/me").status_code == 200  # still signed in
    done = alice.post("/auth/logout", headers={"Origin": SITE}, follow_redirects=False)
    assert done.status_code == 303
    copy = service()
    copy.cookies.set(SESSION_COOKIE, cookie)
    assert copy.get("/api/me").status_code == 401  # the copied cookie is dead too
    assert not tokens_before & set(github.user_tokens)  # and the token was revoked at GitHub
    # A fresh sign-in works again.
    assert service("alice").get("/api/me").status_code == 200


@pytest.mark.parametrize(("url", "kept"), [
    ("https://github.com/acme/vision/pull/7", True),
    ("http://github.com/acme/vision/pull/7", False),
    ("javascript:alert(document.cookie)", False),
    ("JAVASCRIPT:alert(1)", False),
    ("data:text/html,<script>alert(1)</script>", False),
    ("https:///no-host", False),
    ("https://github.com/a\nb", False),
    ("//evil.example/x", False),
    (None, False),
])
def test_only_https_urls_become_links(url, kept):
    assert https_url(url) == (url if kept else None)


def test_a_stored_javascript_url_is_not_rendered_as_a_link(service, dash_pg):
    engine = create_engine(dash_pg[0])
    with engine.begin() as connection:
        old = connection.execute(text("SELECT html_url FROM pull_requests WHERE number = 7 AND repository_id = :r"),
                                 {"r": VISION}).scalar_one()
        connection.execute(text("UPDATE pull_requests SET html_url = 'javascript:alert(1)' WHERE number = 7 "
                                "AND repository_id = :r"), {"r": VISION})
    try:
        page = service("alice").get(f"/repos/{VISION}").text
        assert "javascript:" not in page
        assert "Use scaled_dot_product_attention" in page  # the title is still shown, as text
    finally:
        with engine.begin() as connection:
            connection.execute(text("UPDATE pull_requests SET html_url = :u WHERE number = 7 AND repository_id = :r"),
                               {"u": old, "r": VISION})
        engine.dispose()
