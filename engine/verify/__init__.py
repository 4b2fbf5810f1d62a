"""Differential verification of rewrites: original and rewritten model, same weights and inputs,
outputs and gradients compared; repository code runs only in sandboxed child processes."""

from engine.verify.result import Candidate, CandidatesResult, CaseResult, VerifyResult
from engine.verify.targets import ConfigError, HarnessTarget, HFTarget, Target, discover_targets
from engine.verify.verifier import Verifier, VerifyConfig, verify, verify_candidates

__all__ = [
    "Candidate",
    "CandidatesResult",
    "CaseResult",
    "ConfigError",
    "HFTarget",
    "HarnessTarget",
    "Target",
    "Verifier",
    "VerifyConfig",
    "VerifyResult",
    "discover_targets",
    "verify",
    "verify_candidates",
]
