from __future__ import annotations

import hashlib
import hmac

from app.webhooks.signature import sign, signature_valid


def test_signature_matches_githubs_definition():
    # GitHub's documented example: secret "It's a Secret to Everybody", body "Hello, World!".
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign("It's a Secret to Everybody", b"Hello, World!") == expected
    assert signature_valid("It's a Secret to Everybody", b"Hello, World!", expected)


def test_wrong_missing_or_malformed_signatures_fail():
    body = b'{"zen": "Keep it logically awesome."}'
    good = "sha256=" + hmac.new(b"secret", body, hashlib.sha256).hexdigest()
    assert signature_valid("secret", body, good)
    assert not signature_valid("other", body, good)
    assert not signature_valid("secret", body + b" ", good)
    assert not signature_valid("secret", body, None)
    assert not signature_valid("secret", body, "")
    assert not signature_valid("secret", body, good.replace("sha256=", "sha1="))
    assert not signature_valid("secret", body, good[:-1])
