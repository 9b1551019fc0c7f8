-- budget: the verl failure budget of one run (rewardq/queue/failure_budget.py).
-- Standalone: not prefixed with common.lua. Its one loop runs over ARGV's labels, a fixed list
-- the caller's code spells (ok and the failure kinds), never over anything a record controls.
-- Budget: O(labels) per call; one hash.
-- KEYS[1]  the run's hash:
--   seq        trajectories recorded in this run
--   w          the window they were recorded with (another window starts the hash anew)
--   o:<slot>   the outcome at ring slot (seq - 1) % w: the last w outcomes, oldest overwritten
--   c:<label>  how many of the last w outcomes are <label>
--   t:<label>  how many outcomes of the run were <label> (the trainer's step metrics read them)
-- ARGV[1] the outcome (one of the labels), ARGV[2] the window (1..100000), ARGV[3] seconds the hash
-- outlives the run's last outcome, ARGV[4..] the labels to count.
-- -> {filled, count of ARGV[4], count of ARGV[5], ...}: filled = min(seq, w).
local key = KEYS[1]
local outcome, window, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if window == nil or window < 1 or window > 100000 or window % 1 ~= 0 then
  return redis.error_reply('ERR budget window must be a whole number in 1..100000')
end
local was = redis.call('HGET', key, 'w')
if was and tonumber(was) ~= window then redis.call('DEL', key) end
local seq = redis.call('HINCRBY', key, 'seq', 1)
local slot = 'o:' .. ((seq - 1) % window)
local old = redis.call('HGET', key, slot)
if old then redis.call('HINCRBY', key, 'c:' .. old, -1) end
redis.call('HSET', key, 'w', window, slot, outcome)
redis.call('HINCRBY', key, 'c:' .. outcome, 1)
redis.call('HINCRBY', key, 't:' .. outcome, 1)
redis.call('EXPIRE', key, ttl)
local out = {math.min(seq, window)}
for i = 4, #ARGV do
  out[#out + 1] = tonumber(redis.call('HGET', key, 'c:' .. ARGV[i]) or '0')
end
return out
