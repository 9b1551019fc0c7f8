-- ratelimit: fleet-wide token buckets and concurrency slots (state.py sends it; limiter.py decides).
-- Standalone: not prefixed with common.lua. Its one loop runs over the slot holders of one
-- limiter (at most the fleet's concurrent callers), never over anything a record controls.
-- Budget: O(slot holders of one limiter) per call; one hash.
-- One limiter = one hash KEYS[1]. ARGV[1] is the operation:
--   take    ARGV[2]=bucket name  ARGV[3]=limit per minute  ARGV[4]=cost  ARGV[5]=1 to only look,
--           2 to charge the cost whatever the level (a cost known only afterwards: a judge's usage;
--           negative: tokens given back, never past a full bucket), 3 to hand back -cost tokens a
--           call reserved and did not use: credited whole, up to HAND_BACK_SECONDS of the rate
--           (the level may pass the capacity by them; the refill never does)
--           ARGV[6]=deepest debt, in seconds of the rate (the level never goes below it, read or
--           written, so no charge holds the fleet back longer and the key's TTL stays bounded)
--           (the bucket holds one second of the limit, limit/60, and refills at limit/60 per second)
--           -> {wait_seconds, level_after}; wait 0 means the cost was taken
--   slot    ARGV[2]=holder  ARGV[3]=max_concurrent  ARGV[4]=lease seconds
--           -> {wait_seconds, live_slots}; wait 0 means the slot is held
--   renew   ARGV[2]=holder  ARGV[3]=lease seconds  -> {1} renewed, {0} the slot was lost
--   release ARGV[2]=holder                         -> {1} released, {0} was not held
if redis.replicate_commands then pcall(redis.replicate_commands) end  -- TIME before writes on Redis < 5
local key = KEYS[1]
-- seconds a bucket key outlives the moment it would be full again (and a slot its lease)
local KEEP_EXTRA = 60
-- highest level a hand-back lifts a bucket to, in seconds of its rate (limiter.py HAND_BACK_SECONDS)
local HAND_BACK_SECONDS = 2
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local op = ARGV[1]
local function num(x) return string.format('%.17g', x) end

-- an expiry this much longer than needed is cut back (a key left by an older version, whose debt
-- and TTL had no bound); a slot lease longer than an hour is the one thing it could shorten
local KEEP_SLACK_MS = 3600000
local function keep(seconds)
  local want = math.ceil(seconds * 1000)
  local pttl = redis.call('PTTL', key)
  if pttl < want or pttl > want + KEEP_SLACK_MS then redis.call('PEXPIRE', key, want) end
end

if op == 'take' then
  local name, cost = ARGV[2], tonumber(ARGV[4])
  local look, charge, hand_back = ARGV[5] == '1', ARGV[5] == '2' or ARGV[5] == '3', ARGV[5] == '3'
  local rate = tonumber(ARGV[3]) / 60.0
  local cap = rate  -- one second of the rate, as verl's buckets
  local floor = -(tonumber(ARGV[6]) or 60) * rate
  local tf, sf = 'b:' .. name .. ':tokens', 'b:' .. name .. ':ts'
  local v = redis.call('HMGET', key, tf, sf)
  local level, ts = tonumber(v[1]), tonumber(v[2])
  -- a missing, unreadable or non-finite stored level (x ~= x: NaN) is a new, full bucket
  if level == nil or ts == nil or level ~= level or ts ~= ts then level, ts = cap, now end
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end  -- a failover to a server whose clock is behind
  level = math.min(HAND_BACK_SECONDS * cap, math.max(floor, level))
  if level < cap then level = math.min(cap, level + elapsed * rate) end  -- only a hand-back passes full
  local need = math.min(cost, cap)
  local wait = 0
  if charge or level + 1e-9 * cap >= need then
    if look then return {'0', num(level)} end
    if cost >= 0 then
      level = math.max(floor, level - cost)
    else  -- a negative charge gives back: up to full, or whole up to HAND_BACK_SECONDS when handed back
      local ceiling = hand_back and HAND_BACK_SECONDS * cap or cap
      level = math.max(level, math.min(ceiling, level - cost))
    end
  else
    wait = (need - level) / rate
    if look then return {num(wait), num(level)} end
  end
  redis.call('HSET', key, tf, num(level), sf, num(now))
  keep(math.max(0, cap - level) / rate + KEEP_EXTRA)
  return {num(wait), num(level)}
end

if op == 'slot' or op == 'renew' or op == 'release' then
  local field = 's:' .. ARGV[2]
  if op == 'release' then return {redis.call('HDEL', key, field)} end
  if op == 'renew' then
    -- the field still exists only if nobody reaped it, so nobody was given its place
    if redis.call('HEXISTS', key, field) == 0 then return {0} end
    local lease = tonumber(ARGV[3])
    redis.call('HSET', key, field, num(now + lease))
    keep(lease + KEEP_EXTRA)
    return {1}
  end
  local max, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
  local all = redis.call('HGETALL', key)
  local live, earliest, mine = 0, nil, false
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 's:' then
      local exp = tonumber(all[i + 1])
      if exp == nil or exp <= now then
        redis.call('HDEL', key, f)
      elseif f == field then
        mine = true
      else
        live = live + 1
        if earliest == nil or exp < earliest then earliest = exp end
      end
    end
  end
  if mine or live < max then
    redis.call('HSET', key, field, num(now + lease))
    keep(lease + KEEP_EXTRA)
    return {'0', num(live + 1)}
  end
  return {num(earliest - now), num(live)}
end

return redis.error_reply('rewardq ratelimit: unknown operation ' .. tostring(op))
