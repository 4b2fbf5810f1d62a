"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright) against the real
service app served by uvicorn, over the seeded Postgres database, signing in through the fake GitHub.

Each page's screenshot is written to ``test-artifacts/dashboard/`` (git-ignored).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.dashboard.conftest import ROOT, service_env
from tests.dashboard.seed import VISION

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "test-artifacts" / "dashboard"

pytestmark = [
    pytest.mark.browser, pytest.mark.service,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install chromium)"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(dash_pg, github, tmp_path_factory):
    port = free_port()
    env = {**os.environ, **service_env(dash_pg[0], github)}
    log = tmp_path_factory.mktemp("uvicorn") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1",
                                    "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/static/dashboard.css").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        process.kill()
        pytest.fail(f"uvicorn did not start: {log.read_text()}")
    yield base
    process.terminate()
    process.wait(10)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, server, github):
    SHOTS.mkdir(parents=True, exist_ok=True)
    github.sign_in("root")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{server}/")  # -> /auth/login -> fake GitHub authorize -> /auth/callback -> /
    yield page
    context.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_overview_lists_repositories_and_a_click_reaches_a_scan(page, server, dash_pg):
    from playwright.sync_api import expect

    assert page.url == f"{server}/"
    table = page.locator("#repositories")
    for name in ("acme/vision", "acme/nlp", "globex/secret-model"):
        expect(table.get_by_role("link", name=name)).to_be_visible()
    expect(page.locator("#total-scans")).to_have_text("12")
    shot(page, "overview")

    table.get_by_role("link", name="acme/vision").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("acme/vision")
    expect(page.locator("#chart-speedup-title")).to_have_text("Measured speedup per scan of acme/vision")
    expect(page.locator("#chart-speedup-desc")).to_contain_text("6 measurements")
    shot(page, "repository")

    done = dash_pg[1]["vision_done"]
    page.get_by_role("link", name=f"#{done}", exact=True).first.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"Scan #{done}")
    diff = page.locator("pre.diff")
    expect(diff).to_be_visible()
    expect(diff.locator(".dl.add")).to_contain_text("scaled_dot_product_attention")
    expect(diff.locator(".dl.del").first).to_contain_text("scores")
    bench = page.locator("table.benchmark")
    expect(bench).to_be_visible()
    expect(bench).to_contain_text("1.45×")
    expect(bench).to_contain_text("400.0 MiB")
    expect(page.get_by_role("link", name="pull request #7")).to_be_visible()
    shot(page, "scan")

    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1, f"the page scrolls sideways on a narrow screen by {overflow}px"
    shot(page, "scan-narrow")


def test_failed_scan_shows_its_log(page, server, dash_pg):
    from playwright.sync_api import expect

    page.goto(f"{server}/scans/{dash_pg[1]['vision_failed']}")
    expect(page.locator("pre.log").first).to_contain_text("outputs differ")
    expect(page.get_by_role("cell", name="verify_and_bench")).to_be_visible()
    shot(page, "scan-failed")


def test_a_running_scans_state_changes_on_screen(page, server, dash_pg):
    from playwright.sync_api import expect
    from sqlalchemy import create_engine, delete
    from sqlalchemy.orm import Session

    from app.db.models import ChangeSet, Result, Scan, ScanEvent
    from tests.dashboard.seed import add_scan

    engine = create_engine(dash_pg[0])
    with Session(engine) as session:
        scan = add_scan(session, VISION, datetime.now(UTC), state="verifying")
        session.commit()
        scan_id = scan.id
    try:
        page.goto(f"{server}/scans?repository={VISION}&state=verifying")
        row_badge = page.locator(f"td [data-scan-id='{scan_id}']")
        expect(row_badge).to_have_text("verifying")
        page.goto(f"{server}/scans/{scan_id}")
        state = page.locator("#scan-state .state")
        expect(state).to_have_text("verifying")
        shot(page, "scan-running")
        with Session(engine) as session:
            row = session.get(Scan, scan_id)
            row.state = "benchmarking"
            session.add(ScanEvent(scan_id=scan_id, state="benchmarking", at=datetime.now(UTC)))
            session.commit()
        expect(state).to_have_text("benchmarking", timeout=10_000)  # no reload: polled
        expect(page.locator("#timeline li").last).to_contain_text("benchmarking")
        with Session(engine) as session:
            row = session.get(Scan, scan_id)
            row.state, row.finished_at = "done", datetime.now(UTC) + timedelta(seconds=1)
            change = ChangeSet(scan_id=scan_id, identity="adopter/sdpa-attention", rule_ids=["sdpa-attention"],
                               files={}, diff="", code_digest="e" * 64)
            session.add(change)
            session.flush()
            session.add(Result(change_set_id=change.id, verified=True, speedup=1.61, before_s=0.02, after_s=0.0124,
                               peak_mem_before=1 << 30, peak_mem_after=3 << 28, device="cpu"))
            session.add(ScanEvent(scan_id=scan_id, state="done", at=datetime.now(UTC)))
            session.commit()
        expect(page.locator("#scan-state .state")).to_have_text("done", timeout=10_000)
        expect(page.locator("table.benchmark")).to_contain_text("1.61×", timeout=10_000)  # reloaded with results
        shot(page, "scan-finished")
    finally:
        with Session(engine) as session:
            session.execute(delete(Scan).where(Scan.id == scan_id))  # the database cascades to its rows
            session.commit()
        engine.dispose()


def test_filters_narrow_the_list(page, server):
    from playwright.sync_api import expect

    page.goto(f"{server}/scans")
    rows = page.locator("table.scans tbody tr")
    expect(rows).to_have_count(12)
    page.get_by_label("State").select_option("failed")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("failed")
    assert "state=failed" in page.url
    page.get_by_label("State").select_option("")
    page.get_by_label("Rule").select_option("fused-bias-gelu")
    page.get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(3)
    expect(page.locator("table.scans")).not_to_contain_text("acme/vision")
    shot(page, "scans-filtered")


def test_keyboard_reaches_the_content_first(page, server):
    page.goto(f"{server}/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"


def test_repository_shows_what_changed_since_the_previous_scan_and_the_rule_trend(page, server):
    from playwright.sync_api import expect

    page.goto(f"{server}/repos/{VISION}")
    expect(page.locator("#changes-new")).to_have_text("1")
    expect(page.locator("#changes-fixed")).to_have_text("1")
    expect(page.locator("#changes-open")).to_have_text("2")
    expect(page.locator("details.changes-new")).to_contain_text("fused-adamw")
    expect(page.locator("details.changes-fixed")).to_contain_text("gelu-tanh")
    trend = page.locator("table.rule-trend")
    gelu = trend.locator("tr", has=page.locator("th code", has_text="gelu-tanh"))
    expect(gelu.locator("td.change")).to_have_text("-1")
    expect(gelu.locator("svg.sparkline")).to_have_attribute("aria-label", "gelu-tanh: 0, 0, 0, 0, 1, 0")
    box = trend.locator("svg.sparkline").first.bounding_box()
    assert box and box["width"] > 50 and box["height"] > 10  # drawn, not collapsed
    shot(page, "repository-changes")
    page.locator("section[aria-labelledby=changes-h]").screenshot(path=str(SHOTS / "repository-changes-section.png"))
    trend.screenshot(path=str(SHOTS / "repository-rule-trend.png"))


def test_scan_shows_each_rewrites_state_errors_options_and_interval(page, server, dash_pg):
    from playwright.sync_api import expect

    page.goto(f"{server}/scans/{dash_pg[1]['vision_done']}")
    table = page.locator("table.verification")
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(4)
    for name, state in (("sdpa-attention", "passed"), ("layer-norm", "skipped"), ("gelu-tanh", "failed"),
                        ("rms-norm", "not exercised")):
        expect(rows.filter(has=page.locator("th", has_text=name)).locator(".vstate")).to_have_text(state)
    expect(table.locator("thead")).to_contain_text("max abs error")
    expect(rows.filter(has=page.locator("th", has_text="gelu-tanh"))).to_contain_text("0.31")
    expect(page.locator("[data-verification]")).to_have_text("1 of 4 passed")
    expect(page.locator("table.benchmark")).to_contain_text("1.38× to 1.52×")
    expect(page.locator("#scan-options")).to_contain_text("cuda")
    expect(page.locator("#timeline li").nth(1)).to_contain_text("(+20.0 s)")
    colors = page.evaluate("""() => [...document.querySelectorAll('table.verification .vstate')]
                               .map(e => getComputedStyle(e).backgroundColor)""")
    assert colors[0] != colors[2]  # passed and failed do not look alike
    expect(page.locator("section[aria-labelledby=findings-h]")).to_contain_text("detected (1)")  # any status shows
    shot(page, "scan-verification")
