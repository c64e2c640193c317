"""Actions waiting for approval in :class:`~a2a_secure.store.redis.RedisStore` (store/actions.py).

Keys (``P`` the prefix; names built in :class:`~a2a_secure.store.redis_keys.RedisKeys`; on
a spread cluster all of them share the one tag ``P{act}:``, since an approver names only
the action id):

* ``P act:<action_id>``: one hash per action (fields below). Created by the engine when a
  handler asks for approval (:meth:`RedisActions.add_action`), decided once by an
  approver (``decide_action``). Found by its random id; its record names the agent.
* ``P actc:<caller_did>`` and ``P acta``: the bounds of pending actions per caller and in
  total, sorted sets of action ids scored by ``expires_at``; the store's.

TTL: the action's ``keep_until`` plus one second (after ``expires_at``, so that a late or
replayed approval is told what happened); the sorted sets as long as their latest member.
"""

from __future__ import annotations

from a2a_secure.identity import encoding
from a2a_secure.store.actions import Decision, DecisionKind, PendingAction
from a2a_secure.store.base import Added
from a2a_secure.store.redis_keys import _EXTEND, RedisKeys, _num, _ttl_ms

__all__ = ["RedisActions"]

_ADDED = {1: Added.ADDED, 3: Added.OWN_FULL, 0: Added.TOTAL_FULL, 2: Added.TAKEN}

# An action is one hash: ``d`` its record as created (JSON; with ``principal`` and
# ``delegation`` when it was asked under a chain, PROTOCOL.md §12.7; with ``sealed`` and
# ``sealed_kid``, and neither data nor preview, when it was asked on a sealed session, §12.1),
# ``st`` its state, ``e`` its expires_at, ``k`` its keep_until, ``h`` its action_hash as the
# record keeps it (an HMAC of it for a sealed action), ``c`` its caller DID, ``by``/``at``
# who decided it and when. Its id is in two sorted sets scored by expires_at while it is
# pending (one per caller DID, one global): they are the bounds.

# KEYS: action hash, caller zset, global zset
# ARGV: now, max_per_caller, max_total, record, expires_at, keep_until, ttl_ms, action_id,
#       action_hash, caller_did.  Returns 1 stored, 3 the caller's bound is reached, 0 the
#       total's, 2 the id exists.
_ADD_ACTION = (
    _EXTEND
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[2]) then return 3 end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[3]) then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 2 end
local ttl = tonumber(ARGV[7])
redis.call('HSET', KEYS[1], 'd', ARGV[4], 'st', 'pending', 'e', ARGV[5], 'k', ARGV[6],
           'h', ARGV[9], 'c', ARGV[10])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[8])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[8])
extend(KEYS[2], ttl)
extend(KEYS[3], ttl)
return 1
"""
)

# KEYS: action hash.  ARGV: now.  Returns {record, state, decided_by, decided_at} or nil.
_GET_ACTION = """
local v = redis.call('HMGET', KEYS[1], 'd', 'k', 'st', 'by', 'at')
if not v[1] then return false end
if tonumber(v[2]) <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return false
end
return {v[1], v[3], v[4] or '', v[5] or ''}
"""

# KEYS: action hash, caller zset, global zset
# ARGV: now, action_hash, new state, decided_by, action_id, caller_did
# Returns {kind[, record, state, decided_by, decided_at]}:
# 0 UNKNOWN, 1 DECIDED, 2 EXPIRED, 3 ALREADY, 4 MISMATCH (nothing written)
_DECIDE_ACTION = """
local v = redis.call('HMGET', KEYS[1], 'd', 'k', 'st', 'e', 'h', 'c', 'by', 'at')
if not v[1] or tonumber(v[2]) <= tonumber(ARGV[1]) or v[6] ~= ARGV[6] then return {0} end
if v[3] ~= 'pending' then return {3, v[1], v[3], v[7] or '', v[8] or ''} end
if v[5] ~= ARGV[2] then return {4, v[1], v[3], '', ''} end
local at = tostring(math.floor(tonumber(ARGV[1])))
redis.call('ZREM', KEYS[2], ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[5])
if tonumber(v[4]) <= tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'st', 'expired', 'at', at)
  return {2, v[1], 'expired', '', at}
end
redis.call('HSET', KEYS[1], 'st', ARGV[3], 'by', ARGV[4], 'at', at)
return {1, v[1], ARGV[3], ARGV[4], at}
"""

_DECISIONS = {
    0: DecisionKind.UNKNOWN,
    1: DecisionKind.DECIDED,
    2: DecisionKind.EXPIRED,
    3: DecisionKind.ALREADY,
    4: DecisionKind.MISMATCH,
}


def _action_from(record: bytes, state: bytes, by: bytes, at: bytes) -> PendingAction:
    """A stored action from its creation record and the members a decision wrote."""
    data = encoding.loads(record)
    data["state"] = state.decode()
    data["decided_by"] = by.decode() or None
    data["decided_at"] = int(at) if at else None
    return PendingAction.from_dict(data)


class RedisActions(RedisKeys):
    """The approval methods of :class:`~a2a_secure.store.redis.RedisStore`."""

    # -- actions waiting for approval (store/actions.py) ----------------------------------------
    async def add_action(
        self, action: PendingAction, *, max_per_caller: int, max_total: int, now: float
    ) -> Added:
        """See :meth:`ActionStore.add_action` (one script)."""
        record = action.to_dict()
        for member in ("state", "decided_by", "decided_at"):  # kept as hash fields
            del record[member]
        code = await self._script(
            self._add_action,
            self._action_keys(action.action_id, action.caller_did),
            [
                _num(now),
                max_per_caller,
                max_total,
                encoding.dumps(record),
                action.expires_at,
                action.keep_until,
                _ttl_ms(action.keep_until, now),
                action.action_id,
                action.action_hash,
                action.caller_did,
            ],
        )
        return _ADDED[int(code)]

    async def get_action(self, action_id: str, now: float) -> PendingAction | None:
        """See :meth:`ActionStore.get_action` (one script)."""
        out = await self._script(self._get_action, [self._k_action(action_id)], [_num(now)])
        if not out:
            return None
        return _action_from(*out)

    async def decide_action(
        self,
        action_id: str,
        *,
        caller_did: str,
        action_hash: str,
        approve: bool,
        decided_by: str,
        now: float,
    ) -> Decision:
        """See :meth:`ActionStore.decide_action`: the pending → decided step in one script."""
        out = await self._script(
            self._decide_action,
            self._action_keys(action_id, caller_did),
            [
                _num(now),
                action_hash,
                "approved" if approve else "rejected",
                decided_by,
                action_id,
                caller_did,
            ],
        )
        kind = _DECISIONS[int(out[0])]
        if kind is DecisionKind.UNKNOWN:
            return Decision(kind)
        return Decision(kind, _action_from(*out[1:5]))
