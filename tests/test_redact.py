"""The redactor: no secret reaches a tape, and nothing else changes."""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import stat
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wiretape.redact import (
    PLACEHOLDER,
    SECRET_HEADERS,
    SECRET_QUERY_PARAMS,
    SHAPES,
    Redactor,
    UndecodableBody,
    decode_body,
    load_or_create_key,
    scan_for_secrets,
)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
BASE62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


# Fake credentials are put together at run time, so that no secret scanner (GitHub push
# protection, gitleaks) ever sees a whole one in this file.
def _random(rng: random.Random, alphabet: str, length: int) -> str:
    text = "".join(rng.choice(alphabet) for _ in range(length))
    return text[:-2] + "Z7"  # a capital and a digit, as real keys have


def make_secret(kind: str, seed: int = 0) -> tuple[str, str]:
    """(text to plant, the part of it that must disappear) for one kind of secret."""
    rng = random.Random(f"{kind}/{seed}")
    token = BASE62 + "_-"
    if kind == "openai-key":
        secret = "sk" + "-proj-" + _random(rng, token, 156)
    elif kind == "openai-key-legacy":
        secret = "sk" + "-" + _random(rng, BASE62, 48)
    elif kind == "anthropic-key":
        secret = "sk" + "-ant-api03-" + _random(rng, token, 93) + "AA"
    elif kind == "aws-access-key-id":
        secret = (
            rng.choice(["AK", "AS"]) + "IA" + _random(rng, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
        )
    elif kind == "aws-secret-key":
        secret = _random(rng, BASE62 + "/+", 40)
        return "aws_secret_access_key = " + secret, secret
    elif kind == "aws-session-token":
        secret = _random(rng, BASE62 + "/+", 300)
        return '"SessionToken": "' + secret + '"', secret
    elif kind == "github-token":
        secret = "gh" + rng.choice("pousr") + "_" + _random(rng, BASE62, 36)
    elif kind == "github-pat":
        secret = "github" + "_pat_" + _random(rng, BASE62, 22) + "_" + _random(rng, BASE62, 59)
    elif kind == "google-api-key":
        secret = "AI" + "za" + _random(rng, token, 35)
    elif kind == "slack-token":
        digits = "0123456789"
        secret = "xo" + "xb-" + _random(rng, digits, 12) + "-" + _random(rng, digits, 13)
        secret += "-" + _random(rng, BASE62, 24)
    elif kind == "slack-webhook":
        secret = "T0" + _random(rng, BASE62.upper(), 8) + "/B0" + _random(rng, BASE62.upper(), 8)
        secret += "/" + _random(rng, BASE62, 24)
        return "https://hooks.slack.com/services/" + secret, secret
    elif kind == "jwt":
        header = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=").decode()
        claims = json.dumps({"sub": rng.randrange(10**9), "name": "Ada"}).encode()
        payload = base64.urlsafe_b64encode(claims).rstrip(b"=").decode()
        secret = f"{header}.{payload}.{_random(rng, token, 43)}"
    elif kind == "bearer-token":
        secret = _random(rng, BASE62 + "._~+/-", 40)
        return "Bearer " + secret, secret
    else:
        raise AssertionError(kind)
    return secret, secret


KINDS = {
    "openai-key": "openai-key",
    "openai-key-legacy": "openai-key",
    "anthropic-key": "anthropic-key",
    "aws-access-key-id": "aws-access-key-id",
    "aws-secret-key": "aws-secret-key",
    "aws-session-token": "aws-session-token",
    "github-token": "github-token",
    "github-pat": "github-token",
    "google-api-key": "google-api-key",
    "slack-token": "slack-token",
    "slack-webhook": "slack-webhook",
    "jwt": "jwt",
    "bearer-token": "bearer-token",
}


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(KEY)


def placeholders(data: bytes | str) -> list[str]:
    raw = data.encode() if isinstance(data, str) else data
    return [m.group().decode() for m in PLACEHOLDER.finditer(raw)]


# -- headers --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SECRET_HEADERS, "AUTHORIZATION", "X-Api-Key", "Set-COOKIE"])
def test_every_secret_header_loses_its_value_and_keeps_its_name(redactor, name):
    value = "s3cr3t-" + "value-that-has-no-shape"
    [(out_name, out_value)] = redactor.headers([(name, value)])
    assert out_name == name
    assert "s3cr3t" not in out_value
    assert len(placeholders(out_value)) == 1


@pytest.mark.parametrize("scheme", ["Bearer", "Basic", "token", "AWS4-HMAC-SHA256"])
def test_authorization_keeps_the_scheme_word(redactor, scheme):
    credential = "dXNlcjpodW50ZXIy" + "Credential=xyz/20240101, Signature=abcdef"
    [(_, value)] = redactor.headers([("Authorization", f"{scheme} {credential}")])
    assert value.startswith(scheme + " [REDACTED:")
    assert "dXNlcjpodW50ZXIy" not in value and "abcdef" not in value


def test_a_bearer_credential_of_a_known_shape_is_named_by_its_shape(redactor):
    key, _ = make_secret("openai-key")
    [(_, value)] = redactor.headers([("Authorization", "Bearer " + key)])
    assert value.startswith("Bearer [REDACTED:openai-key:")


def test_cookie_keeps_names_and_replaces_values(redactor):
    [(_, value)] = redactor.headers([("Cookie", 'session=abc123; theme="dark"; nameless; e=')])
    assert value.startswith("session=[REDACTED:cookie:")
    assert '; theme="[REDACTED:cookie:' in value
    assert "; [REDACTED:cookie:" in value  # no "=": a cookie with an empty name
    assert value.endswith("; e=")
    assert "abc123" not in value and "dark" not in value and "nameless" not in value


def test_set_cookie_replaces_the_value_and_keeps_the_attributes(redactor):
    header = "sid=31d4d96e407aad42; Path=/; Secure; HttpOnly; Expires=Wed, 21 Oct 2015 07:28:00 GMT"
    [(_, value)] = redactor.headers([("Set-Cookie", header)])
    assert value.startswith("sid=[REDACTED:cookie:")
    assert value.endswith("; Path=/; Secure; HttpOnly; Expires=Wed, 21 Oct 2015 07:28:00 GMT")
    assert "31d4d96e407aad42" not in value


def test_other_headers_are_kept_unless_they_carry_a_shaped_secret(redactor):
    key, _ = make_secret("github-token")
    headers = [
        ("Content-Type", "application/json"),
        ("User-Agent", "OpenAI/Python 1.40.0"),
        ("X-Debug", f"token={key}"),
        ("content-type", "text/plain"),
    ]
    out = redactor.headers(headers)
    assert out[0] == headers[0] and out[1] == headers[1] and out[3] == headers[3]
    assert out[2][1].startswith("token=[REDACTED:github-token:")


# -- URLs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [*SECRET_QUERY_PARAMS, "KEY", "Api_Key", "Signature"])
def test_every_secret_query_parameter_loses_its_value(redactor, name):
    url = f"https://api.example.com/v1/x?a=1&{name}=hunter2%2Bmore&b=%7Bkeep%7D+this#frag"
    out = redactor.url(url)
    assert "hunter2" not in out
    before, _, after = out.partition("[REDACTED:")
    assert before == f"https://api.example.com/v1/x?a=1&{name}="
    assert after.split("]", 1)[1] == "&b=%7Bkeep%7D+this#frag"


def test_a_url_without_secrets_is_returned_byte_for_byte(redactor):
    url = "https://api.example.com/v1/chat?model=gpt-4o&q=caf%C3%A9+au+lait&tokens=12&x=%2f&&y"
    assert redactor.url(url) == url


def test_a_secret_shaped_string_in_a_url_path_is_redacted(redactor):
    plant, secret = make_secret("slack-webhook")
    out = redactor.url(plant)
    assert secret not in out
    assert out.startswith("https://hooks.slack.com/services/[REDACTED:slack-webhook:")


def test_a_key_gets_one_placeholder_in_a_url_a_header_and_a_body(redactor):
    key, _ = make_secret("google-api-key")
    in_url = placeholders(redactor.url(f"https://generativelanguage.googleapis.com/v1?key={key}"))
    in_header = placeholders(redactor.headers([("x-goog-api-key", key)])[0][1])
    in_body = placeholders(redactor.body(json.dumps({"key": key}).encode()))
    assert in_url == in_header == in_body
    assert in_url[0].startswith("[REDACTED:google-api-key:")


# -- shapes in bodies -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_shape_is_redacted_in_a_json_body(redactor, kind):
    plant, secret = make_secret(kind)
    body = json.dumps(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": f"use this: {plant} ok"}]}
    ).encode()
    out = redactor.body(body)
    assert secret.encode() not in out
    assert json.loads(out)["model"] == "gpt-4o"  # still JSON
    assert [p.split(":")[1] for p in placeholders(out)] == [KINDS[kind]]


@pytest.mark.parametrize("kind", KINDS)
def test_each_shape_is_redacted_at_the_start_of_a_line_in_a_json_string(redactor, kind):
    # JSON writes the newline as \n: the letter n sits right before the secret.
    plant, secret = make_secret(kind)
    out = redactor.body(json.dumps({"content": "my key:\n" + plant}).encode())
    assert secret.encode() not in out
    assert json.loads(out)["content"].startswith("my key:\n")


@pytest.mark.parametrize("kind", KINDS)
def test_each_shape_is_redacted_in_an_sse_stream(redactor, kind):
    plant, secret = make_secret(kind)
    events = [
        {"choices": [{"delta": {"content": "Here it is: "}}]},
        {"choices": [{"delta": {"content": plant}}]},
        {"choices": [{"delta": {"content": "."}}]},
    ]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    out = redactor.body(stream.encode())
    assert secret.encode() not in out
    blocks = out.decode().split("\n\n")
    assert blocks[-2] == "data: [DONE]" and len(blocks) == 5
    for block in blocks[:3]:
        json.loads(block.removeprefix("data: "))


BARE_KINDS = [k for k in KINDS if k not in ("slack-webhook", "bearer-token") and "aws-s" not in k]


@pytest.mark.parametrize("kind", BARE_KINDS)
def test_each_shape_without_a_lead_is_redacted_in_a_url(redactor, kind):
    plant, secret = make_secret(kind)
    out = redactor.url(f"https://example.com/cb/{plant}?state=1&redirect={plant}")
    assert secret not in out
    assert out.startswith("https://example.com/cb/[REDACTED:") and "?state=1&redirect=" in out


def test_secrets_after_url_and_unicode_escapes_are_redacted(redactor):
    key, _ = make_secret("openai-key-legacy")
    form = f"q=my%20key%3A{key}&lang=en".encode()
    assert redactor.body(form).startswith(b"q=my%20key%3A[REDACTED:openai-key:")
    as_json = json.dumps({"content": "clé:é" + key})  # ensure_ascii writes \u00e9
    assert "\\u00e9sk" in as_json
    assert key.encode() not in redactor.body(as_json.encode())


@pytest.mark.parametrize(
    "lead",
    [
        "aws_secret_access_key = ",
        "AWS_SECRET_ACCESS_KEY=",
        '"SecretAccessKey": "',
        "<SecretAccessKey>",
        "secretAccessKey: ",
        'aws-secret-access-key=\\"',
    ],
)
def test_aws_secret_keys_are_found_by_the_names_that_introduce_them(redactor, lead):
    _, secret = make_secret("aws-secret-key")
    out = redactor.body(f"{lead}{secret}\n".encode())
    assert out.startswith(lead.encode() + b"[REDACTED:aws-secret-key:")
    # The same forty characters with no name before them are not taken for a key.
    assert redactor.body(f"digest {secret}\n".encode()) == f"digest {secret}\n".encode()


def test_bearer_in_a_body_keeps_the_word(redactor):
    _, token = make_secret("bearer-token")
    body = f'curl -H "Authorization: Bearer {token}" https://api.example.com'.encode()
    out = redactor.body(body)
    assert out.startswith(b'curl -H "Authorization: Bearer [REDACTED:bearer-token:')
    assert out.endswith(b'" https://api.example.com')


def test_two_secrets_get_two_placeholders_and_one_secret_one(redactor):
    first, _ = make_secret("openai-key", seed=1)
    second, _ = make_secret("openai-key", seed=2)
    out = redactor.body(f"{first} {second} {first}".encode())
    a, b, c = placeholders(out)
    assert a == c != b
    assert out == f"{a} {b} {c}".encode()


def test_placeholders_depend_on_the_key(redactor):
    key, _ = make_secret("anthropic-key")
    other = Redactor(OTHER_KEY)
    assert redactor.body(key.encode()) == redactor.body(key.encode())
    assert redactor.body(key.encode()) != other.body(key.encode())


def test_placeholders_keep_json_valid_and_never_look_secret(redactor):
    kinds = {shape.name for shape in SHAPES} | {"secret-header", "cookie", "secret-param"}
    for kind in kinds:
        placeholder = redactor._placeholder(kind, b"x").decode()
        assert '"' not in placeholder and "\\" not in placeholder
        assert PLACEHOLDER.fullmatch(placeholder.encode())
        assert scan_for_secrets(placeholder.encode()) == []
        assert scan_for_secrets(f"Bearer {placeholder}".encode()) == []


def test_redacting_twice_changes_nothing(redactor):
    parts = [make_secret(kind)[0] for kind in KINDS]
    body = json.dumps({"parts": parts}).encode()
    once = redactor.body(body)
    assert redactor.body(once) == once
    headers = redactor.headers([("Authorization", "Bearer abcdef0123456789"), ("Cookie", "a=b")])
    assert redactor.headers(headers) == headers
    url = redactor.url("https://x.test/?key=abc&token=def&sig=0a1b")
    assert redactor.url(url) == url


def test_redacting_twice_changes_nothing_with_user_patterns_that_match_inside_tags():
    redactor = Redactor(KEY, extra_patterns=[r"[0-9a-f]{6}", r"password=(\S{3})"])
    once = redactor.body(b"hex 0123456789abcdef and password=hunter2 here")
    assert b"hunter2" not in once and b"0123456789abcdef" not in once
    assert redactor.body(once) == once


# -- no false positives ---------------------------------------------------------------------

ORDINARY_TEXTS = [
    "A risk-free rate and a task-list app: ask-me-anything, desk-lamp, whisk-ey, disk-usage.",
    "We use sk-learn (sk-learn-compatible-estimators) and the sk- prefix; keys look like sk-....",
    # Only the rule that a key has a capital or a digit keeps this one out:
    "See sk-learn-compatible-estimator-wrappers-for-pipelines in the docs.",
    # Only the rule that a key starts a token keeps these out:
    '<li class="task-list-item-renderer-component-2024">risk-assessment-framework-for-LLM-agents',
    "Set `Authorization: Bearer $OPENAI_API_KEY` and read the bearer token docs.",
    "Bearer tokens/authentication are bearer responsibilities of the client.",
    '{"access_token": "short", "token_type": "bearer", "expires_in": 3600}',
    '{"logprobs": [{"token": "Hello", "logprob": -0.01}, {"token": " world", "logprob": -0.3}]}',
    "def get_session_token(self):\n    session_token = self._refresh()\n    return session_token\n",
    "task_list = [t for t in tasks if not t.done]  # risk-free refactor, see TASK-1234\n",
    '{"id": "chatcmpl-9xYzAbCdEfGhIjKlMnOpQrStUvW", "model": "gpt-4o-2024-08-06"}',
    '{"id": "msg_01XFDUDYJgAACzvnptvVoYEL", "model": "claude-3-5-sonnet-20241022"}',
    '{"tool_call_id": "call_abc123DEF456ghi789JKL012", "role": "tool", "content": "ok"}',
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8 and sha256 "
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "UUID 123e4567-e89b-12d3-a456-426614174000, AKIA alone, eyJ alone, xoxb- alone, ghp_ alone",
    "The secret access key is stored in the vault; the session token expires hourly.",
    "https://docs.python.org/3/library/urllib.parse.html#urllib.parse.urlsplit",
]


@pytest.mark.parametrize("text", ORDINARY_TEXTS)
def test_ordinary_llm_text_and_code_are_left_alone(redactor, text):
    data = json.dumps({"content": text}).encode()
    assert redactor.body(data) is data
    assert redactor.body(text.encode()) == text.encode()
    assert scan_for_secrets(text.encode()) == []


def test_binary_bodies_without_secrets_are_returned_as_they_are(redactor):
    rng = random.Random(7)
    png = b"\x89PNG\r\n\x1a\n" + bytes(rng.randrange(256) for _ in range(8192))
    assert redactor.body(png) is png
    as_base64 = base64.b64encode(png)
    assert redactor.body(as_base64) is as_base64


# -- streamed chunks ------------------------------------------------------------------------


def test_a_secret_straddling_chunk_boundaries_is_redacted_and_only_its_chunks_merge(redactor):
    key, _ = make_secret("openai-key")
    stream = f'data: {{"delta": "{key}"}}\n\n'.encode()
    cut1, cut2 = stream.index(b"sk") + 10, stream.index(b"sk") + 90
    chunks = [b"data: first\n\n", stream[:cut1], stream[cut1:cut2], stream[cut2:], b"data: end\n\n"]
    out = redactor.chunks(chunks)
    assert key.encode() not in b"".join(out)
    assert len(out) == 3
    assert out[0] is chunks[0] and out[2] is chunks[4]
    assert out[1].startswith(b'data: {"delta": "[REDACTED:openai-key:')
    assert b"".join(out) == redactor.body(b"".join(chunks))
    # Which input each output starts at, so a recorder keeps the arrival times it can.
    assert [first for first, _ in redactor.chunk_groups(chunks)] == [0, 1, 4]


def test_chunks_keep_their_count_and_objects_when_no_secret_straddles(redactor):
    key, _ = make_secret("github-token")
    chunks = [b"data: a\n\n", f"data: {key}\n\n".encode(), b"", b"data: b\n\n"]
    out = redactor.chunks(chunks)
    assert len(out) == len(chunks)
    assert out[0] is chunks[0] and out[2] is chunks[2] and out[3] is chunks[3]
    assert out[1].startswith(b"data: [REDACTED:github-token:")
    clean = [b"data: x\n\n", b"data: y\n\n"]
    assert redactor.chunks(clean) == clean


def test_a_secret_ending_exactly_at_a_boundary_merges_nothing(redactor):
    key, _ = make_secret("jwt")
    chunks = [b"token ", key.encode(), b" end"]
    out = redactor.chunks(chunks)
    assert len(out) == 3 and out[0] is chunks[0] and out[2] is chunks[2]
    assert out[1].startswith(b"[REDACTED:jwt:")


# -- user patterns --------------------------------------------------------------------------


def test_user_patterns_redact_the_whole_match_or_group_one():
    redactor = Redactor(KEY, extra_patterns=[r"INTERNAL-\d{6}", r"password=([^&\s]+)"])
    out = redactor.body(b"id INTERNAL-123456 then password=hunter2&x=1")
    assert out.startswith(b"id [REDACTED:custom:")
    assert b"password=[REDACTED:custom:" in out and out.endswith(b"&x=1")
    assert b"hunter2" not in out and b"123456" not in out


def test_an_invalid_user_pattern_raises_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"--redact pattern 'api\[key' is not a valid"):
        Redactor(KEY, extra_patterns=["api[key"])
    with pytest.raises(ValueError, match="not a valid"):
        scan_for_secrets(b"", extra_patterns=["(unclosed"])
    with pytest.raises(TypeError):
        Redactor(KEY, extra_patterns="sk-.*")  # type: ignore[arg-type]


def test_a_key_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="32 bytes"):
        Redactor(b"short")


# -- scan, policy, key file, encodings ------------------------------------------------------


def test_scan_reports_kind_and_offset_with_a_preview_that_hides_the_secret(redactor):
    key, _ = make_secret("openai-key")
    data = f"prefix {key} suffix".encode()
    [finding] = scan_for_secrets(data)
    assert (finding.kind, finding.offset, finding.length) == ("openai-key", 7, len(key))
    assert finding.preview == f"sk-proj-…({len(key)} bytes)"
    assert key[8:16] not in finding.preview
    assert scan_for_secrets(redactor.body(data)) == []
    [custom] = scan_for_secrets(b"x INTERNAL-42 y", extra_patterns=[r"INTERNAL-\d+"])
    assert (custom.kind, custom.offset, custom.preview) == ("custom", 2, "…(11 bytes)")


def test_policy_is_json_with_a_fixed_key_order_and_no_key():
    policy = Redactor(KEY, extra_patterns=[r"INTERNAL-\d+"]).policy()
    assert list(policy) == [
        "version",
        "placeholder",
        "tag",
        "key_id",
        "headers",
        "query_params",
        "patterns",
        "extra_patterns",
    ]
    assert json.loads(json.dumps(policy)) == policy
    assert policy["extra_patterns"] == [r"INTERNAL-\d+"]
    assert set(KINDS.values()) <= set(policy["patterns"])
    assert "authorization" in policy["headers"] and "key" in policy["query_params"]
    assert KEY.hex() not in json.dumps(policy)
    assert policy["key_id"] != Redactor(OTHER_KEY).policy()["key_id"]


def test_the_key_file_is_made_once_with_private_modes(tmp_path):
    home = tmp_path / "state" / "wiretape"
    key = load_or_create_key(home)
    assert len(key) == 32
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(home / "redaction.key").st_mode) == 0o600
    assert load_or_create_key(home) == key
    assert os.listdir(home) == ["redaction.key"]  # no temporary left behind
    assert load_or_create_key(tmp_path / "elsewhere") != key


def test_a_damaged_key_file_is_reported_not_replaced(tmp_path):
    (tmp_path / "redaction.key").write_bytes(b"too short")
    with pytest.raises(ValueError, match=r"redaction\.key: a redaction key is 32 bytes"):
        load_or_create_key(tmp_path)
    assert (tmp_path / "redaction.key").read_bytes() == b"too short"


def test_encoded_bodies_are_decoded_for_redaction_or_refused():
    body = b'{"content": "hello"}' * 20
    assert decode_body(body, None) is body
    assert decode_body(body, "identity") is body
    assert decode_body(gzip.compress(body), "gzip") == body
    assert decode_body(zlib.compress(body), "deflate") == body
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert decode_body(raw_deflate.compress(body) + raw_deflate.flush(), "deflate") == body
    brotli = pytest.importorskip("brotli")
    assert decode_body(brotli.compress(gzip.compress(body)), "gzip, br") == body
    with pytest.raises(UndecodableBody, match="unsupported Content-Encoding 'compress'"):
        decode_body(body, "compress")
    with pytest.raises(UndecodableBody, match="not valid gzip"):
        decode_body(body, "gzip")


# -- properties -----------------------------------------------------------------------------

PLANTS = st.builds(make_secret, st.sampled_from(sorted(KINDS)), st.integers(0, 10**6))
NOISE = st.binary(max_size=120) | st.text(max_size=120).map(str.encode)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=NOISE, plants=st.lists(PLANTS, min_size=1, max_size=3), after=NOISE)
def test_no_planted_secret_survives_in_any_body(before, plants, after):
    redactor = Redactor(KEY)
    body = before + b" " + b" \n ".join(plant.encode() for plant, _ in plants) + b" " + after
    out = redactor.body(body)
    for _, secret in plants:
        assert secret.encode() not in out
    assert redactor.body(out) == out
    as_json = json.dumps({"a": before.decode("latin-1"), "b": [p for p, _ in plants]}).encode()
    out_json = redactor.body(as_json)
    assert all(secret.encode() not in out_json for _, secret in plants)
    json.loads(out_json)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(before=NOISE, plant=PLANTS, after=NOISE, cuts=st.lists(st.integers(0, 10**6), max_size=8))
def test_chunks_redact_exactly_what_the_whole_body_redacts(before, plant, after, cuts):
    redactor = Redactor(KEY)
    body = before + b" " + plant[0].encode() + b" " + after
    edges = sorted({cut % (len(body) + 1) for cut in cuts})
    chunks = [body[a:b] for a, b in zip([0, *edges], [*edges, len(body)], strict=True)]
    groups = redactor.chunk_groups(chunks)
    out = [data for _, data in groups]
    assert out == redactor.chunks(chunks)
    assert b"".join(out) == redactor.body(body)
    assert plant[1].encode() not in b"".join(out)
    firsts = [first for first, _ in groups]
    assert firsts[0] == 0 and firsts == sorted(set(firsts)) and firsts[-1] < len(chunks)
