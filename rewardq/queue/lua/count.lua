-- count: add to one counter of a trajectory's hash (`solo`, `cohort` or `shared`: its starts in a
-- scorer, rewardq/consumers/quarantine.py) and return the new count; with a width, record it too
-- (`width`: the size of the cohort this start is in).
-- With an attempt (the counting worker's name and the trajectory's attempt number) the call is
-- idempotent: the retry policy (rewardq/queue/retry.py) sends a script again after a connection
-- error, also when the lost attempt ran and only its reply was lost, and a start counted twice
-- would blame a worker's death the trajectory never caused (after `max_crashes`, an error result).
-- So a start marks its counter with the attempt (`<field>_attempt`) and is not counted again while
-- it is marked; a take-back (`by` < 0) counts only when the mark is its own, and clears it.
-- KEYS: traj   ARGV: field, by, attempt ('': count unconditionally), width ('': none)
-- Budget: O(1). Flags: allow-oom (rewardq/queue/scripts.py): one small counter, refused past
-- maxmemory it would end the attempt unanswered and spend a delivery of a legal result.
local traj, field, by = KEYS[1], ARGV[1], tonumber(ARGV[2])
local attempt, width = ARGV[3] or '', ARGV[4] or ''
if width ~= '' then redis.call('HSET', traj, 'width', width) end
if attempt ~= '' then
  local mark = field .. '_attempt'
  local own = redis.call('HGET', traj, mark) == attempt
  if (by > 0 and own) or (by < 0 and not own) then  -- counted already, or taken back already
    return tonumber(redis.call('HGET', traj, field) or '0')
  end
  if by > 0 then redis.call('HSET', traj, mark, attempt) else redis.call('HDEL', traj, mark) end
end
return redis.call('HINCRBY', traj, field, by)
