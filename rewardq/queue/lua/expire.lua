-- expire: end trajectories that waited too long for outputs, naming what is missing.
-- KEYS: waiting, stream, done, dead, kept (where this call's reply is kept: see below)
-- ARGV: group, traj_prefix, reward_prefix, result_ttl, worker, limit, timeout_seconds,
--       done_maxlen, dead_maxlen, max_outputs, records_prefix, keep_records, dead_bytes, dead_ttl_ms,
--       records_bytes, nonce (the caller's, new for each call: '' for none)
-- Returns {tid, reason, keys, records, latency, wrote, tid, ...} for the trajectories it ended: `keys` =
-- the highest index + 1 (keys 0 .. keys-1 answered), `wrote` = the indexes of those keys that got
-- the error result (as text: a key that had a result keeps it), `records` = the stored record of
-- each of those keys (nil where it never arrived) when records_bytes > 0 (the worker keeps a
-- ledger: rewardq.ledger), else empty; `latency` = the error results' latency_ms: from the
-- trajectory's last output filed (its waiting clock's start) to now.
-- Budget: at most `limit` trajectories, and it stops taking more once max_outputs keys were
-- written in this call: at most 2 * max_outputs keys written (the rest wait for the next pass), each
-- with a reason of at most ~400 bytes (missing_text counts what it does not spell out); each
-- trajectory's stored records ended (`end_records`). With records_bytes > 0, the records returned
-- stay within records_bytes, except that the first trajectory's always are (at most
-- max_trajectory_bytes, which the store script enforces): past it, the rest wait for the next pass.
-- A reply that ended something is kept for REPLY_KEEP_MS in `kept` (`<waiting>:expired:<worker>`,
-- with its nonce and, when asked for, its records again: at most records_bytes, or the first
-- trajectory's): the same call sent again after its reply was lost (rewardq.queue.retry) gets the
-- same reply back and writes nothing (a second run would find those trajectories ended and return
-- nothing for them). One key per worker, overwritten by its next call, deleted by one that ends
-- nothing: a worker's passes run one at a time, so only its last call can be sent again, and the
-- memory kept is at most one reply per worker.
local waiting, stream, done, dead, kept_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, tprefix, rprefix = ARGV[1], ARGV[2], ARGV[3]
local ttl, worker, limit, timeout = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6]), ARGV[7]
local maxlen, dead_maxlen, max_out = ARGV[8], ARGV[9], tonumber(ARGV[10])
local rec_prefix, keep = ARGV[11], tonumber(ARGV[12])
local dead_bytes, dead_ttl = tonumber(ARGV[13]), tonumber(ARGV[14])
local records_bytes = tonumber(ARGV[15] or '0')
local nonce = ARGV[16] or ''
-- Longer than a resend can follow its first try (rewardq.queue.retry.DEADLINE, 20 s).
local REPLY_KEEP_MS = 60000

-- The kept reply (see above) as the script returns it: at most `limit` trajectories of at most
-- max_out records each, both bounds the caller's.
local function kept_expired()
  local n = tonumber(redis.call('HGET', kept_key, 'n') or '0') or 0
  local out = {}
  for j = 1, math.min(n, limit) do
    local p = j .. ':'
    local f = redis.call('HMGET', kept_key, p .. 'tid', p .. 'reason', p .. 'keys', p .. 'latency', p .. 'wrote', p .. 'records')
    local records = {}
    local m = math.min(tonumber(f[6] or '0') or 0, max_out)
    if m > 0 then
      local names = {}
      for i = 1, m do names[i] = p .. 'r:' .. i end
      local got = hmget_all(kept_key, names)
      for i = 1, m do records[i] = got[i] end
    end
    out[#out + 1] = f[1]
    out[#out + 1] = f[2]
    out[#out + 1] = tonumber(f[3])
    out[#out + 1] = records
    out[#out + 1] = f[4]
    out[#out + 1] = cjson.decode(f[5])
  end
  return out
end

-- Keep the reply `out` (six values per trajectory) under kept_key.
local function keep_expired(out)
  local fields = {'nonce', nonce, 'n', #out / 6}
  for j = 1, #out / 6 do
    local p, o = j .. ':', (j - 1) * 6
    local wrote = out[o + 6]
    fields[#fields + 1] = p .. 'tid'; fields[#fields + 1] = out[o + 1]
    fields[#fields + 1] = p .. 'reason'; fields[#fields + 1] = out[o + 2]
    fields[#fields + 1] = p .. 'keys'; fields[#fields + 1] = out[o + 3]
    fields[#fields + 1] = p .. 'latency'; fields[#fields + 1] = out[o + 5]
    fields[#fields + 1] = p .. 'wrote'; fields[#fields + 1] = #wrote > 0 and cjson.encode(wrote) or '[]'
    local records = out[o + 4]
    fields[#fields + 1] = p .. 'records'; fields[#fields + 1] = #records
    for i = 1, #records do
      if records[i] then
        fields[#fields + 1] = p .. 'r:' .. i
        fields[#fields + 1] = records[i]
      end
    end
  end
  redis.call('DEL', kept_key)
  each_chunk(#fields, function(a, b) redis.call('HSET', kept_key, unpack(fields, a, b)) end)
  redis.call('PEXPIRE', kept_key, REPLY_KEEP_MS)
end

if nonce ~= '' and redis.call('HGET', kept_key, 'nonce') == nonce then return kept_expired() end
local returned = 0
local now = now_seconds()
local out = {}
local written = 0
local due = redis.call('ZRANGEBYSCORE', waiting, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
for d = 1, #due, 2 do
  local tid = due[d]
  if written >= max_out then break end
  local traj = tprefix .. tid
  local state = redis.call('HGET', traj, 'state')
  if state == 'collecting' then
    local hi = math.min(highest_index(traj, max_out), max_out - 1)
    local records = {}
    if records_bytes > 0 then
      local size = tonumber(redis.call('HGET', traj, 'bytes') or '0')
      if returned > 0 and returned + size > records_bytes then break end
      returned = returned + size
      if hi >= 0 then
        local fields = {}
        for i = 0, hi do fields[#fields + 1] = 'o:' .. i end
        records = hmget_all(traj, fields)
      end
    end
    local reason = 'incomplete trajectory: ' .. missing_text(traj, max_out) .. ' after waiting ' .. timeout .. 's'
    local latency = latency_text(tonumber(due[d + 1]) - (tonumber(timeout) or 0), now)
    local wrote = finish_error(traj, stream, waiting, done, rec_prefix .. tid, group, tid, rprefix, ttl,
                               error_result(reason, 'input', '', '', '', latency), worker, -1, '',
                               maxlen, now, max_out, keep)
    written = written + 1 + #wrote
    add_dead(dead, {'tid', tid, 'reason', reason, 'kind', 'incomplete', 'failure_kind', 'input',
                    'worker', worker, 'time', string.format('%.6f', now)}, tonumber(dead_maxlen), dead_bytes, dead_ttl)
    out[#out + 1] = tid
    out[#out + 1] = reason
    out[#out + 1] = hi + 1
    out[#out + 1] = records
    out[#out + 1] = latency
    out[#out + 1] = wrote
  else
    redis.call('ZREM', waiting, tid)
  end
end
if nonce ~= '' then
  if #out > 0 then keep_expired(out) else redis.call('DEL', kept_key) end
end
return out
