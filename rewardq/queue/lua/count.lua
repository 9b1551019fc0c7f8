-- count: add to one counter of a trajectory's hash (`solo`, `cohort` or `shared`: its starts in a
-- scorer, rewardq/consumers/quarantine.py) and return the new count; with a width, record it too
-- (`width`: the size of the cohort this start is in).
-- KEYS: traj   ARGV: field, by[, width]
-- Budget: O(1). Flags: allow-oom (rewardq/queue/scripts.py): one small counter, refused past
-- maxmemory it would end the attempt unanswered and spend a delivery of a legal result.
if ARGV[3] then redis.call('HSET', KEYS[1], 'width', ARGV[3]) end
return redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
