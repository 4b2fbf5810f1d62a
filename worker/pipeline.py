"""The pipeline stages, one plain function each: clone, scan, verify+bench, publish.

Each stage runs only from the scan states it owns and ends by moving the scan on (see
``worker.state``); it returns True when the next stage must be enqueued. Stages that need the
repository's files call ``checkout`` which reuses this machine's clone of the scan or makes one,
so consecutive stages may run on different machines.

Every clone uses a token scoped to the one repository with read-only contents. The verify+bench
stage runs here, in the control worker, only as far as preparing the build: repository code is
built by a runner (``worker.runner``), which holds no secret; the runner's report comes back to
``record_results_stage``, which stores the figures and moves the scan on to publishing.

A scan that ends with nothing to propose (the scan stage found no live change set, or no measured
one was worth it) still goes through publishing where the installation grants code scanning: the
publish step uploads its findings (an empty list included), so GitHub closes the alerts this commit
no longer has. Without that permission it ends at once; publishing would send nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import shutil
from collections import defaultdict
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.db.models import (
    ChangeSet,
    Finding,
    IgnoredIdentity,
    PullRequest,
    PullRequestState,
    Repository,
    Result,
    Scan,
    ScanState,
)
from app.settings import get_settings
from worker import engine_adapter, github_client
from worker.build_messages import RUN_BUILDS, BuildJob, BuildReport, ChangeJob, ticket
from worker.celery_app import celery_app
from worker.clone import shallow_clone, tree_size
from worker.code_scanning import grants_code_scanning, upload_sarif
from worker.pr_body import title_for
from worker.publish import Proposal, digest_files, publish
from worker.repo_config import ConfigError, RepoConfig, load_config
from worker.state import finish, publish_lock, transition

log = logging.getLogger(__name__)

S = ScanState
# stage -> (states it runs from, states it moves the scan on to)
STAGES: dict[str, tuple[tuple[ScanState, ...], tuple[ScanState, ...]]] = {
    "clone": ((S.queued, S.cloning), (S.scanning,)),
    "scan": ((S.scanning,), (S.verifying, S.publishing)),  # publishing: nothing to propose, findings to upload
    "verify_bench": ((S.verifying, S.benchmarking), (S.publishing,)),
    "publish": ((S.publishing,), (S.done,)),
}


def next_stage(stage: str, state: ScanState) -> str | None:
    """The stage to run after ``stage`` left the scan in ``state``: the one that runs from it, when
    ``state`` is one ``stage`` moves scans on to (None: the scan ended, or waits for a runner)."""
    if state not in STAGES[stage][1]:
        return None
    return next((name for name, (owned, _) in STAGES.items() if state in owned), None)


# Finding statuses whose rewrite is in the engine's files (guarded: rewritten with a fallback path).
APPLIED = frozenset({"rewritten", "guarded"})


class Skip(Exception):
    """The scan cannot go on for a reason that is not an error (limits, suspended installation)."""


def scan_dir(scan_id: int) -> Path:
    return get_settings().work_dir / f"scan-{scan_id}"


def checkout(session: Session, scan: Scan) -> Path:
    """This machine's checkout of the scan's commit, cloned with a fresh installation token."""
    repository = session.get(Repository, scan.repository_id)
    settings = get_settings()
    installation_id = repository.installation_id
    clone_url = github_client.client_for(installation_id).get_repo(repository.full_name).clone_url
    result = shallow_clone(clone_url, scan_dir(scan.id) / "src",
                           token=github_client.repository_token(installation_id, repository.id),
                           ref=scan.branch or repository.default_branch, sha=scan.head_sha,
                           timeout=settings.clone_timeout_s)
    return result.path


def remove_checkout(scan_id: int) -> None:
    shutil.rmtree(scan_dir(scan_id), ignore_errors=True)


# --- clone ---------------------------------------------------------------------------------------

def clone_stage(session: Session, scan_id: int) -> bool:
    scan = session.get(Scan, scan_id)
    repository = session.get(Repository, scan.repository_id)
    installation = repository.installation
    if installation.deleted_at or installation.suspended_at:
        raise Skip(f"installation {installation.id} is {'deleted' if installation.deleted_at else 'suspended'}")
    if repository.removed_at:
        raise Skip(f"{repository.full_name} was removed from the installation")
    transition(session, scan_id, [S.queued], S.cloning)

    settings = get_settings()
    gh_repo = github_client.client_for(installation.id).get_repo(repository.full_name)
    repository.default_branch = gh_repo.default_branch
    if gh_repo.size and gh_repo.size > settings.max_repo_kib:
        raise Skip(f"repository is {gh_repo.size} KiB, over the limit of {settings.max_repo_kib} KiB")
    scan.branch = gh_repo.default_branch
    session.commit()

    result = shallow_clone(gh_repo.clone_url, scan_dir(scan_id) / "src",
                           token=github_client.repository_token(installation.id, repository.id), ref=scan.branch,
                           sha=scan.head_sha, timeout=settings.clone_timeout_s)
    scan.head_sha = result.sha
    session.commit()
    size = tree_size(result.path, stop_after_files=settings.max_files)
    if size.files > settings.max_files:
        raise Skip(f"repository has more than {settings.max_files} files")
    if size.bytes > settings.max_checkout_bytes:
        raise Skip(f"checkout is {size.bytes} bytes, over the limit of {settings.max_checkout_bytes}")

    try:
        config, source = load_config(result.path)
        config.selected_rules(source)  # unknown rule ids in rules/disable are a configuration error
    except ConfigError as exc:
        report_config_error(repository, scan.head_sha, exc)
        finish(session, scan_id, S.failed, f"invalid configuration: {exc}")
        return False
    scan.config = {"source": source, **config.to_dict()}
    session.commit()
    return transition(session, scan_id, [S.cloning], S.scanning)


def report_config_error(repository: Repository, sha: str, error: ConfigError) -> None:
    """A commit comment on the scanned commit, where the author of the file sees it."""
    body = (f"Adopter could not read `{error.path}`: {error}\n\n"
            "Nothing was scanned. Fix the file on the default branch and push again.")
    gh_repo = github_client.client_for(repository.installation_id).get_repo(repository.full_name)
    gh_repo.get_commit(sha).create_comment(body)


# --- scan ----------------------------------------------------------------------------------------

def _digest_originals(root: Path, paths) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        original = root / path
        h.update(path.encode() + b"\0" + (original.read_bytes() if original.is_file() else b"") + b"\0")
    return h.hexdigest()


# Files whose content cannot change what a model computes (docs, images).
NOT_CODE_SUFFIXES = frozenset({".md", ".rst", ".adoc", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".ipynb"})


def _inputs_digest(root: Path) -> str:
    """sha256 of the checkout's files that can affect verification (all but docs and images)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.relative_to(root).parts):
        if path.suffix.lower() in NOT_CODE_SUFFIXES:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _identity(rule_ids: list[str]) -> str:
    slug = "+".join(sorted(rule_ids)).replace("/", "-").replace(" ", "-")
    return f"adopter/{slug}"[:200]


def group_rewrites(root: Path, output: engine_adapter.ScanOutput, config: RepoConfig,
                   ) -> list[tuple[list[str], dict[str, str], str]]:
    """Rewritten findings grouped by rule: [(rule ids, files, diff)] — one pull request each.

    The engine returns the files of all rules together; with more than one rule (or a disabled
    one) each rule is scanned on its own to get its files. Where the engine cannot select a single
    rule, everything stays one group.
    """
    rules = sorted({f.rule_id for f in output.findings if f.status in APPLIED})
    wanted = [r for r in rules if r not in set(config.disable)]
    if not wanted or not output.files:
        return []
    if wanted == rules and len(rules) == 1:
        return [(rules, output.files, output.diff)]
    groups = []
    try:
        for rule in wanted:
            single = engine_adapter.scan(root, rules=rule, include=config.paths.include,
                                         exclude=config.paths.exclude)
            if single.files:
                groups.append(([rule], single.files, single.diff))
    except Exception as exc:  # the engine takes only rule-set names: keep the rules together
        log.info("per-rule scan not available (%s); one pull request for %s", exc, rules)
        if wanted != rules:
            return []  # cannot separate a disabled rule's rewrites from the others
        return [(rules, output.files, output.diff)]
    return groups


def scan_stage(session: Session, scan_id: int) -> bool:
    scan = session.get(Scan, scan_id)
    config = _scan_config(scan)
    root = checkout(session, scan)
    # the rules less the disabled ones, as the command line selects them (engine.config)
    rules = ",".join(rule.id for rule in config.selected_rules(scan.config.get("source") if scan.config else None))
    output = engine_adapter.scan(root, rules=rules, include=config.paths.include, exclude=config.paths.exclude)
    # A rerun replaces what an interrupted run stored.
    session.execute(delete(Finding).where(Finding.scan_id == scan_id))
    session.execute(delete(ChangeSet).where(ChangeSet.scan_id == scan_id))
    for f in output.findings:
        session.add(Finding(scan_id=scan_id, rule_id=f.rule_id, path=f.path, line=f.line, end_line=f.end_line,
                            status=f.status, reason=f.reason, message=f.message, class_name=f.class_name,
                            method_name=f.method_name, guard=f.guard, locations=f.locations,
                            related_locations=f.related_locations, fingerprint=f.fingerprint))
    scan.diff = output.diff
    # How the App runs this scan (the repository's own file is ``scan.config``), shown on the dashboard.
    scan.options = {"trigger": scan.trigger, "rules": config.rules, "include": config.paths.include,
                    "exclude": config.paths.exclude, "verify": True, "bench": True,
                    "device": get_settings().bench_device, "min_gain": config.min_gain,
                    "force_recreate": scan.force_recreate}
    live = 0
    inputs = _inputs_digest(root)
    for rule_ids, files, diff in group_rewrites(root, output, config):
        identity = _identity(rule_ids)
        change = ChangeSet(scan_id=scan_id, identity=identity, rule_ids=rule_ids, files=files, diff=diff,
                           code_digest=_digest_originals(root, files),
                           inputs_digest=hashlib.sha256(f"{inputs}:{digest_files(files)}".encode()).hexdigest())
        change.outcome = ignored_outcome(session, scan.repository_id, identity, change.code_digest)
        live += change.outcome is None
        session.add(change)
    session.commit()
    session.expire(scan)  # its findings and change sets: the ones just stored
    if live == 0:
        return _nothing_to_propose(session, scan, S.scanning)
    return transition(session, scan_id, [S.scanning], S.verifying, _finding_counts(scan))


def _finding_counts(scan: Scan) -> str:
    counts = defaultdict(int)
    for f in scan.findings:
        counts[f.status] += 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no findings"


def nothing_to_propose_reason(scan: Scan) -> str:
    """Why a scan proposes nothing: its findings by status, and each change set's outcome."""
    reason = f"nothing to propose ({_finding_counts(scan)})"
    if scan.change_sets:
        reason += ": " + "; ".join(f"{c.identity}: {c.outcome}" for c in scan.change_sets)
    return reason


def _nothing_to_propose(session: Session, scan: Scan, from_state: ScanState) -> bool:
    """End a scan that proposes nothing. Where the installation grants code scanning it goes to
    publishing, whose step (in the process with the App key) uploads the findings and ends it; True:
    publish next. Otherwise it is done now."""
    reason = nothing_to_propose_reason(scan)
    if grants_code_scanning(session.get(Repository, scan.repository_id).installation):
        return transition(session, scan.id, [from_state], S.publishing, reason)
    finish(session, scan.id, S.done, reason)
    return False


def ignored_outcome(session: Session, repository_id: int, identity: str, code_digest: str) -> str | None:
    """Why an identity is not proposed (a person rejected it and its code did not change), else None.

    Changed code ends the ignore: the rejected proposal is not what would be proposed now.
    """
    ignored = session.scalar(select(IgnoredIdentity).where(
        IgnoredIdentity.repository_id == repository_id, IgnoredIdentity.identity == identity))
    if ignored is None:
        return None
    if ignored.code_digest == code_digest:
        return f"not published: ignored ({ignored.reason}); waits for the code it touched to change"
    session.delete(ignored)
    return None


def _scan_config(scan: Scan) -> RepoConfig:
    """The configuration a scan ran with (stored with the scan; `source` names the file it came from)."""
    return RepoConfig.from_dict({k: v for k, v in (scan.config or {}).items() if k != "source"})


# --- verify + bench ------------------------------------------------------------------------------

def verify_bench_stage(session: Session, scan_id: int) -> bool:
    """Reuse earlier figures where the inputs are the same; send the rest to a runner.

    Returns True (publish next) only when nothing needs building; otherwise the scan waits in
    ``benchmarking`` for the runner's report (``record_results_stage``). Running again (a
    redelivered task) sends the job again; the report of a change set already measured is ignored.
    """
    scan = session.get(Scan, scan_id)
    pending = [c for c in scan.change_sets if c.outcome is None]
    for change in pending:
        if change.result is None:
            _reuse_result(session, scan, change)
    transition(session, scan_id, [S.verifying], S.benchmarking)
    to_build = [c for c in pending if c.result is None]
    if not to_build:
        return _decide(session, scan)
    repository = session.get(Repository, scan.repository_id)
    gh_repo = github_client.client_for(repository.installation_id).get_repo(repository.full_name)
    job = BuildJob(scan_id=scan_id, clone_url=gh_repo.clone_url,
                   token=github_client.repository_token(repository.installation_id, repository.id),
                   ref=scan.branch or repository.default_branch, sha=scan.head_sha,
                   changes=[ChangeJob(id=c.id, files=c.files) for c in to_build])
    job.ticket = ticket(get_settings().webhook_secret, scan_id, job.key)
    celery_app.send_task(RUN_BUILDS, args=[job.model_dump()])
    return False


class BadReport(ValueError):
    """A runner's report that does not fit the scan (unknown change sets, missing figures)."""


def record_results_stage(session: Session, report: BuildReport) -> bool:
    """Store a runner's figures (its report is untrusted: checked against the scan); True: publish next."""
    expected = ticket(get_settings().webhook_secret, report.scan_id, report.key)
    if not hmac.compare_digest(expected, report.ticket):
        # Not from a runner this scan's build went to: dropped, and the scan is left alone (a forged
        # message must not be able to end someone's scan either).
        log.warning("scan %s: a build report without a valid ticket was dropped", report.scan_id)
        return False
    scan = session.get(Scan, report.scan_id)
    if scan is None or scan.state != S.benchmarking:
        return False  # a duplicate report, or the scan ended meanwhile
    if report.error:
        finish(session, scan.id, S.failed, report.error)
        return False
    waiting = {c.id: c for c in scan.change_sets if c.outcome is None and c.result is None}
    by_id = {r.change_set_id: r for r in report.results}
    if set(by_id) - {c.id for c in scan.change_sets}:
        raise BadReport(f"the runner reported change sets not in scan {scan.id}: {sorted(set(by_id) - set(waiting))}")
    if set(waiting) - set(by_id):
        raise BadReport(f"the runner reported no result for change sets {sorted(set(waiting) - set(by_id))}")
    for change_id in waiting:
        r = by_id[change_id]
        details = {"verify": r.verify} if r.bench is None else {"verify": r.verify, "bench": r.bench}
        session.add(Result(change_set_id=change_id, verified=r.verified, max_abs_error=r.max_abs_error,
                           device=r.device, before_s=r.before_s, after_s=r.after_s, speedup=r.speedup,
                           peak_mem_before=r.peak_mem_before, peak_mem_after=r.peak_mem_after,
                           versions=r.versions or None, details=details))
    session.commit()
    return _decide(session, scan)


def _decide(session: Session, scan: Scan) -> bool:
    """Every measured change set worth publishing goes on; True when one does."""
    config = _scan_config(scan)
    pending = [c for c in scan.change_sets if c.outcome is None]
    for change in pending:
        session.refresh(change)
        details = change.result.details or {}
        worth_it, why = engine_adapter.gain_decision(details.get("verify"), details.get("bench"), config.min_gain)
        if not worth_it:
            change.outcome = f"not published: {why}"
    session.commit()
    if all(c.outcome is not None for c in scan.change_sets):
        return _nothing_to_propose(session, scan, S.benchmarking)
    return transition(session, scan.id, [S.benchmarking], S.publishing)


def _reuse_result(session: Session, scan: Scan, change: ChangeSet) -> None:
    """Copy the figures of an earlier change set with the same inputs, of the same repository (and
    so installation), measured on the device kind the runners of this deployment use (a docs-only
    push, a rescan of the same commit): running the same code again proves nothing new.

    Never across repositories or installations: equal content elsewhere is another tenant's code,
    its figures are not this repository's to see, and reuse must not tell one tenant what another
    holds.
    """
    device = "cuda" if get_settings().bench_queue == "gpu" else "cpu"
    repository = session.get(Repository, scan.repository_id)
    prior = session.scalar(
        select(Result).join(ChangeSet, Result.change_set_id == ChangeSet.id)
        .join(Scan, ChangeSet.scan_id == Scan.id).join(Repository, Scan.repository_id == Repository.id)
        .where(ChangeSet.inputs_digest == change.inputs_digest, ChangeSet.id != change.id,
               Scan.repository_id == repository.id, Repository.installation_id == repository.installation_id,
               Result.verified.is_(True), Result.speedup.is_not(None), Result.device.startswith(device))
        .order_by(Result.id.desc()).limit(1))
    if prior is None:
        return
    session.add(Result(
        change_set_id=change.id, verified=prior.verified, max_abs_error=prior.max_abs_error, device=prior.device,
        before_s=prior.before_s, after_s=prior.after_s, speedup=prior.speedup, peak_mem_before=prior.peak_mem_before,
        peak_mem_after=prior.peak_mem_after, versions=prior.versions,
        details={**(prior.details or {}), "reused_from_change_set": prior.change_set_id}))
    session.commit()
    session.refresh(change)


# --- publish -------------------------------------------------------------------------------------

def publish_stage(session: Session, scan_id: int) -> bool:
    """Publish every change set still live, upload the findings to code scanning (where granted),
    and end the scan. A scan with nothing to propose comes here only for the upload."""
    repository_id = session.get(Scan, scan_id).repository_id
    with publish_lock(session, repository_id):
        session.expire_all()
        scan = session.get(Scan, scan_id)
        if scan.state != S.publishing:  # another copy of this task got here first
            return False
        repository = session.get(Repository, repository_id)
        config = _scan_config(scan)
        gh_repo = github_client.client_for(repository.installation_id).get_repo(repository.full_name)
        if any(c.outcome is None for c in scan.change_sets):
            outcomes = _publish_changes(session, gh_repo, scan, repository, config)
        else:  # nothing to propose: here for the code-scanning upload
            outcomes = [nothing_to_propose_reason(scan)]
        scanning = upload_sarif(gh_repo, repository.installation, repository, scan)
        if scanning is not None:
            outcomes.append(scanning)
        return transition(session, scan_id, [S.publishing], S.done, "; ".join(outcomes))


def _publish_changes(session: Session, gh_repo, scan: Scan, repository: Repository, config: RepoConfig) -> list[str]:
    """Open or update the pull request of each live change set; one outcome line per change set."""
    outcomes = []
    for change in scan.change_sets:
        if change.outcome is None:
            change.outcome = (ignored_outcome(session, repository.id, change.identity, change.code_digest)
                              or _over_limit(session, repository.id, change.identity, config))
        if change.outcome is None:
            published = publish(session, gh_repo, repository.id, _proposal(scan, repository, change, config))
            change.outcome = (published.outcome if published.outcome.startswith("not published")
                              else f"published #{published.number} ({published.outcome})")
        outcomes.append(f"{change.identity}: {change.outcome}")
        session.commit()
    return outcomes


def _over_limit(session: Session, repository_id: int, identity: str, config: RepoConfig) -> str | None:
    open_others = session.scalar(select(func.count()).select_from(PullRequest).where(
        PullRequest.repository_id == repository_id, PullRequest.identity != identity,
        PullRequest.state == PullRequestState.open))
    if open_others >= config.max_open_pull_requests:
        return f"not published: {open_others} Adopter pull requests are open (maximum {config.max_open_pull_requests})"
    return None


def dashboard_scan_url(scan_id: int) -> str | None:
    """The scan's page on the dashboard, when the App publishes one (ADOPTER_DASHBOARD_URL)."""
    base = get_settings().dashboard_url
    return f"{base.rstrip('/')}/scans/{scan_id}" if base else None


def _proposal(scan: Scan, repository: Repository, change: ChangeSet, config: RepoConfig) -> Proposal:
    result = change.result
    sites = [f for f in scan.findings if f.status in APPLIED and f.rule_id in change.rule_ids
             and f.path in change.files]
    context = {
        "repository": repository.full_name,
        "identity": change.identity,
        "rule_ids": change.rule_ids,
        "sites": [{"rule_id": f.rule_id, "path": f.path, "line": f.line, "end_line": f.end_line,
                   "message": f.message} for f in sites],
        "diff": change.diff,
        "verification": (result.details or {}).get("verify"),
        "bench": (result.details or {}).get("bench"),
        "min_gain": config.min_gain,
        "result": {
            "verified": result.verified, "max_abs_error": result.max_abs_error, "device": result.device,
            "before_s": result.before_s, "after_s": result.after_s, "speedup": result.speedup,
            "peak_mem_before": result.peak_mem_before, "peak_mem_after": result.peak_mem_after,
            "versions": result.versions or {},
        },
        "branch": change.identity,
        "base_sha": scan.head_sha,
        "rules": config.rules,
        "mention": get_settings().bot_mention,
        "scan_id": scan.id,
        "config": {"repository": {k: v for k, v in (scan.config or {}).items() if k != "source"},
                   "source": (scan.config or {}).get("source"), "options": scan.options},
        "dashboard_url": dashboard_scan_url(scan.id),
    }
    return Proposal(identity=change.identity, branch=change.identity, base_branch=scan.branch,
                    base_sha=scan.head_sha,
                    title=title_for(change.rule_ids), body=engine_adapter.render_pr_body(context), files=change.files,
                    code_digest=change.code_digest, scan_id=scan.id, force=scan.force_recreate)


STAGE_FUNCTIONS = {
    "clone": clone_stage,
    "scan": scan_stage,
    "verify_bench": verify_bench_stage,
    "publish": publish_stage,
}
