"""Who may read what: sign-in through GitHub's OAuth web flow, and a person of one installation
cannot read another installation's scans through any page or API route."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import CLIENT_ID, sign_in
from tests.dashboard.seed import ACME, GLOBEX, SECRET, VISION

pytestmark = pytest.mark.service


def test_without_sign_in_pages_redirect_and_the_api_answers_401(service):
    client = service()
    page = client.get("/scans?state=done", follow_redirects=False)
    assert page.status_code == 303
    assert page.headers["location"] == "/auth/login?next=/scans%3Fstate%3Ddone"
    for path in ("/api/scans", "/api/overview", "/api/scans/1", "/api/repositories/1001", "/api/me"):
        assert client.get(path).status_code == 401, path


def test_sign_in_keeps_the_installations_github_lists(service, github):
    client = service()
    done = sign_in(client, github, "alice")
    assert done.headers["location"] == "/"
    me = client.get("/api/me").json()
    assert me == {"login": "alice", "local": False, "installation_ids": [ACME]}
    # the user token went to GitHub's API for the user and their installations
    assert ("GET", "/api/v3/user/installations") in github.requests


def routes_of_scan(scan_id: int, repo_id: int) -> list[str]:
    return [f"/api/scans/{scan_id}", f"/api/scans/{scan_id}/status", f"/scans/{scan_id}",
            f"/api/repositories/{repo_id}", f"/repos/{repo_id}"]


def test_a_user_of_one_installation_cannot_read_another_installations_scans(service, dash_pg):
    ids = dash_pg[1]
    alice, bob = service("alice"), service("bob")
    # positive control: bob reads globex's scan through every route
    for path in routes_of_scan(ids["secret"], SECRET):
        answer = bob.get(path)
        assert answer.status_code == 200, path
    assert "GLOBEX_SECRET" in bob.get(f"/scans/{ids['secret']}").text
    # alice gets 404 on the same routes: exactly as for a scan that does not exist
    for path in routes_of_scan(ids["secret"], SECRET):
        answer = alice.get(path)
        assert answer.status_code == 404, path
        assert "GLOBEX" not in answer.text
    assert alice.get("/api/scans/999999").status_code == 404
    # ... and lists, filters, polling and rule choices never show it
    assert alice.get("/api/scans", params={"repository": SECRET}).json()["total"] == 0
    assert alice.get("/api/scans", params={"installation": GLOBEX}).json()["total"] == 0
    assert alice.get("/api/scans", params={"rule": "globex-only-rule"}).json()["total"] == 0
    assert alice.get("/api/scans/states", params={"ids": f"{ids['secret']},{ids['vision_done']}"}).json() == {
        "states": {str(ids["vision_done"]): "done"}}
    assert "globex-only-rule" not in alice.get("/api/rules").json()
    every = alice.get("/api/scans", params={"per_page": 100}).json()
    assert every["total"] == 11 and {s["repository"] for s in every["items"]} == {"acme/vision", "acme/nlp"}
    overview = alice.get("/api/overview").json()
    assert [i["account_login"] for i in overview["installations"]] == ["acme"]
    assert {r["full_name"] for r in overview["repositories"]["items"]} == {"acme/nlp", "acme/vision"}
    assert overview["totals"]["scans"] == 11 and overview["totals"]["pull_requests_open"] == 1
    for page in ("/", "/scans", f"/scans?repository={SECRET}", f"/repos/{VISION}"):
        html = alice.get(page).text
        assert "globex" not in html.lower(), page
    # and bob, symmetrically, does not see acme
    assert bob.get(f"/api/scans/{ids['vision_done']}").status_code == 404
    assert bob.get("/api/scans").json()["total"] == 1


def test_a_person_without_installations_sees_nothing(service):
    carol = service("carol")
    assert carol.get("/api/scans").json()["total"] == 0
    assert carol.get("/api/overview").json()["totals"]["scans"] == 0
    assert carol.get("/api/repositories/1001").status_code == 404


def test_a_forged_or_foreign_session_cookie_is_refused(service):
    from itsdangerous import URLSafeTimedSerializer

    from app.dashboard.access import SESSION_COOKIE

    alice = service("alice")
    genuine = alice.cookies.get(SESSION_COOKIE)
    forged = URLSafeTimedSerializer("not-the-secret", salt="adopter-session").dumps(
        {"login": "mallory", "id": 1, "inst": [ACME, GLOBEX]})
    for value in (forged, genuine[:-3] + "abc", "garbage"):
        client = service()
        client.cookies.set(SESSION_COOKIE, value)
        assert client.get("/api/scans").status_code == 401
    client = service()
    client.cookies.set(SESSION_COOKIE, genuine)
    assert client.get("/api/me").json()["login"] == "alice"


def test_callback_refuses_a_foreign_state_and_a_bad_code(service, github):
    client = service()
    github.sign_in("alice")
    client.get("/auth/login", follow_redirects=False)  # sets the state cookie
    wrong_state = client.get("/auth/callback", params={"code": "x", "state": "not-mine"}, follow_redirects=False)
    assert wrong_state.status_code == 400
    start = client.get("/auth/login", follow_redirects=False)
    state = start.headers["location"].split("state=")[1].split("&")[0]
    bad_code = client.get("/auth/callback", params={"code": "forged", "state": state}, follow_redirects=False)
    assert bad_code.status_code == 401 and "incorrect or expired" in bad_code.text
    assert client.get("/api/scans").status_code == 401


def test_login_redirect_names_the_app_and_only_local_next_targets(service, github):
    client = service()
    start = client.get("/auth/login", params={"next": "https://evil.example/"}, follow_redirects=False)
    assert f"client_id={CLIENT_ID}" in start.headers["location"]
    github.sign_in("alice")
    import httpx

    back = httpx.get(start.headers["location"], follow_redirects=False).headers["location"]
    done = client.get(back.replace("http://127.0.0.1", ""), follow_redirects=False)
    assert done.headers["location"] == "/"  # not the other host
