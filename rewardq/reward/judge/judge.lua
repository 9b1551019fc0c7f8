-- judge: the answer cache and request claim of one LLM-judge request (cache.py sends it).
-- Standalone: not prefixed with common.lua. Budget: O(1) per call on one hash, plus, for the shared
-- cache (KEYS[2] given), O(log n) on its index and at most EVICT_MAX answers dropped per `put`.
-- One request = one hash KEYS[1] (<ns>:judge:<sha256 of the request body>):
--   a    the server's answer (JSON text), once some worker got it
--   c    the holder of the claim to send the request, while it is being sent
--   cu   the server time (seconds) the claim's lease ends
-- ARGV[1] is the operation:
--   get     ARGV[2]=holder  ARGV[3]=lease seconds
--           -> {'hit', answer} | {'claimed'} (the caller sends the request) | {'wait', seconds}
--   renew   ARGV[2]=holder  ARGV[3]=lease seconds  -> {1} renewed, {0} the claim was lost
--   put     ARGV[2]=holder  ARGV[3]=answer  ARGV[4]=ttl ms (0: keep for ever)  -> {1}
--   release ARGV[2]=holder  -> {1} released, {0} was not held
-- The shared cache across runs (rewardq/queue/judge_shared.py) gives KEYS[2], its model's index
-- (ZSET of answer keys by last use, all in KEYS[1]'s slot): a hit refreshes the answer's place in
-- it; a `put` adds it, with ARGV[5]=max entries: past it the least recently used answers are
-- deleted, at most EVICT_MAX per call.
if redis.replicate_commands then pcall(redis.replicate_commands) end  -- TIME before writes on Redis < 5
local key, op, holder, index = KEYS[1], ARGV[1], ARGV[2], KEYS[2]
local EVICT_MAX = 100
-- seconds the hash outlives a claim's lease when no answer came (it then holds nothing useful)
local KEEP_EXTRA = 60
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function num(x) return string.format('%.17g', x) end

local function claim(lease)
  redis.call('HSET', key, 'c', holder, 'cu', num(now + lease))
  -- no answer yet: the hash lives a little longer than the lease (-1, no expiry, is less too)
  local want = math.ceil((lease + KEEP_EXTRA) * 1000)
  if redis.call('PTTL', key) < want then redis.call('PEXPIRE', key, want) end
end

if op == 'get' then
  local v = redis.call('HMGET', key, 'a', 'c', 'cu')
  if v[1] then
    if index then redis.call('ZADD', index, 'XX', now, key) end
    return {'hit', v[1]}
  end
  local until_ = tonumber(v[3])
  if v[2] and v[2] ~= holder and until_ ~= nil and until_ > now then
    return {'wait', num(until_ - now)}
  end
  claim(tonumber(ARGV[3]))
  return {'claimed'}
end

if op == 'renew' then
  if redis.call('HGET', key, 'c') ~= holder then return {0} end
  claim(tonumber(ARGV[3]))
  return {1}
end

if op == 'put' then
  redis.call('HSET', key, 'a', ARGV[3])
  redis.call('HDEL', key, 'c', 'cu')
  local ttl = tonumber(ARGV[4])
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) else redis.call('PERSIST', key) end
  if index then
    redis.call('ZADD', index, now, key)
    if ttl > 0 then
      redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. num(now - ttl / 1000))  -- their answers expired
      redis.call('PEXPIRE', index, ttl)
    end
    local over = redis.call('ZCARD', index) - tonumber(ARGV[5])
    if over > 0 then
      local old = redis.call('ZPOPMIN', index, math.min(over, EVICT_MAX))
      for i = 1, #old, 2 do redis.call('DEL', old[i]) end
    end
  end
  return {1}
end

if op == 'release' then
  if redis.call('HGET', key, 'c') ~= holder then return {0} end
  redis.call('HDEL', key, 'c', 'cu')
  return {1}
end

return redis.error_reply('rewardq judge: unknown operation ' .. tostring(op))
