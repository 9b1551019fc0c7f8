-- budget: the verl failure budget of one run (rewardq/queue/failure_budget.py).
-- Standalone: not prefixed with common.lua. Its loops run over ARGV's labels, a fixed list the
-- caller's code spells (ok and the failure kinds, at most 32), and over the outcomes of one call
-- (at most 256, the caller's own: one per trajectory it scored), never over anything a record controls.
-- Budget: O(labels * outcomes) per call; one hash.
-- KEYS[1]  the run's hash:
--   seq        trajectories recorded in this run
--   w          the window they were recorded with (another window starts the hash anew)
--   o:<slot>   the outcome at ring slot (seq - 1) % w: the last w outcomes, oldest overwritten
--   c:<label>  how many of the last w outcomes are <label>
--   t:<label>  how many outcomes of the run were <label> (the trainer's step metrics read them)
-- ARGV[1] the window (1..100000), ARGV[2] seconds the hash outlives the run's last outcome,
-- ARGV[3] L, the number of labels, ARGV[4..3+L] the labels to count, ARGV[4+L..] the outcomes (each
-- one of the labels), recorded in this order.
-- -> for each outcome, in order: filled = min(seq, w) and the count of each label just after it
--    (what a call with that outcome alone would have returned).
local key = KEYS[1]
local window, ttl, nl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if window == nil or window < 1 or window > 100000 or window % 1 ~= 0 then
  return redis.error_reply('ERR budget window must be a whole number in 1..100000')
end
local outcomes = nl and (#ARGV - 3 - nl) or 0
if nl == nil or nl < 1 or nl > 32 or outcomes < 1 or outcomes > 256 then
  return redis.error_reply('ERR budget takes 1..32 labels and 1..256 outcomes')
end
local was = redis.call('HGET', key, 'w')
if was and tonumber(was) ~= window then redis.call('DEL', key) end
local out = {}
for j = 4 + nl, #ARGV do
  local outcome = ARGV[j]
  local seq = redis.call('HINCRBY', key, 'seq', 1)
  local slot = 'o:' .. ((seq - 1) % window)
  local old = redis.call('HGET', key, slot)
  if old then redis.call('HINCRBY', key, 'c:' .. old, -1) end
  redis.call('HSET', key, 'w', window, slot, outcome)
  redis.call('HINCRBY', key, 'c:' .. outcome, 1)
  redis.call('HINCRBY', key, 't:' .. outcome, 1)
  out[#out + 1] = math.min(seq, window)
  for i = 4, 3 + nl do
    out[#out + 1] = tonumber(redis.call('HGET', key, 'c:' .. ARGV[i]) or '0')
  end
end
redis.call('EXPIRE', key, ttl)
return out
