"""Seeded history for the dashboard's tests and benchmark: two installations, three repositories,
scans in every interesting state, findings of three kinds, results, pull requests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from app.db.models import (
    ChangeSet,
    Finding,
    IgnoredIdentity,
    Installation,
    PullRequest,
    Repository,
    Result,
    Scan,
    ScanEvent,
    TaskRun,
)

ACME, GLOBEX = 101, 202
VISION, NLP, SECRET = 1001, 1002, 2001
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

DIFF = """\
--- a/model.py
+++ b/model.py
@@ -10,8 +10,5 @@ class Attention(nn.Module):
     def forward(self, x):
         q, k, v = self.qkv(x).chunk(3, dim=-1)
-        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
-        probs = scores.softmax(dim=-1)
-        out = probs @ v
+        out = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # fused kernel
         return self.proj(out)
"""
STATES_DONE = ["queued", "cloning", "scanning", "verifying", "benchmarking", "publishing", "done"]


def add_scan(session: Session, repo_id: int, at: datetime, *, state: str = "done", rules=("sdpa-attention",),
             speedup: float | None = 1.4, mem_before: int = 400 << 20, mem_after: int | None = 300 << 20,
             diff: str = DIFF, reason: str | None = None, sha: str = "0123456789abcdef0123456789abcdef01234567",
             config: dict | None = None, events: bool = True) -> Scan:
    scan = Scan(repository_id=repo_id, trigger="push", head_sha=sha, branch="main", state=state, reason=reason,
                diff=diff if state == "done" else None, config=config, created_at=at, updated_at=at,
                finished_at=at + timedelta(minutes=3) if state in ("done", "failed", "skipped") else None)
    session.add(scan)
    session.flush()
    if events:
        path = STATES_DONE if state == "done" else STATES_DONE[:STATES_DONE.index(state) + 1] \
            if state in STATES_DONE else ["queued", "cloning", "scanning", state]
        for i, s in enumerate(path):
            session.add(ScanEvent(scan_id=scan.id, state=s, at=at + timedelta(seconds=20 * i),
                                  reason=reason if s == state else None))
    for rule in rules:
        session.add(Finding(scan_id=scan.id, rule_id=rule, path="model.py", line=12, end_line=14, status="rewritten",
                            message="attention computed by hand: use scaled_dot_product_attention"))
    session.add(Finding(scan_id=scan.id, rule_id=rules[0] if rules else "sdpa-attention", path="other.py", line=40,
                        status="near-miss", message="attention-like pattern",
                        reason="attention probabilities are returned (escape)"))
    if state == "done" and speedup is not None:
        cs = ChangeSet(scan_id=scan.id, identity=f"adopter/{rules[0]}", rule_ids=list(rules), files={}, diff=diff,
                       code_digest="d" * 64, outcome="published")
        session.add(cs)
        session.flush()
        session.add(Result(change_set_id=cs.id, verified=True, max_abs_error=3.1e-7, device="cuda:0 (NVIDIA H200)",
                           before_s=0.0123, after_s=0.0123 / speedup, speedup=speedup, peak_mem_before=mem_before,
                           peak_mem_after=mem_after, versions={"torch": "2.13.0", "python": "3.11.9"},
                           details={"verify": {"max_abs_error": 3.1e-7}}))
    return scan


# What the engine pipeline stores for a scan whose rewrites ended in different states (the state names
# are the engine's; "not exercised" is one the dashboard has no special case for).
PER_REWRITE = {
    "per_rewrite": {
        "sdpa-attention": {"status": "passed", "passed": True, "max_abs_err": 3.1e-7, "max_rel_err": 2.2e-7,
                           "message": "", "cases": [{}] * 6},
        "layer-norm": {"status": "skipped", "passed": False, "max_abs_err": None, "max_rel_err": None,
                       "message": "no harness builds the module this rewrite changes", "cases": []},
        "gelu-tanh": {"status": "failed", "passed": False, "max_abs_err": 0.31, "max_rel_err": 0.12,
                      "message": "out.0: max abs error 0.31 > 1e-05", "cases": [{}] * 6},
        "rms-norm": {"status": "not exercised", "passed": False, "max_abs_err": 0.0, "max_rel_err": 0.0,
                     "message": "the rewritten code never ran under the harness's inputs", "cases": [{}] * 2},
    },
    "accepted": ["sdpa-attention"],
    "dropped": {"layer-norm": "skipped", "gelu-tanh": "failed: out.0", "rms-norm": "not exercised"},
    "combined": None, "passed": True,
}
BENCH_DETAILS = {"status": "ok", "speedup": {"median": 1.45, "ci95": [1.38, 1.52], "samples": 24},
                 "verdict": "faster", "repeats": 24, "stopped": "converged"}
OPTIONS = {"trigger": "push", "rules": "default", "verify": True, "bench": True, "device": "cuda", "min_gain": 0.05}


def record_change(session: Session, previous: Scan, latest: Scan) -> None:
    """Between two finished scans: one finding fixed, one new, the rest still open (one of them moved
    down two lines); the latest records its options and per-rewrite verification."""
    session.add(Finding(scan_id=previous.id, rule_id="gelu-tanh", path="model.py", line=50, status="rewritten",
                        message="hand-written GELU"))
    session.add(Finding(scan_id=latest.id, rule_id="fused-adamw", path="train.py", line=8, status="detected",
                        message="AdamW without fused=True"))
    for f in latest.findings:
        if f.status == "near-miss":
            f.line += 2
    latest.options = OPTIONS
    session.flush()
    result = latest.change_sets[0].result
    result.details = {"verify": PER_REWRITE, "bench": BENCH_DETAILS}


def seed(session: Session) -> dict:
    session.add_all([Installation(id=ACME, account_login="acme", account_type="Organization"),
                     Installation(id=GLOBEX, account_login="globex", account_type="Organization")])
    session.flush()
    session.add_all([
        Repository(id=VISION, installation_id=ACME, full_name="acme/vision", default_branch="main"),
        Repository(id=NLP, installation_id=ACME, full_name="acme/nlp", default_branch="main"),
        Repository(id=SECRET, installation_id=GLOBEX, full_name="globex/secret-model", default_branch="trunk",
                   private=True),
    ])
    session.flush()
    ids: dict = {}
    vision = [add_scan(session, VISION, T0 + timedelta(days=i), speedup=1.2 + 0.05 * i,
                       mem_after=(300 - 10 * i) << 20, config={"min_gain": 0.05, "max_open_pull_requests": 2})
              for i in range(6)]
    ids["vision_done"] = vision[-1].id
    record_change(session, vision[-2], vision[-1])
    failed = add_scan(session, VISION, T0 + timedelta(days=6, hours=1), state="failed",
                      reason="verify: outputs differ (max abs error 0.31 > 1e-5)\nTraceback: rewritten forward", )
    ids["vision_failed"] = failed.id
    session.add(TaskRun(task="verify_and_bench", scan_id=failed.id, outcome="failed",
                        started_at=T0 + timedelta(days=6, hours=1), duration_s=12.5))
    running = add_scan(session, VISION, T0 + timedelta(days=7), state="benchmarking")
    ids["vision_running"] = running.id
    nlp = [add_scan(session, NLP, T0 + timedelta(days=i, hours=5), rules=("fused-bias-gelu",), speedup=1.1)
           for i in range(3)]
    ids["nlp_done"] = nlp[-1].id
    secret = add_scan(session, SECRET, T0 + timedelta(days=2), rules=("globex-only-rule",), speedup=2.0,
                      diff=DIFF.replace("fused kernel", "GLOBEX_SECRET"))
    ids["secret"] = secret.id
    session.add_all([
        PullRequest(repository_id=VISION, identity="adopter/sdpa-attention", branch="adopter/sdpa-attention",
                    base_branch="main", number=7, title="Use scaled_dot_product_attention (1.45x faster)",
                    html_url="https://github.example/acme/vision/pull/7", state="open", last_scan_id=vision[-1].id),
        PullRequest(repository_id=NLP, identity="adopter/fused-bias-gelu", branch="adopter/fused-bias-gelu",
                    base_branch="main", number=3, title="Fuse bias and GeLU", state="merged",
                    html_url="https://github.example/acme/nlp/pull/3"),
        PullRequest(repository_id=VISION, identity="adopter/old-rule", branch="adopter/old-rule", base_branch="main",
                    number=2, title="An earlier proposal", state="closed",
                    html_url="https://github.example/acme/vision/pull/2"),
        PullRequest(repository_id=SECRET, identity="adopter/globex-only-rule", branch="adopter/globex-only-rule",
                    base_branch="trunk", number=1, title="GLOBEX pull request", state="open"),
        IgnoredIdentity(repository_id=VISION, identity="adopter/old-rule", code_digest="c" * 64,
                        reason="closed unmerged by a person (#2)"),
    ])
    session.commit()
    return ids
