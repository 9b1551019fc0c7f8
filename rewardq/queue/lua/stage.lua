-- stage: the lease that lets one chunked commit at a time stage results in a Redis (commit.lua).
-- A chunked commit's staged chunks hold their memory until its last chunk; two of them staging
-- together can fill maxmemory with halves that can never finish. So a worker takes this lease
-- before it stages its first chunk, says how many keys it has staged (or is about to) while it
-- stages, and gives it back after its last chunk. A lease not renewed for lease_ms is stale: its
-- holder died or stalled. The next taker deletes the stale holder's staged keys (their prefix and
-- count are in the lease) so they do not hold the room it needs, and takes over.
-- KEYS: lease   ARGV: op ('take' | 'renew' | 'release'), token, lease_ms, prefix, staged, max_outputs,
--                     stage_ttl
-- Returns {1, deleted} when the caller holds (take, renew) or no longer holds (release) the lease;
-- {0, holder token} when another holder has it (take), or the caller lost it (renew, release).
-- Budget: one hash of four small fields; a take deletes at most max_outputs staged keys. Flags:
-- allow-oom (rewardq/queue/scripts.py): the lease is what lets staged memory drain.
local lease, op, token = KEYS[1], ARGV[1], ARGV[2]
local ms, prefix, staged = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5]) or 0
local max_out, stage_ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local now = now_seconds() * 1000
local held = redis.call('HMGET', lease, 'token', 'until', 'prefix', 'staged')
local mine = held[1] == token
if op == 'take' then
  if held[1] and not mine and (tonumber(held[2]) or 0) > now then return {0, held[1]} end
  local deleted = 0
  if held[1] and not mine and held[3] and held[3] ~= '' then
    for i = 0, math.min(tonumber(held[4]) or 0, max_out) - 1 do
      deleted = deleted + redis.call('DEL', held[3] .. i)
    end
  end
  redis.call('HSET', lease, 'token', token, 'until', string.format('%.0f', now + ms), 'prefix', prefix,
             'staged', math.min(staged, max_out))
  redis.call('EXPIRE', lease, stage_ttl)
  return {1, deleted}
end
if not mine then return {0, held[1] or ''} end
if op == 'renew' then
  redis.call('HSET', lease, 'until', string.format('%.0f', now + ms), 'staged', math.min(staged, max_out))
  redis.call('EXPIRE', lease, stage_ttl)
  return {1, 0}
end
redis.call('DEL', lease)
return {1, 0}
