"""engine.sarif: findings as SARIF 2.1.0, validated against the official JSON schema."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest

from engine.dsl.ir import Pos
from engine.extract import extract_source
from engine.match import Finding, find, parse_rule
from engine.report.links import rule_help_url
from engine.sarif import FINGERPRINT_KEY, to_sarif
from engine.scan import select_rules

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "sarif" / "sarif-2.1.0-rtm.5.json").read_text())

MODEL = '''\
from torch import nn
import torch.nn.functional as F

class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.h = h

    def _split_heads(self, t):
        t = t.view(t.size()[:-1] + (self.h, -1))
        return t.permute(0, 2, 1, 3)

    def forward(self, x):
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        s = F.softmax(q @ k.transpose(-1, -2), dim=-1)
        t = F.softmax(s, dim=1)
        return s @ v + t
'''
REL = "pkg/model.py"


def _write(root: Path, text: str = MODEL) -> None:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / REL).write_text(text, encoding="utf-8")


def _scan(root: Path, text: str = MODEL):
    rules = select_rules("paper")
    findings = find([extract_source(text, REL, "pkg.model")], rules)
    return findings, rules


def _absolute_uri(value: str) -> bool:
    parts = urlsplit(value)
    return bool(parts.scheme) and (bool(parts.netloc) or bool(parts.path))


def _uri_reference(value: str) -> bool:
    return " " not in value and "\\" not in value


def _validate(log: dict, *, formats: bool) -> None:
    checker = None
    if formats:
        checker = jsonschema.FormatChecker(formats=())
        checker.checks("uri")(_absolute_uri)
        checker.checks("uri-reference")(_uri_reference)
    jsonschema.Draft4Validator(SCHEMA, format_checker=checker).validate(log)


@pytest.fixture
def scanned(tmp_path):
    _write(tmp_path)
    findings, rules = _scan(tmp_path)
    return tmp_path, findings, rules


def test_schema_itself_is_the_sarif_2_1_0_schema():
    jsonschema.Draft4Validator.check_schema(SCHEMA)
    assert SCHEMA["properties"]["version"]["enum"] == ["2.1.0"]
    assert "result" in SCHEMA["definitions"] and "reportingDescriptor" in SCHEMA["definitions"]


def test_log_validates_against_the_schema(scanned):
    root, findings, rules = scanned
    assert {f.status for f in findings} == {"detected", "near-miss"}
    log = to_sarif(findings, rules, root)
    _validate(log, formats=False)
    # with an absolute help location, also every `uri` / `uri-reference` format
    _validate(to_sarif(findings, rules, root, help_base="https://example.org/adopter/docs/rules.md"), formats=True)
    assert json.loads(json.dumps(log)) == log  # JSON-ready


def test_schema_rejects_a_broken_log(scanned):
    root, findings, rules = scanned
    log = to_sarif(findings, rules, root)
    log["runs"][0]["results"][0]["level"] = "severe"
    with pytest.raises(jsonschema.ValidationError):
        _validate(log, formats=False)


def test_driver_and_rules(scanned):
    root, findings, rules = scanned
    driver = to_sarif(findings, rules, root)["runs"][0]["tool"]["driver"]
    assert driver["name"] == "adopter"
    assert driver["version"] and driver["version"][0].isdigit()
    assert [r["id"] for r in driver["rules"]] == [r.id for r in rules]
    rule4 = next(r for r in driver["rules"] if r["id"] == "paper/rule_4")
    assert rule4["shortDescription"]["text"] == next(r.summary for r in rules if r.id == "paper/rule_4")
    assert rule4["helpUri"] == rule_help_url("paper/rule_4")  # absolute: it is read on the user's repository
    assert rule4["properties"]["fix"] == "detect-only"
    assert rule4["properties"]["kernel"] == "epoi.ops.torchscript_ops.FusedSoftmax"


def test_one_result_per_finding_with_status_level_and_reason(scanned):
    root, findings, rules = scanned
    log = to_sarif(findings, rules, root)
    results = log["runs"][0]["results"]
    assert len(results) == len(findings)
    ids = [r.id for r in rules]
    for finding, result in zip(findings, results, strict=True):
        assert result["ruleId"] == finding.rule_id
        assert ids[result["ruleIndex"]] == finding.rule_id
        assert result["properties"]["status"] == finding.status
        assert result["level"] == ("note" if finding.status == "near-miss" else "warning")
    near = next(r for r in results if r["properties"]["status"] == "near-miss")
    assert near["properties"]["reason"] == "dim=1 of a 4-D tensor is not provably the last dimension"
    assert "dim=1" in near["message"]["text"]
    assert all("reason" not in r["properties"] for r in results if r["properties"]["status"] != "near-miss")


def test_regions_cover_every_matched_statement(scanned):
    root, findings, rules = scanned
    results = to_sarif(findings, rules, root)["runs"][0]["results"]
    for finding, result in zip(findings, results, strict=True):
        regions = {(loc["physicalLocation"]["artifactLocation"]["uri"],
                    loc["physicalLocation"]["region"]["startLine"], loc["physicalLocation"]["region"]["startColumn"],
                    loc["physicalLocation"]["region"]["endLine"], loc["physicalLocation"]["region"]["endColumn"])
                   for loc in result["locations"]}
        expected = {(p.file, p.line, p.col + 1, p.end_line, p.end_col + 1) for p in finding.locations}
        assert regions == expected
        assert len(result["locations"]) == len(regions)  # one location per distinct position
        assert all(loc["physicalLocation"]["artifactLocation"]["uriBaseId"] == "SRCROOT" for loc in result["locations"])
    rule9 = next(r for r in results if r["ruleId"] == "paper/rule_9")
    lines = {loc["physicalLocation"]["region"]["startLine"] for loc in rule9["locations"]}
    assert lines == {13, 17, 18, 19}  # the helper's view and the three projections
    assert rule9["locations"][0]["physicalLocation"]["region"]["startLine"] == 13  # topmost first
    related = rule9["relatedLocations"]
    assert [r["physicalLocation"]["region"]["startLine"] for r in related] == [17, 18, 19]
    assert [r["id"] for r in related] == [1, 2, 3]


def test_region_columns_count_code_points_not_bytes(tmp_path):
    text = MODEL.replace("        s = F.softmax(", "        é = 1; s = F.softmax(")
    _write(tmp_path, text)
    findings, rules = _scan(tmp_path, text)
    finding = next(f for f in findings if f.rule_id == "paper/rule_4" and f.status == "detected")
    byte_col = finding.locations[0].col
    line = text.splitlines()[finding.locations[0].line - 1]
    assert line.encode()[byte_col:].startswith(b"F.softmax")
    log = to_sarif([finding], rules, tmp_path)
    assert log["runs"][0]["columnKind"] == "unicodeCodePoints"
    region = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region["startColumn"] == line.index("F.softmax") + 1 == byte_col  # é is two bytes, one code point


def _fingerprints(root: Path, text: str) -> dict[tuple[str, str], str]:
    _write(root, text)
    findings, rules = _scan(root, text)
    results = to_sarif(findings, rules, root)["runs"][0]["results"]
    return {(r["ruleId"], r["properties"]["status"]): r["partialFingerprints"][FINGERPRINT_KEY] for r in results}


def test_fingerprints_survive_moves_and_reindentation_but_not_code_changes(tmp_path):
    before = _fingerprints(tmp_path, MODEL)
    moved = MODEL.replace("import torch.nn.functional as F\n", "import torch.nn.functional as F\n\n\n# a comment\n")
    assert _fingerprints(tmp_path, moved) == before
    respaced = MODEL.replace("dim=-1)", "dim=-1 )")
    assert _fingerprints(tmp_path, respaced) == before
    changed = _fingerprints(tmp_path, MODEL.replace("q @ k.transpose(-1, -2)", "k @ q.transpose(-1, -2)"))
    assert changed[("paper/rule_4", "detected")] != before[("paper/rule_4", "detected")]
    assert changed[("paper/rule_9", "detected")] == before[("paper/rule_9", "detected")]
    assert len(set(before.values())) == len(before)


def test_identical_matches_get_distinct_fingerprints(tmp_path):
    text = MODEL + "\n\n" + MODEL[MODEL.index("class Attention"):].replace("class Attention", "class Attention2")
    _write(tmp_path, text)
    findings, rules = _scan(tmp_path, text)
    results = to_sarif(findings, rules, tmp_path)["runs"][0]["results"]
    prints = [r["partialFingerprints"][FINGERPRINT_KEY] for r in results
              if r["ruleId"] == "paper/rule_4" and r["properties"]["status"] == "detected"]
    assert len(prints) == 2 and len(set(prints)) == 2
    assert {p.rsplit(":", 1)[1] for p in prints} == {"1", "2"}
    assert len({p.rsplit(":", 1)[0] for p in prints}) == 1


def test_guarded_finding_carries_its_guard(tmp_path):
    _write(tmp_path)
    rule = parse_rule('rule demo\nsummary "Demo"\nkernel "k"\nguard\nrewrite "$x"\nmatch { $o = softmax($x, dim=-1) }')
    finding = Finding("demo", "guarded", REL, "Attention", "forward", 20, 20, "Demo", None,
                      [Pos(REL, 20, 12, 20, 54)], [], "output_attentions")
    log = to_sarif([finding], [rule], tmp_path)
    _validate(log, formats=False)
    result = log["runs"][0]["results"][0]
    assert result["properties"] == {"status": "guarded", "class": "Attention", "method": "forward",
                                    "guard": "output_attentions"}
    assert result["level"] == "warning"
    assert "output_attentions" in result["message"]["text"]
    assert log["runs"][0]["tool"]["driver"]["rules"][0]["properties"]["fix"] == "rewrite-guarded"


def test_paths_are_relative_to_the_scanned_folder(tmp_path):
    _write(tmp_path)
    finding = Finding("paper/rule_4", "detected", str(tmp_path / REL), "A", "forward", 20, 20, "m", None,
                      [Pos(str(tmp_path / REL), 20, 12, 20, 54)])
    log = to_sarif([finding], select_rules("paper"), tmp_path)
    run = log["runs"][0]
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == REL
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == tmp_path.resolve().as_uri() + "/"
    # a single scanned file: paths relative to its folder
    single = to_sarif([finding], select_rules("paper"), tmp_path / REL)
    assert single["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "model.py"
