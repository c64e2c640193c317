"""The delegation chain rules (PROTOCOL.md §12.7), sans I/O, with an injected clock.

Every attack builds real signed tokens (no mocked crypto); the keys come from resolving the
issuers' did:key DIDs, as the server's adapter does.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from a2a_secure.delegation import (
    MAX_CHAIN_CHARS,
    MAX_DEPTH,
    MAX_LINK_CHARS,
    MAX_TTL,
    TYP,
    Chain,
    DelegationRefused,
    DelegationRules,
    Link,
    check_member,
    issue,
    load_chain,
    parse_chain,
    verify_signatures,
)
from a2a_secure.errors import InvalidParams, PolicyViolation
from a2a_secure.identity import encoding
from a2a_secure.identity.jws import jws_sign
from a2a_secure.identity.keys import Identity
from a2a_secure.identity.resolver import resolve_did_key
from a2a_secure.protocol import messages as m
from a2a_secure.protocol.models import Intent
from a2a_secure.store.revocation import check_target

NOW = 1_763_700_000


def ident(name: str) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"delegation:" + name.encode()).digest(), name)


PERSON, ASSISTANT, ORCH, CAL, OTHER = (ident(n) for n in ("person", "assistant", "orch", "cal", "other"))


def did_key(link: Link) -> bytes:
    """The key of ``link``'s issuer, resolved from its DID (never from the token)."""
    key = resolve_did_key(link.issuer).key_for(link.kid)
    if key is None:
        raise DelegationRefused("not a key of the issuer's DID")
    return key


def verified(tokens: list[str]) -> Chain:
    chain = parse_chain(tokens)
    verify_signatures(chain, did_key)
    return chain


def person_chain(**kw: Any) -> Chain:
    opts: dict[str, Any] = {"to": ASSISTANT.did, "goals": ["create_event", "list_events"], "ttl": 3600}
    opts.update(kw)
    return issue(PERSON, now=NOW, **opts)


def raw_link(signer: Identity, parent: Chain | None = None, typ: str = TYP, **members: Any) -> str:
    """A link signed by ``signer`` with any members (for the attacks the API refuses to make)."""
    payload: dict[str, Any] = {
        "iss": signer.did,
        "aud": ORCH.did,
        "sub": PERSON.did if parent is not None else signer.did,
        "jti": encoding.b64u_encode(hashlib.sha256((repr(members) + signer.did).encode()).digest()[:16]),
        "nbf": NOW,
        "exp": NOW + 600,
        "goals": ["create_event"],
        "max_priority": 3,
    }
    if parent is not None:
        payload["parent"] = parent.hash
    payload.update(members)
    payload = {k: v for k, v in payload.items() if v is not None}
    return jws_sign(payload, signer, typ)


def refused(tokens: list[str], match: str) -> None:
    with pytest.raises(DelegationRefused, match=match):
        verified(tokens)


# -- the honest chain ----------------------------------------------------------------------------
def test_a_chain_narrowed_at_each_hop_verifies_and_names_its_principal() -> None:
    root = person_chain(targets=[ORCH.did, CAL.did], max_priority=4)
    two = root.further(ASSISTANT, to=ORCH.did, goals=["create_event"], now=NOW + 10, ttl=600)
    chain = verified(two.tokens)
    assert chain.principal == PERSON.did and chain.audience == ORCH.did
    assert chain.hash == encoding.hash_bytes(two.tokens[-1].encode()) == chain.links[1].hash
    assert chain.links[1].parent == chain.links[0].hash
    assert [h["issuer"] for h in chain.hops] == [PERSON.did, ASSISTANT.did]
    assert chain.hops[1]["goals"] == ["create_event"] and chain.hops[1]["targets"] == [ORCH.did, CAL.did]
    assert chain.exp == NOW + 610 and chain.links[1].max_priority == 4
    chain.check_use(now=NOW + 20, client_did=ORCH.did, server_did=CAL.did, goal="create_event", priority=4)
    assert load_chain(two.dumps()) == chain


def test_a_hop_cannot_be_made_wider_by_the_api() -> None:
    root = person_chain()
    with pytest.raises(InvalidParams, match="goals widen"):
        root.further(ASSISTANT, to=ORCH.did, goals=["delete_all"], now=NOW)
    with pytest.raises(InvalidParams, match="only the chain's audience"):
        root.further(ORCH, to=CAL.did, now=NOW)
    # ttl past the parent's end is cut to it, never beyond.
    assert root.further(ASSISTANT, to=ORCH.did, now=NOW, ttl=10 * 3600).exp == root.exp


# -- the attacks ---------------------------------------------------------------------------------
def test_widened_goals_priority_or_targets_at_a_hop_are_refused() -> None:
    root = person_chain(targets=[CAL.did], max_priority=3)
    refused([*root.tokens, raw_link(ASSISTANT, root, goals=["delete_all"])], "link 1: goals widen")
    refused([*root.tokens, raw_link(ASSISTANT, root, goals=["*"])], "link 1: goals widen")
    refused([*root.tokens, raw_link(ASSISTANT, root, max_priority=5)], "link 1: max_priority widens")
    refused([*root.tokens, raw_link(ASSISTANT, root)], "link 1: targets widen")  # none = anywhere
    refused([*root.tokens, raw_link(ASSISTANT, root, targets=[CAL.did, OTHER.did])], "targets widen")
    # A "*" parent lets a hop name any goal; the same hop without widening verifies.
    star = person_chain(goals=["*"])
    assert verified([*star.tokens, raw_link(ASSISTANT, star, goals=["x"])]).leaf.goals == ("x",)


def test_a_window_outside_the_parent_is_refused() -> None:
    root = person_chain(ttl=600)
    refused([*root.tokens, raw_link(ASSISTANT, root, exp=NOW + 601)], "link 1: the window is not inside")
    refused([*root.tokens, raw_link(ASSISTANT, root, nbf=NOW - 1)], "link 1: the window is not inside")
    refused([raw_link(PERSON, None, exp=NOW + MAX_TTL + 1)], "link 0: the window must")
    refused([raw_link(PERSON, None, exp=NOW)], "link 0: the window must")


def test_expiry_and_not_before_are_checked_at_every_use() -> None:
    chain = verified(person_chain(ttl=600).tokens)
    use = {"client_did": ASSISTANT.did, "server_did": CAL.did, "goal": "create_event"}
    chain.check_use(now=NOW + 599, **use)
    with pytest.raises(DelegationRefused, match="link 0: expired"):
        chain.check_use(now=NOW + 600, **use)
    with pytest.raises(DelegationRefused, match="not valid before"):
        chain.check_use(now=NOW - 301, **use)


def test_a_chain_spliced_from_two_chains_is_refused() -> None:
    mine = person_chain()
    theirs = issue(OTHER, to=ASSISTANT.did, goals=["*"], ttl=3600, now=NOW)
    their_hop = theirs.further(ASSISTANT, to=ORCH.did, now=NOW)
    refused([*mine.tokens, their_hop.tokens[1]], "link 1: parent is not the hash")
    refused([their_hop.tokens[1]], "link 0: the root link has no parent")


def test_the_leaf_must_name_the_session_client_and_this_server_among_targets() -> None:
    chain = verified(person_chain(targets=[ORCH.did]).tokens)
    with pytest.raises(DelegationRefused, match="delegated to another DID"):
        chain.check_use(now=NOW, client_did=OTHER.did, server_did=ORCH.did, goal="create_event")
    with pytest.raises(DelegationRefused, match="not among the link's targets"):
        chain.check_use(now=NOW, client_did=ASSISTANT.did, server_did=CAL.did, goal="create_event")
    with pytest.raises(DelegationRefused, match="outside the delegated goals"):
        chain.check_use(now=NOW, client_did=ASSISTANT.did, server_did=ORCH.did, goal="delete_all")
    with pytest.raises(DelegationRefused, match="priority 5 is above"):
        verified(person_chain(max_priority=3).tokens).check_use(
            now=NOW, client_did=ASSISTANT.did, server_did=ORCH.did, goal="create_event", priority=5
        )


def test_a_loop_is_refused() -> None:
    root = person_chain()
    back = raw_link(ASSISTANT, root, aud=PERSON.did)
    refused([*root.tokens, back], "link 1: a DID appears twice")
    refused([raw_link(PERSON, None, aud=PERSON.did)], "delegate to its own issuer")
    hop = root.further(ASSISTANT, to=ORCH.did, now=NOW)
    again = raw_link(ORCH, hop, aud=ASSISTANT.did)
    refused([*hop.tokens, again], "link 2: a DID appears twice")


def test_depth_and_size_bombs_are_refused_before_decoding() -> None:
    chain = person_chain(goals=["*"])
    signers = [ASSISTANT, ORCH, CAL, OTHER, ident("sixth")]
    for signer, nxt in zip(signers, [*signers[1:], ident("seventh")], strict=False):
        if len(chain.links) == MAX_DEPTH:
            break
        chain = chain.further(signer, to=nxt.did, now=NOW)
    assert len(verified(chain.tokens).links) == MAX_DEPTH
    six = [*chain.tokens, raw_link(signers[-1], chain)]
    refused(six, f"a chain has 1 to {MAX_DEPTH} links")
    # Counted on the strings: none of these is valid base64, and none is decoded.
    refused(["!" * (MAX_LINK_CHARS + 1)], f"a link is at most {MAX_LINK_CHARS} characters")
    refused(["!" * MAX_LINK_CHARS] * 4 + ["!" * 2], f"a chain is at most {MAX_CHAIN_CHARS} characters")
    # The intent member's JSON types are step 1's (-32602); the bounds are the chain's.
    assert Intent.parse({"goal": "g", "inputs": {}, "delegation": ["!"] * 6}).delegation == ("!",) * 6
    for bad in ("not-a-hash", [], [1], {"a": 1}):
        with pytest.raises(InvalidParams, match="array of tokens or a sha256"):
            Intent.parse({"goal": "g", "inputs": {}, "delegation": bad})
    assert check_member("sha256:" + "0" * 64) == "sha256:" + "0" * 64


def test_a_wrong_typ_is_refused() -> None:
    refused([raw_link(PERSON, None, typ=m.Typ.REQUEST)], "link 0: JWS typ must be a2a-delegation\\+jws")
    root = person_chain()
    refused([*root.tokens, raw_link(ASSISTANT, root, typ=m.Typ.SESSION)], "link 1: JWS typ")


def test_a_key_that_is_not_the_issuers_is_refused() -> None:
    # OTHER signs with its own kid but claims to be PERSON: the kid is not of iss's DID.
    forged = raw_link(OTHER, None, iss=PERSON.did, sub=PERSON.did)
    refused([forged], "link 0: JWS kid does not belong to the issuer's DID")
    # The kid names PERSON's key, the signature is OTHER's: the resolved key does not verify.
    header = encoding.b64u_encode(encoding.dumps({"alg": "EdDSA", "typ": TYP, "kid": PERSON.kid}))
    body = raw_link(PERSON, None).split(".")[1]
    sig = encoding.b64u_encode(OTHER.sign(f"{header}.{body}".encode()))
    refused([f"{header}.{body}.{sig}"], "link 0: JWS signature does not verify")


def test_members_and_principal_are_exact() -> None:
    refused([raw_link(PERSON, None, extra=1)], "unexpected member 'extra'")
    refused([raw_link(PERSON, None, goals=None)], "missing a required member")
    refused([raw_link(PERSON, None, sub=OTHER.did)], "root link's sub must be its issuer")
    root = person_chain()
    refused([*root.tokens, raw_link(ASSISTANT, root, sub=OTHER.did)], "sub differs")
    refused([*root.tokens, raw_link(ORCH, root, aud=CAL.did)], "issuer is not the previous link's audience")
    refused([raw_link(PERSON, None, max_priority=6)], "max_priority must be in 1..5")
    refused([raw_link(PERSON, None, jti="short")], "jti must be")


def test_required_principals() -> None:
    rules = DelegationRules.build({"create_event": [PERSON.did]})
    chain = verified(person_chain().tokens)
    assert rules.refusal("create_event", chain) is None
    assert rules.refusal("other_goal", None) is None
    no_chain = rules.refusal("create_event", None)
    assert isinstance(no_chain, PolicyViolation) and "runs only on behalf of" in no_chain.message
    someone_else = verified(issue(OTHER, to=ASSISTANT.did, goals=["*"], ttl=60, now=NOW).tokens)
    assert "may not run on behalf of" in str(rules.refusal("create_event", someone_else))


def test_a_token_id_is_a_revocation_target() -> None:
    jti = person_chain().leaf.jti
    assert check_target("delegation:" + jti) == "delegation:" + jti
    with pytest.raises(InvalidParams, match="delegation token id"):
        check_target("delegation:short")


def test_the_server_keeps_a_bounded_number_of_verified_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    from a2a_secure.protocol.server import chain_cache
    from a2a_secure.protocol.server.chain_cache import ChainCache, Kept

    monkeypatch.setattr(chain_cache, "MAX_CACHED_CHAINS", 3)
    cache = ChainCache()
    chains = [person_chain(ttl=3600 + i) for i in range(6)]
    for chain in chains[:3]:
        cache.keep("s1", Kept(chain), 2)
    assert cache.names("s1") == [chains[1].hash, chains[2].hash] and len(cache) == 2  # 2 per session
    cache.keep("s2", Kept(chains[3]), 2)  # 3 in all
    # Past the bound, a session that holds chains of its own gives up its own oldest first.
    cache.keep("s2", Kept(chains[4]), 2)
    assert cache.names("s1") == [chains[1].hash, chains[2].hash] and cache.names("s2") == [chains[4].hash]
    # One with none of its own takes the least recently used session's oldest.
    assert cache.get("s1", chains[1].hash) is not None  # s1 used: s2 is now the least recent
    cache.keep("s3", Kept(chains[5]), 2)
    assert cache.names("s2") == [] and cache.names("s3") == [chains[5].hash] and len(cache) == 3
    cache.forget("s1")
    assert cache.names("s1") == [] and len(cache) == 1
