//! The Lua scripts of the Redis provider. Every script touches only keys of one queue, all
//! sharing the queue's `{hash tag}`, so they run on one Redis Cluster slot.

/// The minimal direct-producer script of the topology (documented for producers that do
/// not go through Wharf): one ready envelope and one readiness record, atomically.
/// KEYS: ready, readiness. ARGV: priority, envelope, queue name.
pub const DIRECT_PRODUCER: &str = "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) redis.call('XADD', KEYS[2], '*', 'queue', ARGV[3]) return 1";

/// Enqueue a batch. KEYS: ready, readiness, delayed, ids, id hashes.
/// ARGV: queue name, idempotent ('1'/'0'), then per message: score (priority, or due Unix
/// seconds when delayed), envelope, message id ('' for none), delayed ('1'/'0'), canonical
/// hash of its MessageJson ('' without an id).
/// A message id replaces the pending envelope with that id; in an idempotent queue one whose
/// MessageJson equals the pending (or leased) one's as JSON values is discarded: the hashes
/// kept beside the ids compare, or the envelope bytes for an id stored without a hash. An
/// envelope byte for byte equal to one already in its sorted set is kept once (set
/// semantics): `discarded`, or `updated` when only its due time changed. One readiness record
/// is appended when at least one ready message was added or updated. Returns one status per
/// message.
pub const ENQUEUE: &str = r#"
local out = {}
local ready_added = false
local n = (#ARGV - 2) / 5
for i = 0, n - 1 do
  local base = 3 + i * 5
  local score = ARGV[base]
  local envelope = ARGV[base + 1]
  local id = ARGV[base + 2]
  local delayed = ARGV[base + 3] == '1'
  local hash = ARGV[base + 4]
  local status = 'added'
  if id ~= '' then
    local old = redis.call('HGET', KEYS[4], id)
    if old then
      local old_hash = redis.call('HGET', KEYS[5], id)
      local same
      if old_hash then same = old_hash == hash else same = old == envelope end
      if ARGV[2] == '1' and same then
        status = 'discarded'
      else
        redis.call('ZREM', KEYS[1], old)
        redis.call('ZREM', KEYS[3], old)
        status = 'updated'
      end
    end
    if status ~= 'discarded' then
      redis.call('HSET', KEYS[4], id, envelope)
    end
    redis.call('HSET', KEYS[5], id, hash)
  end
  if status ~= 'discarded' then
    local set = KEYS[1]
    if delayed then set = KEYS[3] end
    if redis.call('ZADD', set, 'NX', score, envelope) == 0 and status == 'added' then
      if redis.call('ZADD', set, 'XX', 'CH', score, envelope) == 1 then
        status = 'updated'
      else
        status = 'discarded'
      end
    end
    if status ~= 'discarded' and not delayed then
      ready_added = true
    end
  end
  out[#out + 1] = status
end
if ready_added then
  redis.call('XADD', KEYS[2], '*', 'queue', ARGV[1])
end
return out
"#;

/// Lease. KEYS: ready, lease deadlines (token → deadline ms), leased (token →
/// "score|envelope"), attempts (envelope → deliveries), token counter.
/// ARGV: max, deadline ms. Returns token, envelope, attempt triples, highest priority first.
pub const LEASE: &str = r#"
local popped = redis.call('ZPOPMAX', KEYS[1], ARGV[1])
local out = {}
local n = #popped / 2
if n == 0 then return out end
local last = redis.call('INCRBY', KEYS[5], n)
for i = 1, n do
  local envelope = popped[2 * i - 1]
  local token = tostring(last - n + i)
  redis.call('ZADD', KEYS[2], ARGV[2], token)
  redis.call('HSET', KEYS[3], token, popped[2 * i] .. '|' .. envelope)
  local attempt = redis.call('HINCRBY', KEYS[4], envelope, 1)
  out[#out + 1] = token
  out[#out + 1] = envelope
  out[#out + 1] = attempt
end
return out
"#;

/// Settle (remove for good). KEYS: lease deadlines, leased, attempts, ids, id hashes.
/// ARGV: pairs of token, message id ('' for none). Returns 1/0 per token: whether the lease
/// was still held.
pub const SETTLE: &str = r#"
local out = {}
for i = 1, #ARGV, 2 do
  local token = ARGV[i]
  local id = ARGV[i + 1]
  local value = redis.call('HGET', KEYS[2], token)
  if value then
    redis.call('HDEL', KEYS[2], token)
    redis.call('ZREM', KEYS[1], token)
    local envelope = string.sub(value, string.find(value, '|', 1, true) + 1)
    redis.call('HDEL', KEYS[3], envelope)
    if id ~= '' and redis.call('HGET', KEYS[4], id) == envelope then
      redis.call('HDEL', KEYS[4], id)
      redis.call('HDEL', KEYS[5], id)
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"#;

/// Return expired leases to the ready set with their priority. KEYS: ready, lease
/// deadlines, leased, readiness. ARGV: now ms, max, queue name. One readiness record when
/// anything returned. Returns how many.
pub const RETURN_EXPIRED: &str = r#"
local tokens = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, token in ipairs(tokens) do
  local value = redis.call('HGET', KEYS[3], token)
  redis.call('ZREM', KEYS[2], token)
  redis.call('HDEL', KEYS[3], token)
  if value then
    local sep = string.find(value, '|', 1, true)
    redis.call('ZADD', KEYS[1], string.sub(value, 1, sep - 1), string.sub(value, sep + 1))
  end
end
if #tokens > 0 then
  redis.call('XADD', KEYS[4], '*', 'queue', ARGV[3])
end
return #tokens
"#;

/// Promote due delayed envelopes to the ready set (score = the envelope's Priority, 0 when
/// it cannot be read) and append one readiness record, atomically. KEYS: delayed, ready,
/// readiness. ARGV: now (Unix seconds), queue name, max. Returns how many.
pub const PROMOTE_DUE: &str = r#"
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, envelope in ipairs(due) do
  local priority = 0
  local ok, decoded = pcall(cjson.decode, envelope)
  if ok and type(decoded) == 'table' and type(decoded['Priority']) == 'number' then
    priority = decoded['Priority']
  end
  redis.call('ZREM', KEYS[1], envelope)
  redis.call('ZADD', KEYS[2], priority, envelope)
end
if #due > 0 then
  redis.call('XADD', KEYS[3], '*', 'queue', ARGV[2])
end
return #due
"#;

/// Hand leases back: to the ready set with their priority. KEYS: ready, lease deadlines,
/// leased, attempts, readiness. ARGV: queue name, counted ('1': the delivery counts as an
/// attempt, '0': it does not), then tokens. One readiness record when anything returned.
/// Returns how many.
pub const RELEASE: &str = r#"
local n = 0
for i = 3, #ARGV do
  local value = redis.call('HGET', KEYS[3], ARGV[i])
  if value then
    redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
    local sep = string.find(value, '|', 1, true)
    local envelope = string.sub(value, sep + 1)
    redis.call('ZADD', KEYS[1], string.sub(value, 1, sep - 1), envelope)
    if ARGV[2] ~= '1' and redis.call('HINCRBY', KEYS[4], envelope, -1) <= 0 then
      redis.call('HDEL', KEYS[4], envelope)
    end
    n = n + 1
  end
end
if n > 0 then
  redis.call('XADD', KEYS[5], '*', 'queue', ARGV[1])
end
return n
"#;
