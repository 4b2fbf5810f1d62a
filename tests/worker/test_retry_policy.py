from __future__ import annotations

import time

import requests
from github import GithubException

from worker.clone import CloneError
from worker.tasks import retry_delay


def test_network_errors_and_server_errors_are_retried_with_growing_backoff():
    assert retry_delay(requests.exceptions.ConnectionError("reset"), 0) == 5
    assert retry_delay(requests.exceptions.ConnectionError("reset"), 3) == 40
    assert retry_delay(GithubException(502, {"message": "bad gateway"}, {}), 1) == 10
    assert retry_delay(requests.exceptions.Timeout(), 20) == 600  # capped


def test_rate_limits_wait_as_long_as_github_says():
    secondary = GithubException(403, {"message": "secondary rate limit"}, {"Retry-After": "37"})
    assert retry_delay(secondary, 0) == 37
    reset = int(time.time()) + 120
    primary = GithubException(403, {"message": "API rate limit exceeded"},
                              {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)})
    assert 100 < retry_delay(primary, 0) <= 120
    assert retry_delay(GithubException(429, {}, {"retry-after": "3"}), 5) == 3


def test_client_errors_are_not_retried():
    assert retry_delay(GithubException(404, {"message": "Not Found"}, {}), 0) is None
    assert retry_delay(GithubException(403, {"message": "Resource not accessible"}, {}), 0) is None
    assert retry_delay(GithubException(422, {"message": "Validation Failed"}, {}), 0) is None
    assert retry_delay(ValueError("a bug"), 0) is None


def test_clone_errors_are_retried_only_when_transient():
    assert retry_delay(CloneError("Could not resolve host", transient=True), 1) == 10
    assert retry_delay(CloneError("repository not found", transient=False), 1) is None
